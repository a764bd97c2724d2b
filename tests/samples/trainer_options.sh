#!/bin/sh
# The trainer options of a sample, end to end on 2 ranks: --grad-accum, --clip-grad-norm,
# --scale-lr and --early-stopping-patience train and are recorded in config.json; then
# --eval-only --resume DIR evaluates the checkpoint the run left, to the same validation accuracy as
# the run's last epoch; --eval-only with nothing to evaluate fails, naming the directory.
#   usage: trainer_options.sh MPIEXEC SAMPLE PYTHON DIR
set -eu
mpiexec=$1 sample=$2 python=$3 dir=$4
rm -rf "$dir"
mkdir -p "$dir"

"$mpiexec" -n 2 "$sample" --epochs 2 --no-progress --lr 0.01 --scale-lr --grad-accum 2 \
  --clip-grad-norm 5 --early-stopping-patience 3 --checkpoint-dir "$dir/checkpoints" \
  --log-dir "$dir/run" >"$dir/train.txt" 2>&1 || { cat "$dir/train.txt"; exit 1; }
cat "$dir/train.txt"
grep -q "2 batches per optimizer step, learning rate scaled to 0.04$" "$dir/train.txt"

"$mpiexec" -n 2 "$sample" --eval-only --resume "$dir/checkpoints" --no-progress \
  --log-dir "$dir/eval" >"$dir/eval.txt" 2>&1 || { cat "$dir/eval.txt"; exit 1; }
cat "$dir/eval.txt"
grep -Eq "^checkpoint .*checkpoints \(epoch 2, step [0-9]+\): validation loss: [0-9.]+  validation accuracy: [0-9.]+" \
  "$dir/eval.txt"

"$python" - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
config = json.load(open(f"{d}/run/config.json"))
for key, want in [("grad_accum", 2), ("clip_grad_norm", 5.0), ("scale_lr", True),
                  ("effective_lr", 0.04), ("warmup_epochs", 1), ("early_stopping_patience", 3)]:
    assert config[key] == want, (key, config[key], want)
result = json.load(open(f"{d}/run/result.json"))
evaluation = json.load(open(f"{d}/eval/evaluation.json"))
assert evaluation["epoch"] == 2 and evaluation["world_size"] == 2, evaluation
trained, evaluated = result["validation"]["top1"], evaluation["validation"]["top1"]
assert trained == evaluated, (trained, evaluated)
print(f"config.json records the options; the checkpoint evaluates to {evaluated} as trained")
PY

if "$sample" --eval-only --resume "$dir/nothing" --no-progress >"$dir/none.txt" 2>&1; then
  echo "trainer_options.sh: --eval-only without a checkpoint succeeded" >&2
  exit 1
fi
cat "$dir/none.txt"
grep -q "no complete checkpoint to evaluate in .*nothing" "$dir/none.txt"
echo "trainer_options.sh: passed"
