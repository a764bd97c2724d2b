#!/usr/bin/python3
"""PyTorch DDP reference for coltrain's MNIST demo: MnistConvNet trained data-parallel on the shipped
MNIST subset (data/mnist/: 8,000 training and 2,000 test images) until a target test accuracy,
timing the training loop. On the CPU over gloo (the demo's comparison), or on GPUs over NCCL with
automatic mixed precision (the GPU trainer's comparison, `--device cuda --amp`: eager PyTorch, fp16
autocast and GradScaler, one GPU per rank, device = rank modulo the visible GPUs). `--backend
coltrain` runs the same script over coltrain's torch.distributed backend (python/coltrain_torch):
the usual DDP script with only the backend name changed.

    python3 benchmarks/reference/torch_ddp_mnist.py --world-size 2 [--json result.json]
    python3 benchmarks/reference/torch_ddp_mnist.py --world-size 1 --device cuda --amp
    torchrun --nproc_per_node 2 benchmarks/reference/torch_ddp_mnist.py
    torchrun --nproc_per_node 2 benchmarks/reference/torch_ddp_mnist.py --backend coltrain

Without RANK / WORLD_SIZE in the environment it spawns --world-size ranks itself
(torch.multiprocessing) around a rendezvous store that this process serves on a port the kernel
picked and holds until the end, so nothing else can take it; under torchrun it uses torchrun's.

Recipe (shared with coltrain's demo): SGD with momentum, cross-entropy, per-rank batch 64, gradients
averaged by DDP, DistributedSampler(shuffle=True, seed) with set_epoch each epoch, no augmentation,
pixels normalised as (x / 255 - 0.1307) / 0.3081. The data are preloaded, normalised, as float
tensors (in GPU memory with --device cuda), and batches are gathered by index from them (no
DataLoader, no worker processes).

Evaluation is sharded: rank r evaluates test images r, r + R, r + 2R, ... (each image exactly once)
in eval mode, and one all_reduce sums the training and test statistics, so every rank sees the same
accuracy and all stop at the same epoch.

Timing: "training time" is the wall time of the training steps, from the first step (after a
barrier) to the end of the epoch whose evaluation reached the target, without the evaluation passes
(and the statistics all_reduce); process spawn, data loading and DDP construction come before it. On
the GPU each epoch's time ends with torch.cuda.synchronize().
"total" is the same span including the evaluations.
"""

import argparse
import gzip
import json
import os
import struct
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_backends import describe, keep_freed_memory  # noqa: E402
from torch_models import MnistConvNet  # noqa: E402

MEAN, STD = 0.1307, 0.3081
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801
ROWS = COLS = 28
EVAL_BATCH = 500


class DataError(Exception):
    pass


# ---------------------------------------------------------------------------------------------------
# IDX reading

def _read_file(directory, name):
    """The decompressed bytes of NAME.gz or NAME in DIRECTORY (gzip recognised by its magic)."""
    for candidate in (os.path.join(directory, name + ".gz"), os.path.join(directory, name)):
        if os.path.isfile(candidate):
            with open(candidate, "rb") as f:
                raw = f.read()
            if raw[:2] == b"\x1f\x8b":
                try:
                    raw = gzip.decompress(raw)
                except (OSError, EOFError, gzip.BadGzipFile) as error:
                    raise DataError(f"{candidate}: corrupt gzip data ({error})") from None
            return candidate, raw
    raise DataError(f"{os.path.join(directory, name)}[.gz]: no such file "
                    f"(expected MNIST IDX files in {directory}; pass --data DIR)")


def read_idx_images(directory, name):
    path, data = _read_file(directory, name)
    if len(data) < 16:
        raise DataError(f"{path}: {len(data)} bytes, shorter than the 16-byte IDX image header")
    magic, count, rows, cols = struct.unpack(">IIII", data[:16])
    if magic != IMAGES_MAGIC:
        raise DataError(f"{path}: magic 0x{magic:08x}, expected 0x{IMAGES_MAGIC:08x} (IDX u8 images)")
    if (rows, cols) != (ROWS, COLS):
        raise DataError(f"{path}: images of {rows} x {cols}, expected {ROWS} x {COLS}")
    expected = count * rows * cols
    if len(data) - 16 != expected:
        raise DataError(f"{path}: header says {count} images ({expected} pixel bytes after the "
                        f"16-byte header), the file has {len(data) - 16}")
    if count == 0:
        raise DataError(f"{path}: no images")
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(count, 1, rows, cols)


