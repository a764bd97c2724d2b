#!/bin/sh
# mnist_mlp --deterministic on 3 ranks, once over MPI (mpiexec) and once over TCP (launch_local):
# every allreduce on rank 0's timeline ran rank_order, and the epoch's losses and accuracy in
# metrics.jsonl (doubles written to round trip) are the same on both backends. (Here the default
# mode's automatic picks the same algorithms on both backends too, with other bits than rank_order:
# the timeline is what shows that the flag reached the communicator.)
#   deterministic_backends.sh MPIEXEC LAUNCH_LOCAL SAMPLE PYTHON DIR
set -eu
mpiexec=$1 launch=$2 sample=$3 python=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir"
"$mpiexec" -n 3 "$sample" --backend mpi --deterministic --epochs 1 --no-progress \
  --log-dir "$dir/mpi" --trace "$dir/trace.json"
"$launch" 3 "$sample" --backend tcp --deterministic --epochs 1 --no-progress --log-dir "$dir/tcp"
"$python" - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
events = json.load(open(f"{d}/trace.rank0.json"))
events = events["traceEvents"] if isinstance(events, dict) else events
algorithms = {e["args"]["algorithm"] for e in events
              if e.get("name") == "allreduce" and "algorithm" in e.get("args", {})}
if algorithms != {"rank_order"}:
    sys.exit(f"FAILED: rank 0's allreduces ran {sorted(algorithms)}, not rank_order alone")
fields = ("train_loss", "train_accuracy", "val_loss", "val_top1")
runs = {}
for backend in ("mpi", "tcp"):
    epochs = [json.loads(line) for line in open(f"{d}/{backend}/metrics.jsonl")]
    runs[backend] = [{f: e.get(f) for f in fields} for e in epochs]
print("mpi:", runs["mpi"])
print("tcp:", runs["tcp"])
if runs["mpi"] != runs["tcp"] or not runs["mpi"]:
    sys.exit("FAILED: the backends' epochs differ")
print("the same losses and accuracy over MPI and TCP; every allreduce ran rank_order")
PY
