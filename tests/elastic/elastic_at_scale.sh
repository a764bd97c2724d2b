#!/usr/bin/env bash
# Elastic training at scale over TCP (tests/elastic/elastic_worker.cpp is one rank): RANKS ranks
# (16 by default) train 2 epochs; at step 1 of epoch 0 the ranks in VICTIMS (0 and 9: the
# rendezvous host and leader among them) are killed together. The survivors regroup, finish with
# exit status 0 and equal final weights, and every sample of epoch 0 (the victims' and survivors'
# steps before the fault, then the rest shared anew) and of epoch 1 is trained exactly once.
#   usage: elastic_at_scale.sh WORKER PYTHON WORKDIR [RANKS [VICTIMS]]
set -uo pipefail
worker=$1 python=$2 work=$3 ranks=${4:-16} victims=${5:-0,9}
checker="$(dirname "$0")/check_coverage.py"
# Ranks outnumber the cores: a stall of a second must not be taken for a failure. A killed rank's
# connections reset at once, so the victims are found long before this.
export COLTRAIN_TIMEOUT=20
IFS=, read -r -a lost <<<"$victims"
survivors=$((ranks - ${#lost[@]}))
fail() {
  echo "FAIL: $*"
  for f in "$dir"/out.*; do
    [ -s "$f" ] && { echo "--- $f"; tail -3 "$f"; }
  done
  exit 1
}
is_victim() { [[ ",$victims," == *",$1,"* ]]; }

dir="$work/at-scale"
rm -rf "$dir" && mkdir -p "$dir"
port=$("$python" "$(dirname "$0")/../../scripts/free_port")
faults=""
for v in "${lost[@]}"; do faults+="${faults:+,}$v:1:KILL"; done
pids=()
for ((r = 0; r < ranks; r++)); do
  FAULT=$faults MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$ranks \
    timeout 240 "$worker" "$dir" "$r" 2 "$survivors" >"$dir/out.$r" 2>&1 &
  pids+=($!)
done
# shellcheck source=../support/wait_ranks.sh
source "$(dirname "$0")/../support/wait_ranks.sh"
finish
reference=""
for ((r = 0; r < ranks; r++)); do
  is_victim "$r" && continue
  [ "${statuses[$r]}" = 0 ] || fail "survivor rank $r exited ${statuses[$r]}"
  w=$(grep -h '^final-weights' "$dir/out.$r" | awk '{print $2}')
  [ -n "$w" ] || fail "survivor rank $r printed no final weights"
  [ -z "$reference" ] && reference=$w
  [ "$w" = "$reference" ] || fail "survivor rank $r ended with weights $w, rank 0 of now with $reference"
done
grep -h "elastic: generation" "$dir"/out.* | grep -q -- "-> $survivors ranks" ||
  fail "no generation of $survivors ranks: $(grep -h 'elastic: generation' "$dir"/out.*)"
echo "$ranks ranks, ${#lost[@]} killed ($victims):"
grep -h "elastic: generation" "$dir"/out.*
"$python" "$checker" shrink "$dir" "$ranks" 1 "$victims" || fail "sample coverage"
echo "elastic at scale: all checks passed"
