#!/usr/bin/env python3
"""The coltrain torch.distributed backend (python/coltrain_torch) across real processes.

    test_backend.py collectives NP   every collective, dtype and op against exact references
    test_backend.py ddp NP           DistributedDataParallel: coltrain's losses against gloo's
    test_backend.py failures         a dead peer, a mismatched call, a wrong secret, refused ops
    test_backend.py huge_pages       COLTRAIN_TORCH_HUGE_PAGES=1: large CPU tensors 2 MiB-aligned
    test_backend.py reused_on_huge_pages
                                     a large tensor reduced again is moved onto huge pages where it
                                     lies, one reduced once is not, and the sums stay exact
    test_backend.py torchrun         benchmarks/reference/torch_ddp_mnist.py under torchrun, one
                                     epoch of MNIST: the same losses over coltrain as over gloo

Each case launches NP processes of this script (--worker) that meet through a FileStore
(init_method file://, so no port can be taken from under them) and talk on loopback. A worker
reports a failure by raising; the parent prints every rank's output and fails.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WORKER_TIMEOUT_S = 120


def launch(case, world, extra_env=None, per_rank_env=None, args=()):
    """Runs `world` workers of `case`; returns [(returncode, stdout, stderr)] by rank."""
    with tempfile.TemporaryDirectory(prefix="coltrain_torch_") as tmp:
        procs = []
        for rank in range(world):
            env = dict(os.environ)
            env.update({"MASTER_ADDR": "127.0.0.1", "COLTRAIN_TIMEOUT": "60"})
            env.update(extra_env or {})
            env.update((per_rank_env or {}).get(rank, {}))
            cmd = [sys.executable, __file__, "--worker", case, "--rank", str(rank),
                   "--world", str(world), "--store", os.path.join(tmp, "store"),
                   "--out", os.path.join(tmp, f"out{rank}.json"), *args]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        results = []
        for rank, proc in enumerate(procs):
            try:
                out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                out, err = proc.communicate()
                err += f"\n(rank {rank} killed after {WORKER_TIMEOUT_S} s)"
            path = os.path.join(tmp, f"out{rank}.json")
            data = json.load(open(path)) if os.path.exists(path) else None
            results.append((proc.returncode, out, err, data))
        return results


def require_all_passed(results, what):
    bad = [(r, res) for r, res in enumerate(results) if res[0] != 0]
    for rank, (code, out, err, _) in enumerate(results):
        if code != 0:
            print(f"--- rank {rank} exited {code}\n{out}\n{err}", file=sys.stderr)
    if bad:
        raise SystemExit(f"FAILED: {what}")


# ---------------------------------------------------------------- worker side

def init(args, backend="coltrain"):
    import torch.distributed as dist
    if backend == "coltrain":
        import coltrain_torch  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, init_method=f"file://{args.store}.{backend}",
                            rank=args.rank, world_size=args.world)
    return dist


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def expect_equal(got, want, what):
    import torch
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} "
                             f"{tuple(want.shape)}")
    if not torch.equal(got, want):
        wrong = (got != want).nonzero()
        first = tuple(wrong[0].tolist())
        raise AssertionError(f"{what}: {len(wrong)} of {want.numel()} elements differ; the first, "
                             f"at {first}, is {got[first].item()!r}, not {want[first].item()!r}")


def worker_collectives(args):
    import torch
    dist = init(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = torch.arange(world)
    movable = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
               torch.int64, torch.uint8, torch.int8, torch.int16, torch.bool]
    reducible = movable[:6]

    def values(r, n, dtype):
        # Small integers distinct per rank and element: exact in every dtype, so any lost,
        # doubled or misplaced element changes the result.
        v = (torch.arange(n) * 3 + r * 7) % 11 + (1 if dtype != torch.bool else 0)
        return (v % 2).to(dtype) if dtype == torch.bool else v.to(dtype)

    for dtype in reducible:
        n = 1000 + 3  # not a multiple of the world size or of 4
        everyone = torch.stack([values(r, n, torch.float64) for r in range(world)])
        for op, want in [(dist.ReduceOp.SUM, everyone.sum(0)), (dist.ReduceOp.MAX, everyone.max(0)[0]),
                         (dist.ReduceOp.MIN, everyone.min(0)[0]),
                         (dist.ReduceOp.PRODUCT, everyone.prod(0))]:
            if op == dist.ReduceOp.PRODUCT and dtype in (torch.float16, torch.bfloat16):
                want = want.clamp(max=200)  # products stay exact in 8 bits of mantissa
                t = values(rank, n, torch.float64).clamp(max=200 ** (1 / world)).floor().to(dtype)
                ev = torch.stack([values(r, n, torch.float64).clamp(max=200 ** (1 / world)).floor()
                                  for r in range(world)])
                want = ev.prod(0)
            else:
                t = values(rank, n, dtype)
            dist.all_reduce(t, op=op)
            expect_equal(t, want.to(dtype), f"all_reduce {op} {dtype}")
        # AVG: sums that divide evenly, so the mean is exact in every dtype.
        t = (values(rank, n, torch.float64) * world).to(dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG) if hasattr(dist.ReduceOp, "AVG") else None
        expect_equal(t, everyone.sum(0).to(dtype), f"all_reduce AVG {dtype}")
        root = world - 1
        t = values(rank, n, dtype)
        dist.reduce(t, dst=root)
        if rank == root:
            expect_equal(t, everyone.sum(0).to(dtype), f"reduce {dtype}")
        out = torch.empty(n, dtype=dtype)
        blocks = [values(r * world + rank, n, dtype) for r in range(world)]
        dist.reduce_scatter(out, blocks)
        want = sum(values(rank * world + r, n, torch.float64) for r in range(world))
        expect_equal(out, want.to(dtype), f"reduce_scatter {dtype}")
        flat_in = torch.cat(blocks)
        out = torch.empty(n, dtype=dtype)
        dist._reduce_scatter_base(out, flat_in)
        expect_equal(out, want.to(dtype), f"reduce_scatter_tensor {dtype}")

    # Complex numbers: SUM and AVG reduce the real and imaginary parts.
    for dtype in (torch.complex64, torch.complex128):
        t = torch.complex(values(rank, 9, torch.float64), -values(rank + 1, 9, torch.float64)).to(dtype)
        dist.all_reduce(t)
        want = torch.complex(sum(values(r, 9, torch.float64) for r in range(world)),
                             -sum(values(r + 1, 9, torch.float64) for r in range(world))).to(dtype)
        expect_equal(t, want, f"all_reduce SUM {dtype}")

    for dtype in movable:
        for n in (1, 5, 1003):  # odd byte counts go through padded words
            root = 1 % world
            t = values(rank, n, dtype) if rank == root else torch.zeros(n, dtype=dtype)
            dist.broadcast(t, src=root)
            expect_equal(t, values(root, n, dtype), f"broadcast {dtype} x{n}")
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, values(rank, n, dtype))
            for r in range(world):
                expect_equal(outs[r], values(r, n, dtype), f"all_gather {dtype} x{n} block {r}")
            flat = torch.empty(world * n, dtype=dtype)
            dist._all_gather_base(flat, values(rank, n, dtype))
            expect_equal(flat, torch.cat([values(r, n, dtype) for r in range(world)]),
                         f"all_gather_into_tensor {dtype} x{n}")
            gathered = [torch.empty(n, dtype=dtype) for _ in range(world)] if rank == 0 else None
            dist.gather(values(rank, n, dtype), gather_list=gathered, dst=0)
            if rank == 0:
                for r in range(world):
                    expect_equal(gathered[r], values(r, n, dtype), f"gather {dtype} x{n} block {r}")
            out = torch.empty(n, dtype=dtype)
            parts = [values(100 + r, n, dtype) for r in range(world)] if rank == root else None
            dist.scatter(out, scatter_list=parts, src=root)
            expect_equal(out, values(100 + rank, n, dtype), f"scatter {dtype} x{n}")
            # A non-contiguous tensor: every other element of a longer one.
            strided = torch.zeros(2 * n, dtype=dtype)[::2]
            if rank == root:
                strided.copy_(values(5, n, dtype))
            dist.broadcast(strided, src=root)
            expect_equal(strided, values(5, n, dtype), f"broadcast of a strided {dtype} x{n}")

    # all_to_all_single with uneven splits: rank r sends r + j + 1 rows of 3 to rank j.
    for dtype in (torch.float32, torch.int64, torch.int32):
        send_splits = [rank + j + 1 for j in range(world)]
        recv_splits = [j + rank + 1 for j in range(world)]
        rows = [torch.full((send_splits[j], 3), 100 * rank + j, dtype=dtype) for j in range(world)]
        out = torch.empty(sum(recv_splits), 3, dtype=dtype)
        dist.all_to_all_single(out, torch.cat(rows), recv_splits, send_splits)
        want = torch.cat([torch.full((recv_splits[j], 3), 100 * j + rank, dtype=dtype)
                          for j in range(world)])
        expect_equal(out, want, f"all_to_all_single uneven {dtype}")
        outs = [torch.empty(recv_splits[j], 3, dtype=dtype) for j in range(world)]
        dist.all_to_all(outs, rows)
        for j in range(world):
            expect_equal(outs[j], torch.full((recv_splits[j], 3), 100 * j + rank, dtype=dtype),
                         f"all_to_all {dtype} from {j}")

    # Point to point around the ring, with tags, and non-blocking.
    right, left = (rank + 1) % world, (rank - 1) % world
    for tag in (0, 7):
        got = torch.empty(17, dtype=torch.float64)
        req = dist.irecv(got, src=left, tag=tag)
        dist.send(values(rank + tag, 17, torch.float64), dst=right, tag=tag)
        req.wait()
        expect_equal(got, values(left + tag, 17, torch.float64), f"send/recv tag {tag}")

    # Asynchronous work and its future, as DDP uses them.
    t = values(rank, 64, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    work.wait()
    expect(work.is_completed() and work.is_success(), "work completed")
    expect_equal(future.value()[0], sum(values(r, 64, torch.float64) for r in range(world)).float(),
                 "the future's value")
    dist.barrier()

    # Subgroups get connections of their own through their own store prefix.
    group = dist.new_group(ranks=list(range(world - 1, -1, -1))[: max(1, world - 1)])
    if rank in range(world)[-(max(1, world - 1)):] or world == 1:
        t = torch.ones(3)
        dist.all_reduce(t, group=group)
        expect_equal(t, torch.full((3,), float(max(1, world - 1))), "allreduce in a subgroup")
    dist.destroy_process_group()
    return {"ok": True}


def make_model_and_data(seed_rank):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 10))
    generator = torch.Generator().manual_seed(1000 + seed_rank)
    data = torch.randn(100, 16, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (100, 16), generator=generator)
    return model, data, labels


def worker_ddp(args):
    import torch
    torch.set_num_threads(1)
    dist = init(args, args.backend)
    model, data, labels = make_model_and_data(args.rank)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(100):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(data[step]), labels[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    weights = [p.detach().double().sum().item() for p in model.parameters()]
    dist.destroy_process_group()
    return {"losses": losses, "weights": weights}


def worker_failures(args):
    import torch
    dist = init(args)
    rank = dist.get_rank()
    result = {}

    def error_of(call):
        try:
            call()
        except RuntimeError as e:
            return str(e)
        return None

    result["band"] = error_of(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                                      op=dist.ReduceOp.BAND))
    result["reduce_uint8"] = error_of(lambda: dist.all_reduce(torch.ones(2, dtype=torch.uint8)))

    dist.barrier()
    # A mismatched call: rank 0 reduces what rank 1 broadcasts.
    if args.mode == "mismatch":
        t = torch.ones(10)
        result["mismatch"] = error_of(
            (lambda: dist.all_reduce(t)) if rank == 0 else (lambda: dist.broadcast(t, src=0)))
    # A peer that dies between two collectives.
    if args.mode == "dead":
        dist.all_reduce(torch.ones(4))
        if rank == args.world - 1:
            os._exit(3)
        result["dead"] = error_of(lambda: dist.all_reduce(torch.ones(1 << 16)))
    return result


def anon_huge_page_bytes():
    """The process's anonymous memory on transparent huge pages (/proc/self/smaps_rollup)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("/proc/self/smaps_rollup has no AnonHugePages line")


