#!/bin/sh
# mnist_mlp --global-batch 64 (8 micro-shards) for one epoch on 1, 2 and 4 TCP ranks, on 4 with
# --zero 1, on 4 with --elastic, and on 4 MPI ranks (mpiexec, where given): the epoch's training loss and accuracy and the validation accuracy in
# metrics.jsonl (doubles written to round trip) and the checkpoint's weights file are the same bits
# in every run. (The validation
# loss is summed over each rank's part of the validation set, so its last bits may differ.)
#   global_batch_world_sizes.sh LAUNCH_LOCAL SAMPLE PYTHON DIR [MPIEXEC]
set -eu
launch=$1 sample=$2 python=$3 dir=$4 mpiexec=${5:-}
rm -rf "$dir" && mkdir -p "$dir"
for ranks in 1 2 4; do
  "$launch" "$ranks" "$sample" --backend tcp --global-batch 64 --epochs 1 --no-progress \
    --log-dir "$dir/p$ranks" --checkpoint-dir "$dir/p$ranks/checkpoints"
done
"$launch" 4 "$sample" --backend tcp --global-batch 64 --zero 1 --epochs 1 --no-progress \
  --log-dir "$dir/p4zero" --checkpoint-dir "$dir/p4zero/checkpoints"
"$launch" 4 "$sample" --backend tcp --global-batch 64 --elastic --epochs 1 --no-progress \
  --log-dir "$dir/p4elastic" --checkpoint-dir "$dir/p4elastic/checkpoints"
runs="1 2 4 4zero 4elastic"
if [ -n "$mpiexec" ]; then
  "$mpiexec" -n 4 "$sample" --backend mpi --global-batch 64 --epochs 1 --no-progress \
    --log-dir "$dir/p4mpi" --checkpoint-dir "$dir/p4mpi/checkpoints"
  runs="$runs 4mpi"
fi
"$python" - "$dir" $runs <<'PY'
import glob, json, sys
d, names = sys.argv[1], sys.argv[2:]
fields = ("train_loss", "train_accuracy", "val_top1")
runs = {}
for ranks in names:
    epochs = [json.loads(line) for line in open(f"{d}/p{ranks}/metrics.jsonl")]
    weights = sorted(glob.glob(f"{d}/p{ranks}/checkpoints/*.model.safetensors"))
    if not epochs or not weights:
        sys.exit(f"FAILED: {ranks} left no epoch record or no checkpoint")
    runs[ranks] = ([{f: e.get(f) for f in fields} for e in epochs], open(weights[-1], "rb").read())
    print(f"{ranks}:", runs[ranks][0])
for ranks in names[1:]:
    if runs[ranks][0] != runs["1"][0]:
        sys.exit(f"FAILED: {ranks}: the epochs differ from 1 rank's")
    if runs[ranks][1] != runs["1"][1]:
        sys.exit(f"FAILED: {ranks}: the weights differ from 1 rank's")
print("the same losses, accuracy and weights in every run:", ", ".join(names))
PY