def read_idx_labels(directory, name):
    path, data = _read_file(directory, name)
    if len(data) < 8:
        raise DataError(f"{path}: {len(data)} bytes, shorter than the 8-byte IDX label header")
    magic, count = struct.unpack(">II", data[:8])
    if magic != LABELS_MAGIC:
        raise DataError(f"{path}: magic 0x{magic:08x}, expected 0x{LABELS_MAGIC:08x} (IDX u8 labels)")
    if len(data) - 8 != count:
        raise DataError(f"{path}: header says {count} labels, the file has {len(data) - 8} bytes "
                        f"after the 8-byte header")
    labels = np.frombuffer(data, dtype=np.uint8, offset=8)
    if count and int(labels.max()) > 9:
        raise DataError(f"{path}: label {int(labels.max())} at index {int(labels.argmax())}, "
                        f"expected 0..9")
    return labels


def load_mnist(directory, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx_images(directory, f"{prefix}-images-idx3-ubyte")
    labels = read_idx_labels(directory, f"{prefix}-labels-idx1-ubyte")
    if len(images) != len(labels):
        raise DataError(f"{directory}: {len(images)} {split} images but {len(labels)} labels")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


def normalise(images_u8):
    return (images_u8.to(torch.float32) / 255.0 - MEAN) / STD


# ---------------------------------------------------------------------------------------------------
# One rank

def evaluate(model, images, labels, rank, world, amp):
    """Sums of the loss and correct predictions over this rank's shard (r, r + R, ...)."""
    shard = torch.arange(rank, len(images), world, device=images.device)
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = 0
    model.eval()
    with torch.no_grad(), autocast(images.device, amp):
        for start in range(0, len(shard), EVAL_BATCH):
            index = shard[start:start + EVAL_BATCH]
            x, y = images.index_select(0, index), labels.index_select(0, index)
            output = model(x)
            loss_sum += F.cross_entropy(output.float(), y, reduction="sum").double().cpu()
            correct += int((output.argmax(1) == y).sum())
    return float(loss_sum), correct, len(shard)


def autocast(device, enabled):
    """fp16 autocast on the GPU under --amp; a no-op context otherwise."""
    return torch.autocast("cuda", dtype=torch.float16, enabled=enabled and device.type == "cuda")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(rank, world, args, data):
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    train_x, train_y, test_x, test_y = (t.to(device) for t in data)
    train_x, test_x = normalise(train_x), normalise(test_x)

    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's too)
    model = MnistConvNet().to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)
    torch.manual_seed(args.seed + rank)  # different dropout masks per rank
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    sampler = DistributedSampler(range(len(train_x)), num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    target = args.target_accuracy
    records = []
    train_s = 0.0
    reached = None
    if rank == 0:
        where = (f"{torch.cuda.get_device_name(device)}{', AMP fp16' if args.amp else ''}"
                 if device.type == "cuda" else f"{args.threads} threads")
        print(f"pytorch {torch.__version__} DDP {backend_of(args)}: {world} ranks x {where}, "
              f"{len(train_x)} training / {len(test_x)} test images, batch {args.batch_size} per rank, "
              f"lr {args.lr}, momentum {args.momentum}, weight decay {args.weight_decay}, "
              f"seed {args.seed}, target {target}", flush=True)
        print(f"reference: {describe()}", flush=True)

    dist.barrier()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)), dtype=torch.int64, device=device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        ddp.train()
        for begin in range(0, len(order), args.batch_size):
            index = order[begin:begin + args.batch_size]
            x, y = train_x.index_select(0, index), train_y.index_select(0, index)
            optimizer.zero_grad(set_to_none=True)
            with autocast(device, args.amp):
                output = ddp(x)
                loss = F.cross_entropy(output, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            with torch.no_grad():
                loss_sum += loss.detach().double() * len(index)
                correct += (output.argmax(1) == y).sum()
        synchronize(device)
        epoch_train_s = time.perf_counter() - epoch_start
        train_s += epoch_train_s

        eval_start = time.perf_counter()
        val_loss, val_correct, val_count = evaluate(model, test_x, test_y, rank, world, args.amp)
        stats = torch.tensor([float(loss_sum), float(correct), float(len(order)),
                              val_loss, float(val_correct), float(val_count)], dtype=torch.float64,
                             device=device)
        dist.all_reduce(stats)
        eval_s = time.perf_counter() - eval_start
        t_loss, t_correct, t_count, v_loss, v_correct, v_count = stats.cpu().tolist()
        record = {
            "epoch": epoch + 1,
            "train_loss": t_loss / t_count,
            "train_accuracy": t_correct / t_count,
            "val_loss": v_loss / v_count,
            "val_accuracy": v_correct / v_count,
            "train_images": int(t_count),
            "train_s": epoch_train_s,
            "eval_s": eval_s,
            "cumulative_train_s": train_s,
            "train_images_per_s": t_count / epoch_train_s,
        }
        records.append(record)
        if rank == 0:
            print(f"epoch: {epoch + 1:02d}/{args.epochs:02d}  "
                  f"training loss: {record['train_loss']:.4f}  "
                  f"training accuracy {record['train_accuracy']:.4f}  "
                  f"validation loss: {record['val_loss']:.4f}  "
                  f"validation accuracy: {record['val_accuracy']:.4f}", flush=True)
        if record["val_accuracy"] >= target:  # the same reduced value on every rank
            reached = epoch + 1
            break
    total_s = time.perf_counter() - start

    trained = sum(r["train_images"] for r in records)
    images_per_s = trained / train_s
    if rank == 0:
        if reached is not None:
            print(f"time to {target:g}: {train_s:.2f} s (epoch {reached})")
        else:
            print(f"target {target:g} not reached in {args.epochs} epochs "
                  f"(training time {train_s:.2f} s)")
        print(f"training: {images_per_s:.1f} images/s ({trained} images in {train_s:.2f} s, "
              f"{world} ranks); total with evaluation: {total_s:.2f} s", flush=True)
        if args.json:
            result = {
                "framework": "pytorch",
                "version": torch.__version__,
                "world_size": world,
                "threads": args.threads,
                "backend": backend_of(args),
                "device": args.device,
                "amp": args.amp,
                "recipe": {
                    "model": "MnistConvNet",
                    "data": os.path.abspath(args.data),
                    "train_images": len(train_x),
                    "test_images": len(test_x),
                    "epochs": args.epochs,
                    "batch_size_per_rank": args.batch_size,
                    "lr": args.lr,
                    "momentum": args.momentum,
                    "weight_decay": args.weight_decay,
                    "seed": args.seed,
                    "target_accuracy": target,
                    "normalisation": [MEAN, STD],
                    "evaluation": "sharded over ranks, summed with all_reduce",
                },
                "epochs": records,
                "time_to_target_s": train_s if reached is not None else None,
                "epoch_reached": reached,
                "train_s": train_s,
                "train_images_per_s": images_per_s,
                "total_s": total_s,
            }
            write_json(args.json, result)


def write_json(path, value):
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, indent=2)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def backend_of(args):
    if args.backend:
        return args.backend
    return "nccl" if args.device == "cuda" else "gloo"