def worker_reused_on_huge_pages(args):
    """A tensor of 24 MiB reduced once, then another reduced three times: how much of the
    process's memory went onto huge pages after each, and every sum checked exactly (values that
    differ by position, so that a piece sent from the wrong place or by the wrong path shows)."""
    import torch
    dist = init(args)
    n = 6 << 20  # float32 elements: 24 MiB
    pattern = torch.arange(n, dtype=torch.float32) % 1021
    want = pattern * sum(r + 1 for r in range(args.world))
    result = {"before": anon_huge_page_bytes()}
    once = pattern * (args.rank + 1)
    dist.all_reduce(once)
    expect(torch.equal(once, want), "the tensor reduced once")
    result["after_once"] = anon_huge_page_bytes()
    again = torch.empty(n, dtype=torch.float32)
    for call in range(3):
        torch.mul(pattern, args.rank + 1, out=again)
        dist.all_reduce(again)
        expect(torch.equal(again, want), f"the tensor reduced again, call {call + 1}")
    result["after_again"] = anon_huge_page_bytes()
    dist.destroy_process_group()
    return result


def worker_main(args):
    try:
        result = {"collectives": worker_collectives, "ddp": worker_ddp,
                  "failures": worker_failures,
                  "reused_on_huge_pages": worker_reused_on_huge_pages}[args.worker](args)
    except Exception:
        import traceback
        traceback.print_exc()
        sys.exit(1)
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(args.out + ".tmp", args.out)
    if args.mode == "dead" and args.rank == 0:
        # A survivor leaves its broken group: rank 0 destroys it, rank 1 leaves it to the
        # interpreter's exit. Both once hung or aborted there: the completion thread freed a tensor
        # whose Python object needed the GIL that the destroying thread held, or that the exiting
        # interpreter no longer gave out.
        import torch.distributed as dist
        dist.destroy_process_group()


