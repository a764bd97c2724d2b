#!/usr/bin/env bash
# Deterministic elastic training over TCP (tests/elastic/elastic_worker.cpp with DETERMINISTIC=1:
# global batches of 64 in 8 micro-shards):
#  1. Reference: one rank, no fault: its final weights.
#  2. Shrink and grow back: 4 ranks; ranks 2 and 3 are killed at step 5 of epoch 0, the two
#     survivors go on (4 -> 2), and two processes started with "join" are admitted at an epoch
#     start (2 -> 4). Every rank ends with the reference's weights, bit for bit, and every epoch
#     line reports the reference's training loss and validation metrics (the training accuracy
#     of epoch 1 counts the survivors' hits alone, so it is left out).
#  3. The leader lost: 4 ranks, ranks 0 and 1 killed at step 5; ranks 2 and 3 finish with the
#     reference's weights and epoch lines (rank 2, the new rank 0, counts the epoch's loss).
#  4. A size that would change the bits: 4 ranks, rank 3 killed; 8 micro-shards do not divide
#     among 3, so the survivors stop with an error that says so, and the leader leaves a final
#     checkpoint.
#   usage: elastic_deterministic.sh WORKER PYTHON WORKDIR
set -uo pipefail
worker=$1 python=$2 work=$3
export COLTRAIN_TIMEOUT=2 DETERMINISTIC=1
# shellcheck source=elastic_job.sh
source "$(dirname "$0")/elastic_job.sh"
# The epoch lines without the training accuracy: epoch, training loss, validation metrics.
epochs_of() { grep -h '^epoch' "$1" | sed 's/training accuracy [0-9.]*//'; }
# same_weights CASE NAME: rank NAME of the case's run ended with the reference's weights.
same_weights() {
  local w
  w=$(weights_of "$dir/out.$2")
  [ "$w" = "$reference" ] || fail "$1: $2's final weights $w differ from the reference's $reference"
}
# same_epochs CASE OUT: the epoch lines in OUT are the reference's.
same_epochs() {
  local run
  run=$(epochs_of "$2")
  [ "$run" = "$reference_epochs" ] ||
    fail "$1: epoch lines differ from the reference's: $(diff <(echo "$reference_epochs") <(echo "$run") | tr '\n' ' ')"
}

epochs=4
# four_ranks_with NAME FAULTS: 4 ranks in $work/NAME (now $dir) with FAULTS, min_ranks 2, to the end.
four_ranks_with() {
  dir="$work/$1"
  rm -rf "$dir" && mkdir -p "$dir"
  FAULT=$2 launch "$dir" 4 "$epochs" 2 "$(free_port)"
  finish
}

# ---- 1. reference -------------------------------------------------------------------------------
dir="$work/deterministic-reference"
rm -rf "$dir" && mkdir -p "$dir"
launch "$dir" 1 "$epochs" 1 "$(free_port)"
finish
[ "${statuses[0]}" = 0 ] || fail "reference: exited ${statuses[0]}: $(tail -3 "$dir/out.0")"
reference=$(weights_of "$dir/out.0")
reference_epochs=$(epochs_of "$dir/out.0")
[ -n "$reference" ] || fail "reference: no final weights"
echo "reference, 1 rank: weights $reference; $(tail -1 <<<"$reference_epochs")"

# ---- 2. shrink from 4 to 2 and grow back to 4 ---------------------------------------------------
dir="$work/deterministic-shrink-and-grow"
rm -rf "$dir" && mkdir -p "$dir"
port=$(free_port)
export FAULT="2:5:KILL,3:5:KILL"
launch "$dir" 4 "$epochs" 2 "$port"
# The joiners wait at rank 0's door from the start; the job admits them at an epoch start after
# the shrink (the first chance is epoch 2's).
for j in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 WORLD_SIZE=1 \
    timeout 120 "$worker" "$dir" "joiner$j" "$epochs" 2 join >"$dir/out.joiner$j" 2>&1 &
  pids+=($!)
done
finish
unset FAULT
names=(0 1 2 3 joiner0 joiner1)
for i in 0 1 4 5; do
  [ "${statuses[$i]}" = 0 ] ||
    fail "shrink and grow: ${names[$i]} exited ${statuses[$i]}: $(tail -3 "$dir/out.${names[$i]}")"
done
grep -q "4 -> 2 ranks" "$dir/out.0" || fail "shrink and grow: no shrink to 2 ranks in rank 0's log"
grep -q "2 -> 4 ranks (2 joined)" "$dir/out.0" ||
  fail "shrink and grow: the joiners were not admitted together"
for name in 0 1 joiner0 joiner1; do same_weights "shrink and grow" "$name"; done
same_epochs "shrink and grow" "$dir/out.0"
echo "shrink and grow: $(grep -h 'elastic: generation' "$dir/out.0" | tr '\n' ';')"

# ---- 3. the leader lost ------------------------------------------------------------------------
four_ranks_with deterministic-leader-lost "0:5:KILL,1:5:KILL"
for r in 2 3; do
  [ "${statuses[$r]}" = 0 ] || fail "leader lost: rank $r exited ${statuses[$r]}: $(tail -3 "$dir/out.$r")"
  same_weights "leader lost" "$r"
done
leader_out=$(grep -l "elastic: generation" "$dir"/out.* | head -1)
same_epochs "leader lost" "$leader_out"
echo "leader lost: $(grep -h 'elastic: generation' "$leader_out")"

# ---- 4. a world size that does not fit the micro-shards ----------------------------------------
four_ranks_with deterministic-misfit "3:5:KILL"
for r in 0 1 2; do
  [ "${statuses[$r]}" = 1 ] || fail "misfit: rank $r exited ${statuses[$r]}, expected 1"
  grep -q "3 ranks left after .*8 micro-shards need a world size that divides them" "$dir/out.$r" ||
    fail "misfit: rank $r: no clear error: $(tail -2 "$dir/out.$r")"
done
ls "$dir"/checkpoints/checkpoint-*.json >/dev/null 2>&1 || fail "misfit: no final checkpoint"
echo "misfit: $(grep -h '^error' "$dir/out.0" | cut -c1-160)"

[ "$failed" = 0 ] && echo "deterministic elastic training: all checks passed"
exit "$failed"