def init_process_group(args, **kwargs):
    """init_process_group with --backend; coltrain's backend registers itself on import."""
    if backend_of(args) == "coltrain":
        import coltrain_torch  # noqa: F401
    dist.init_process_group(backend_of(args), **kwargs)


def run_rank(rank, world, args, data, store_port):
    """Entry point of a spawned rank: joins the store that main() serves on 127.0.0.1:store_port."""
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False)
    init_process_group(args, store=store, rank=rank, world_size=world)
    try:
        train(rank, world, args, data)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------

def load_all(directory):
    train_x, train_y = load_mnist(directory, "train")
    test_x, test_y = load_mnist(directory, "test")
    return train_x, train_y, test_x, test_y


def main():
    parser = argparse.ArgumentParser(
        description="PyTorch DDP reference for coltrain's MNIST demo: time to a target test "
                    "accuracy (CPU over gloo, or GPUs over NCCL).")
    parser.add_argument("--world-size", type=int, default=2,
                        help="ranks to spawn (ignored under torchrun, which sets WORLD_SIZE)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--target-accuracy", type=float, default=0.97)
    parser.add_argument("--data", default="data/mnist", help="folder with the MNIST IDX files")
    parser.add_argument("--json", help="write a result record to this file (atomically)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per rank, NCCL")
    parser.add_argument("--amp", action="store_true",
                        help="automatic mixed precision (fp16 autocast, GradScaler); GPU only")
    parser.add_argument("--backend", choices=("gloo", "nccl", "coltrain"),
                        help="torch.distributed backend (default: gloo on the CPU, nccl on GPUs); "
                             "coltrain needs python/coltrain_torch built and on PYTHONPATH")
    args = parser.parse_args()
    if args.amp and args.device != "cuda":
        parser.error("--amp needs --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but PyTorch sees no CUDA device", file=sys.stderr)
        sys.exit(1)
    for name in ("world_size", "threads", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        data = load_all(args.data)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)

    if launched:  # torchrun (or any env:// launcher)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        init_process_group(args)
        try:
            train(rank, world, args, data)
        finally:
            dist.destroy_process_group()
        return

    # A port picked and released here could be taken by any outgoing connection before a rank
    # binds it; the store below listens on port 0 and keeps the socket until the ranks are done.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # everything is local
    mp.spawn(run_rank, args=(args.world_size, args, data, store.port), nprocs=args.world_size,
             join=True)


if __name__ == "__main__":
    main()