# ---------------------------------------------------------------- parent side

def case_collectives(world):
    results = launch("collectives", world)
    require_all_passed(results, f"collectives on {world} ranks")
    print(f"collectives on {world} ranks: every collective, dtype and op exact")


def case_ddp(world):
    runs = {}
    for backend in ("gloo", "coltrain"):
        results = launch("ddp", world, args=("--backend", backend))
        require_all_passed(results, f"DDP over {backend} on {world} ranks")
        runs[backend] = [r[3] for r in results]
    worst = 0.0
    for rank in range(world):
        ours, theirs = runs["coltrain"][rank], runs["gloo"][rank]
        for step, (a, b) in enumerate(zip(ours["losses"], theirs["losses"])):
            if world == 2 and a != b:
                raise SystemExit(f"FAILED: rank {rank} step {step}: loss {a!r} over coltrain, "
                                 f"{b!r} over gloo (2 ranks must agree bit for bit)")
            worst = max(worst, abs(a - b) / max(abs(b), 1e-30))
        if ours["losses"][-1] >= ours["losses"][0]:
            raise SystemExit(f"FAILED: rank {rank} did not learn: {ours['losses'][0]} -> "
                             f"{ours['losses'][-1]}")
    if worst > 1e-6:
        raise SystemExit(f"FAILED: largest relative loss difference {worst:.3g} > 1e-6")
    print(f"DDP on {world} ranks, 100 steps: losses over coltrain and gloo "
          f"{'bitwise equal' if worst == 0 else f'within {worst:.3g} relative'}; "
          f"loss {runs['coltrain'][0]['losses'][0]:.4f} -> {runs['coltrain'][0]['losses'][-1]:.4f}")


