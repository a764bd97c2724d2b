#!/usr/bin/python3
"""torch.distributed allreduce over coltrain's backend (python/coltrain_torch) against gloo, in
one run: every rank holds a process group of each backend, and the rounds alternate between them
(gloo first in even rounds, coltrain first in odd ones). Each round times `iterations` calls of
dist.all_reduce on one float32 tensor after a barrier; a round's time is the slowest rank's; the
figure is the median round. Bus bandwidth is NCCL's: 2(p-1)/p x bytes / time.

    PYTHONPATH=build/python python3 benchmarks/torch_backend_bench.py [--world-size 2]
        [--sizes 8,25000000] [--rounds 9] [--json out.json]

Ranks are spawned here around a store on a port the kernel picked (held until the end), on
loopback, one thread each (torch.set_num_threads(1)).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iterations_for(nbytes):
    # About 0.2-1 s a round on the 2-core machine, at least 5 calls.
    return max(5, min(2000, int(2e8 / max(nbytes, 1))))


def time_allreduce(tensor, group, iterations):
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor, group=group)
    elapsed = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item()


def run_rank(rank, world, args, store_port):
    import coltrain_torch  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    groups = {"gloo": dist.group.WORLD, "coltrain": dist.new_group(backend="coltrain")}
    results = []
    for nbytes in args.sizes:
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        iterations = iterations_for(tensor.numel() * 4)
        times = {name: [] for name in groups}
        for name, group in groups.items():  # warm-up: connections, buffers, page faults
            time_allreduce(tensor, group, max(1, iterations // 5))
        for round_index in range(args.rounds):
            order = list(groups) if round_index % 2 == 0 else list(reversed(list(groups)))
            for name in order:
                times[name].append(time_allreduce(tensor, groups[name], iterations))
        row = {"bytes": tensor.numel() * 4, "iterations": iterations}
        for name, samples in times.items():
            median = statistics.median(samples)
            row[name] = {"median_s": median, "samples_s": samples,
                         "busbw_GBps": 2 * (world - 1) / world * row["bytes"] / median / 1e9}
        row["coltrain_over_gloo_busbw"] = row["coltrain"]["busbw_GBps"] / row["gloo"]["busbw_GBps"]
        results.append(row)
        if rank == 0:
            print(f"{row['bytes']:>12} B  gloo {row['gloo']['median_s'] * 1e6:10.1f} us "
                  f"{row['gloo']['busbw_GBps']:7.3f} GB/s   coltrain "
                  f"{row['coltrain']['median_s'] * 1e6:10.1f} us "
                  f"{row['coltrain']['busbw_GBps']:7.3f} GB/s   busbw ratio "
                  f"{row['coltrain_over_gloo_busbw']:.2f}  time ratio "
                  f"{row['coltrain']['median_s'] / row['gloo']['median_s']:.3f}", flush=True)
    if rank == 0 and args.json:
        record = {"world_size": world, "rounds": args.rounds, "torch": torch.__version__,
                  "results": results}
        directory = os.path.dirname(os.path.abspath(args.json))
        fd, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2)
        os.replace(temporary, args.json)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--sizes", default="8,25000000",
                        help="message sizes in bytes, comma-separated (float32 elements)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", help="write the results here (atomically)")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # coltrain's listeners on loopback too
    print(f"torch {torch.__version__}, {args.world_size} ranks, {args.rounds} alternating rounds, "
          f"medians; time per all_reduce, slowest rank", flush=True)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mp.spawn(run_rank, args=(args.world_size, args, store.port), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    sys.exit(main())
