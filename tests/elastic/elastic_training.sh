#!/usr/bin/env bash
# Elastic training over TCP, end to end (tests/elastic/elastic_worker.cpp is one rank):
#  1. Shrink: 3 ranks; at step 5 of epoch 0 rank 2 is killed, then (separate runs) rank 0 (the
#     rendezvous host and leader) is killed, then rank 1 and then rank 0 are stopped (SIGSTOP: found
#     by the timeout; a stopped leader keeps its port, so the others regroup elsewhere).
#     Each time the survivors finish with exit status 0 and the same final weights on both; the
#     four runs follow the same survivor schedule, so their final weights are equal bit for bit;
#     epoch 0 covers every sample exactly once (what the victim and the survivors trained before
#     the failure, plus the rest shared anew; the survivors' aborted step excluded), and so does
#     epoch 1 on the two survivors.
#  2. Below --min-ranks: 2 ranks with min_ranks 2, one killed: the other stops with an error naming
#     the count, and leaves a final checkpoint.
#  3. Grow back: 2 ranks, and a third process started with "join" beside them: it is admitted at
#     an epoch start (not at the launch), the three end with equal weights, and the epochs after
#     the join cover every sample exactly once over three ranks.
#   usage: elastic_training.sh WORKER PYTHON WORKDIR
set -uo pipefail
worker=$1 python=$2 work=$3
checker="$(dirname "$0")/check_coverage.py"
export COLTRAIN_TIMEOUT=2
# shellcheck source=elastic_job.sh
source "$(dirname "$0")/elastic_job.sh"

# ---- 1. shrink ----------------------------------------------------------------------------------
reference=""
for case in "2:KILL" "0:KILL" "1:STOP" "0:STOP"; do
  victim=${case%%:*} signal=${case##*:}
  dir="$work/shrink-rank$victim-$signal"
  rm -rf "$dir" && mkdir -p "$dir"
  export FAULT="$victim:5:$signal"
  launch "$dir" 3 2 2 "$(free_port)"
  # A stopped victim never exits: end it once both survivors have.
  if [ "$signal" = STOP ]; then
    for ((r = 0; r < 3; r++)); do
      [ "$r" = "$victim" ] && continue
      wait "${pids[$r]}"
      eval "status_$r=$?"
    done
    kill -KILL "${pids[$victim]}" 2>/dev/null
    wait "${pids[$victim]}" 2>/dev/null
    statuses=()
    for ((r = 0; r < 3; r++)); do
      if [ "$r" = "$victim" ]; then statuses+=(137); else eval "statuses+=(\$status_$r)"; fi
    done
  else
    finish
  fi
  unset FAULT
  for ((r = 0; r < 3; r++)); do
    [ "$r" = "$victim" ] && continue
    [ "${statuses[$r]}" = 0 ] || fail "$case: survivor rank $r exited ${statuses[$r]}: $(tail -3 "$dir/out.$r")"
  done
  survivors=()
  for ((r = 0; r < 3; r++)); do [ "$r" != "$victim" ] && survivors+=("$r"); done
  w0=$(weights_of "$dir/out.${survivors[0]}") w1=$(weights_of "$dir/out.${survivors[1]}")
  [ -n "$w0" ] && [ "$w0" = "$w1" ] || fail "$case: the survivors' final weights differ ($w0, $w1)"
  if [ -z "$reference" ]; then reference=$w0; fi
  [ "$w0" = "$reference" ] || fail "$case: final weights $w0 differ from the first run's $reference"
  leader_out=$(grep -l "elastic: generation" "$dir"/out.* | head -1)
  echo "$case: $(grep -h 'elastic: generation' "$dir"/out.* | head -1)"
  grep -q "continuing in epoch 1 after 160 samples per rank, step 5" "$leader_out" ||
    fail "$case: the survivors did not continue from step 5 (160 samples per rank)"
  "$python" "$checker" shrink "$dir" 3 5 "$victim" || fail "$case: sample coverage"
done

# ---- 2. below --min-ranks -----------------------------------------------------------------------
dir="$work/below-min-ranks"
rm -rf "$dir" && mkdir -p "$dir"
export FAULT="1:3:KILL"
launch "$dir" 2 2 2 "$(free_port)"
finish
unset FAULT
[ "${statuses[0]}" = 1 ] || fail "below min-ranks: rank 0 exited ${statuses[0]}, expected 1"
grep -q "only 1 rank is left, fewer than the 2 the job needs" "$dir/out.0" ||
  fail "below min-ranks: no clear error: $(tail -2 "$dir/out.0")"
ls "$dir"/checkpoints/checkpoint-*.json >/dev/null 2>&1 ||
  fail "below min-ranks: no final checkpoint"
echo "below min-ranks: $(grep -h '^error' "$dir/out.0" | cut -c1-150)"

# ---- 3. grow back -------------------------------------------------------------------------------
# With a shared secret when the build has libcrypto (ctest passes one): every handshake of the
# launch, the regroup and the joiner's admission proves it.
if [ -n "${COLTRAIN_TEST_AUTH_TOKEN:-}" ]; then export COLTRAIN_AUTH_TOKEN=$COLTRAIN_TEST_AUTH_TOKEN; fi
dir="$work/grow-back"
rm -rf "$dir" && mkdir -p "$dir"
port=$(free_port)
# The joiner starts with the others; the job admits it at an epoch start, not at its launch.
launch "$dir" 2 6 1 "$port"
MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 WORLD_SIZE=1 \
  timeout 120 "$worker" "$dir" joiner 6 1 join >"$dir/out.joiner" 2>&1 &
pids+=($!)
finish
for s in "${statuses[@]}"; do [ "$s" = 0 ] || fail "grow back: a rank exited $s"; done
grep -q "2 -> 3 ranks (1 joined)" "$dir/out.0" || fail "grow back: rank 0 never admitted the joiner"
w0=$(weights_of "$dir/out.0") w1=$(weights_of "$dir/out.1") wj=$(weights_of "$dir/out.joiner")
[ -n "$w0" ] && [ "$w0" = "$w1" ] && [ "$w0" = "$wj" ] ||
  fail "grow back: final weights differ ($w0, $w1, $wj)"
echo "grow back${COLTRAIN_AUTH_TOKEN:+ (authenticated)}: $(grep -h 'elastic: generation' "$dir/out.0" | head -1)"
"$python" "$checker" grow "$dir" || fail "grow back: sample coverage"

[ "$failed" = 0 ] && echo "elastic training: all checks passed"
exit "$failed"