def case_failures():
    def check(condition, message):
        if not condition:
            raise SystemExit("FAILED: " + message)

    results = launch("failures", 2, args=("--mode", "mismatch"))
    require_all_passed(results, "mismatch")
    for rank, (_, _, _, data) in enumerate(results):
        check(data["band"] and "ReduceOp.BAND" in data["band"], f"BAND refused: {data['band']}")
        check(data["reduce_uint8"] and "cannot reduce Byte" in data["reduce_uint8"],
              f"uint8 reduction refused: {data['reduce_uint8']}")
        message = data["mismatch"] or ""
        check("allreduce" in message and "broadcast" in message and f"rank {rank}" in message,
              f"rank {rank}'s mismatch error names both calls: {message!r}")
    print("refused ops and a mismatched call: RuntimeError naming both sides:",
          results[0][3]["mismatch"].splitlines()[0])

    results = launch("failures", 3, args=("--mode", "dead"), extra_env={"COLTRAIN_TIMEOUT": "20"})
    check(results[2][0] == 3, f"the victim exited {results[2][0]}")
    for rank in (0, 1):
        code, out, err, data = results[rank]
        check(code == 0, f"rank {rank} exited {code}: {err}")
        message = data["dead"] or ""
        check("rank 2" in message, f"rank {rank} names the dead rank 2: {message!r}")
    print("a dead peer:", results[0][3]["dead"].splitlines()[0])

    # Rank 1 proves another secret than rank 0's: it learns why; rank 0 turns it away as it would
    # a stranger, and names the rank that never joined when the timeout ends.
    results = launch("failures", 2, extra_env={"COLTRAIN_TIMEOUT": "5"},
                     per_rank_env={0: {"COLTRAIN_AUTH_TOKEN": "a-secret-of-rank-0-0123456789"},
                                   1: {"COLTRAIN_AUTH_TOKEN": "another-secret-of-rank-1-0123"}})
    errors = []
    for rank, (code, out, err, _) in enumerate(results):
        lines = [line for line in err.splitlines() if line.startswith("RuntimeError")]
        check(code != 0 and lines, f"rank {rank} with a wrong secret raises RuntimeError: {err}")
        errors.append(lines[-1])
    check("rank 1" in errors[0], f"rank 0 names rank 1: {errors[0]}")
    check("secret" in errors[1] and "rank 0" in errors[1], f"rank 1 names the secret: {errors[1]}")
    print("a wrong secret:", *errors, sep="\n  ")


