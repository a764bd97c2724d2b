# Sourced by the elastic job scripts (elastic_training.sh, elastic_deterministic.sh), which set
# $worker (tests/elastic/elastic_worker.cpp) and $python first.
failed=0
free_port() { "$python" "$(dirname "${BASH_SOURCE[0]}")/../../scripts/free_port"; }
fail() {
  echo "FAIL: $*"
  failed=1
}
# launch DIR RANKS EPOCHS MIN_RANKS PORT: starts the ranks in the background; their pids in $pids.
# timeout runs each in a process group of its own, linked to the session by this script, so that a
# rank that stops itself stays stopped whatever the group that started the test does
# (tests/faults/fault_injection.sh says why that matters).
launch() {
  local dir=$1 ranks=$2 epochs=$3 min=$4 port=$5
  pids=()
  for ((r = 0; r < ranks; r++)); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$ranks \
      timeout 120 "$worker" "$dir" "$r" "$epochs" "$min" >"$dir/out.$r" 2>&1 &
    pids+=($!)
  done
}
weights_of() { grep -h '^final-weights' "$1" | awk '{print $2}'; }
# shellcheck source=../support/wait_ranks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/wait_ranks.sh"