def case_huge_pages():
    """PyTorch's CPU allocations of 2 MiB and more on huge-page-aligned memory with
    COLTRAIN_TORCH_HUGE_PAGES=1 (and only then), smaller ones not."""
    # MnistConvNet's convolutions go through oneDNN, whose scratchpad PyTorch takes with
    # raw_allocate and frees with raw_deallocate (an allocator without a raw deleter fails there).
    probe = ("import torch, coltrain_torch; big = torch.empty(3 << 20, dtype=torch.uint8); "
             "small = [torch.empty(1000) for _ in range(8)]; "
             "x = torch.nn.Conv2d(1, 32, 3)(torch.randn(64, 1, 28, 28)); "
             "torch.nn.Conv2d(32, 64, 3)(x).sum().backward(); "
             "print(big.data_ptr() % (2 << 20), sum(t.data_ptr() % (2 << 20) != 0 for t in small))")
    results = {}
    for value in ("1", "0"):
        env = dict(os.environ, COLTRAIN_TORCH_HUGE_PAGES=value)
        run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                             timeout=WORKER_TIMEOUT_S)
        if run.returncode != 0:
            raise SystemExit(f"FAILED: the probe with COLTRAIN_TORCH_HUGE_PAGES={value}: {run.stderr}")
        results[value] = [int(x) for x in run.stdout.split()]
    if results["1"][0] != 0:
        raise SystemExit(f"FAILED: a 3 MiB tensor is {results['1'][0]} bytes off a 2 MiB boundary")
    if results["1"][1] == 0:
        raise SystemExit("FAILED: small tensors were put on 2 MiB boundaries too")
    if results["0"][0] == 0:
        raise SystemExit("FAILED: without COLTRAIN_TORCH_HUGE_PAGES a 3 MiB tensor sat on a 2 MiB "
                         "boundary, so this check cannot tell the allocator's work from chance")
    results_offset = results["0"][0]
    # Every allocation of the process goes through the allocator then: DDP's (raw_allocate and
    # raw_deallocate among them) must work as before.
    results = launch("ddp", 2, extra_env={"COLTRAIN_TORCH_HUGE_PAGES": "1"},
                     args=("--backend", "coltrain"))
    require_all_passed(results, "DDP with COLTRAIN_TORCH_HUGE_PAGES=1")
    print(f"COLTRAIN_TORCH_HUGE_PAGES=1: a 3 MiB tensor on a 2 MiB boundary (without: "
          f"{results_offset} bytes off), small tensors not; DDP trains")


def kernel_can_collapse():
    """Whether madvise(MADV_COLLAPSE) (Linux 6.1) works here, and the THP policy."""
    import ctypes
    import mmap
    policy = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    # Private, as tensors are (a shared mapping would ask about shared memory's huge pages).
    region = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.write(b"\x01" * (4 << 20))
    view = ctypes.c_char.from_buffer(region)
    start = (ctypes.addressof(view) + (2 << 20) - 1) & ~((2 << 20) - 1)
    ok = libc.madvise(start, 2 << 20, 25) == 0  # MADV_COLLAPSE
    del view  # the mapping cannot close while a view holds it
    region.close()
    return ok, policy


def case_reused_on_huge_pages():
    """The backend moves a large tensor that comes back to the collectives onto huge pages in
    place (madvise MADV_COLLAPSE), and only that one; COLTRAIN_TORCH_HUGE_PAGES=0 turns it off."""
    can_collapse, policy = kernel_can_collapse()
    runs = {}
    for value in ("", "0"):
        results = launch("reused_on_huge_pages", 2, extra_env={"COLTRAIN_TORCH_HUGE_PAGES": value})
        require_all_passed(results, f"reused_on_huge_pages with COLTRAIN_TORCH_HUGE_PAGES={value!r}")
        runs[value] = [data for _, _, _, data in results]
    mib = 1 << 20
    for value, ranks in runs.items():
        for rank, r in enumerate(ranks):
            once, again = r["after_once"] - r["before"], r["after_again"] - r["after_once"]
            label = f"rank {rank}, COLTRAIN_TORCH_HUGE_PAGES={value!r}"
            if "[always]" in policy:
                continue  # every large tensor is on huge pages already: nothing to tell apart
            if once >= 2 * mib:
                raise SystemExit(f"FAILED: {label}: a tensor reduced once went onto huge pages "
                                 f"({once} bytes)")
            if value == "" and can_collapse and again < 16 * mib:
                raise SystemExit(f"FAILED: {label}: a 24 MiB tensor reduced three times put only "
                                 f"{again} bytes onto huge pages")
            if (value == "0" or not can_collapse) and again >= 2 * mib:
                raise SystemExit(f"FAILED: {label}: {again} bytes went onto huge pages")
    if "[always]" in policy:
        print("reused_on_huge_pages: THP policy 'always' here, so every large tensor is on huge "
              "pages without the backend; checked the sums only")
    elif not can_collapse:
        print("reused_on_huge_pages: this kernel cannot collapse (MADV_COLLAPSE needs Linux 6.1 "
              "and THP not 'never'); checked that nothing moved and the sums stay exact")
    else:
        moved = [r["after_again"] - r["after_once"] for r in runs[""]]
        print(f"reused_on_huge_pages: a 24 MiB tensor reduced three times: {moved[0] // mib} and "
              f"{moved[1] // mib} MiB onto huge pages; reduced once, or with "
              f"COLTRAIN_TORCH_HUGE_PAGES=0: none; every sum exact")


def case_torchrun():
    """The usual DDP script under torchrun (--standalone: its store on a port it picked), with only
    the backend name changed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    records = {}
    with tempfile.TemporaryDirectory(prefix="coltrain_torchrun_") as tmp:
        for backend in ("gloo", "coltrain"):
            out = os.path.join(tmp, backend + ".json")
            # -r 2 -t 2: Debian's torch 1.13 fails on its default redirects under Python 3.11.
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2", "-r", "2", "-t", "2", "--log_dir",
                   os.path.join(tmp, "logs_" + backend),
                   os.path.join(root, "benchmarks", "reference", "torch_ddp_mnist.py"),
                   "--backend", backend, "--epochs", "1", "--target-accuracy", "1.1",
                   "--data", os.path.join(root, "data", "mnist"), "--json", out]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
            if run.returncode != 0 or not os.path.exists(out):
                raise SystemExit(f"FAILED: torchrun over {backend} exited {run.returncode}:\n"
                                 f"{run.stdout}\n{run.stderr}")
            records[backend] = json.load(open(out))
    keys = ("train_loss", "train_accuracy", "val_loss", "val_accuracy")
    ours = [{k: e[k] for k in keys} for e in records["coltrain"]["epochs"]]
    theirs = [{k: e[k] for k in keys} for e in records["gloo"]["epochs"]]
    if ours != theirs:
        raise SystemExit(f"FAILED: MNIST under torchrun: coltrain {ours}, gloo {theirs}")
    print(f"torchrun, MNIST DDP, 2 ranks, 1 epoch: the same statistics over coltrain and gloo "
          f"{ours[0]}; epoch {records['coltrain']['epochs'][0]['train_s']:.2f} s over coltrain, "
          f"{records['gloo']['epochs'][0]['train_s']:.2f} s over gloo")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", nargs="?")
    parser.add_argument("world", nargs="?", type=int, default=2)
    parser.add_argument("--worker")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world", dest="world_size", type=int)
    parser.add_argument("--store")
    parser.add_argument("--out")
    parser.add_argument("--backend", default="coltrain")
    parser.add_argument("--mode", default="")
    args = parser.parse_args()
    if args.worker:
        args.world = args.world_size
        return worker_main(args)
    {"collectives": lambda: case_collectives(args.world), "ddp": lambda: case_ddp(args.world),
     "failures": case_failures, "torchrun": case_torchrun,
     "huge_pages": case_huge_pages, "reused_on_huge_pages": case_reused_on_huge_pages}[args.case]()


if __name__ == "__main__":
    main()
