#!/usr/bin/env bash
# Breaks TCP jobs of 2 to 5 ranks in the middle of their allreduce loop, every rank in turn as the
# victim (rank 0, the rendezvous host, included), three ways: SIGKILL, SIGSTOP, and a mismatch (the
# victim passes one more element at a call after the loop is running). The strike comes at a random
# point of the loop, and the message size alternates between 4 KiB (halving-doubling) and 1 MiB
# (ring); the ranks talk through shared memory in half the trials and over loopback TCP
# (COLTRAIN_SHM=0) in the other half, alternating so that both sizes meet both. For each of the
# 42 trials it checks that
#  - every survivor fails (exit status 1) within COLTRAIN_TIMEOUT (2 s) plus its inquiry (0.5 s)
#    plus a margin,
#  - every survivor's error names the victim (died, made no progress, or the count it passed), not
#    its own neighbour,
#  - every survivor wrote its flight record, and
#  - scripts/diagnose names the victim.
# Then a rank sent SIGTERM writes its flight record and ends with status 143.
#   usage: fault_injection.sh WORKER PYTHON DIAGNOSE WORKDIR
set -uo pipefail
# Job control: every rank runs in a process group of its own, which this script links to the
# session for as long as it runs. In the group of whatever started the test, a stopped victim is
# at the mercy of that group's other processes: when the last of them with a parent outside it
# exits (a shell that launched the test in the background and returned), the kernel sends the
# group SIGHUP and SIGCONT (POSIX's orphaned process group rule), the victim goes on, and its
# peers, rightly, do not fail. Seen as "2 ranks, STOP rank 0": the survivor still running at the
# deadline, the victim running too, SIGCONT from the kernel in both.
set -m
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null' EXIT  # no rank outlives the script, stopped or not
worker=$1 python=$2 diagnose=$3 work=$4
timeout_s=2
margin_s=4  # a loaded CI machine; the times are printed
RANDOM=17   # the strike points vary from trial to trial, the same in every run
failed=0
trials=0
# wait_ready DIR RANKS: until every rank has written DIR/ready.<rank>, at most 20 s (the rendezvous
# and 20 calls).
wait_ready() {
  for ((i = 0; i < 200; i++)); do
    [ "$(ls "$1" | grep -c '^ready\.')" -eq "$2" ] && return
    sleep 0.1
  done
}
for ranks in 2 3 4 5; do
  for ((victim = 0; victim < ranks; victim++)); do
    for fault in KILL STOP MISMATCH; do
      trials=$((trials + 1))
      count=$((trials % 2 ? 1024 : 262144))
      shm=$(((trials / 2) % 2))
      dir="$work/$ranks-ranks-$fault-rank$victim"
      odd=()
      [ $fault = MISMATCH ] && odd=($victim $((30 + RANDOM % 40)))
      # Rank 0 listens on a port the kernel gives it and publishes it in the port file: no other
      # process can take it between a choice and the bind.
      rm -rf "$dir" && mkdir -p "$dir"
      pids=()
      for ((rank = 0; rank < ranks; rank++)); do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=0 COLTRAIN_PORT_FILE="$dir/port" WORLD_SIZE=$ranks \
          RANK=$rank LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$ranks COLTRAIN_TIMEOUT=$timeout_s \
          COLTRAIN_TRACE_DIR="$dir" COLTRAIN_SHM=$shm "$worker" "$dir/ready.$rank" $count \
          "${odd[@]}" > "$dir/output.$rank" 2>&1 &
        pids+=($!)
      done
      wait_ready "$dir" $ranks
      survivors=()
      for ((rank = 0; rank < ranks; rank++)); do
        [ $fault = MISMATCH ] || [ $rank -ne $victim ] && survivors+=($rank)
      done
      if [ $fault != MISMATCH ]; then
        sleep "0.$(printf '%03d' $((RANDOM % 200)))"  # somewhere in the loop
        kill -$fault "${pids[$victim]}"
      fi
      struck=$(date +%s%N)
      # Every survivor must exit by the deadline; poll, then stop everything that is left.
      limit=$((timeout_s + 1 + margin_s))
      for ((i = 0; i < limit * 20; i++)); do
        alive=0
        for rank in "${survivors[@]}"; do
          kill -0 "${pids[$rank]}" 2>/dev/null && alive=1
        done
        [ $alive -eq 0 ] && break
        sleep 0.05
      done
      milliseconds=$((($(date +%s%N) - struck) / 1000000))
      # A survivor still running past the deadline: where each of its threads is, for the report.
      for rank in "${survivors[@]}"; do
        if kill -0 "${pids[$rank]}" 2>/dev/null && command -v gdb > /dev/null; then
          timeout 60 gdb -p "${pids[$rank]}" -batch -ex "thread apply all bt" \
            > "$dir/stacks.$rank" 2>&1
        fi
      done
      kill -KILL "${pids[@]}" 2>/dev/null
      statuses=()
      for ((rank = 0; rank < ranks; rank++)); do
        wait "${pids[$rank]}"
        statuses+=($?)
      done
      # The victim as each survivor's error and diagnose's verdict must name it.
      case $fault in
        KILL) named="rank $victim died|lost its connection to rank $victim"
              verdict_names="rank $victim wrote no flight record" ;;
        STOP) named="rank $victim made no progress"
              verdict_names="rank $victim wrote no flight record" ;;
        MISMATCH) named="rank $victim has $((count + 1))"
                  verdict_names="mismatch at call #[0-9]+: rank $victim called" ;;
      esac
      verdict=$("$python" "$diagnose" "$dir" 2>&1 | head -1)
      echo "$ranks ranks, $fault rank $victim ($count floats, COLTRAIN_SHM=$shm): survivors out after ${milliseconds} ms; statuses ${statuses[*]}; $verdict"
      for rank in "${survivors[@]}"; do
        if [ "${statuses[$rank]}" -ne 1 ]; then
          echo "  FAILED: survivor rank $rank exited with ${statuses[$rank]}, not 1:"
          sed 's/^/    /' "$dir/output.$rank"
          if [ -s "$dir/stacks.$rank" ]; then
            echo "  its threads at the deadline:"
            grep -E '^(Thread|#)' "$dir/stacks.$rank" | sed 's/^/    /'
          fi
          failed=1
        elif ! grep -q -E "$named" "$dir/output.$rank"; then
          echo "  FAILED: survivor rank $rank does not name rank $victim as the cause:"
          sed 's/^/    /' "$dir/output.$rank"
          failed=1
        elif [ ! -s "$dir/flight_rank$rank.json" ]; then
          echo "  FAILED: survivor rank $rank wrote no flight record"
          failed=1
        fi
      done
      # With two ranks a mismatch has no minority: diagnose names both sides.
      if ! [[ "$verdict" =~ $verdict_names ]] && ! { [ $fault = MISMATCH ] && [ $ranks -eq 2 ]; }; then
        echo "  FAILED: diagnose does not name rank $victim"
        failed=1
      fi
    done
  done
done
# SIGTERM (what launchers send the other ranks when one fails): the rank writes its flight record,
# then ends as SIGTERM ends a process (status 143).
dir="$work/sigterm"
rm -rf "$dir" && mkdir -p "$dir"
pids=()
for rank in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=0 COLTRAIN_PORT_FILE="$dir/port" WORLD_SIZE=2 RANK=$rank COLTRAIN_TIMEOUT=$timeout_s \
    COLTRAIN_TRACE_DIR="$dir" "$worker" "$dir/ready.$rank" 1024 > "$dir/output.$rank" 2>&1 &
  pids+=($!)
done
wait_ready "$dir" 2
kill -TERM "${pids[0]}"
wait "${pids[0]}"
status=$?
wait "${pids[1]}"
echo "SIGTERM rank 0: status $status; $(grep -o '"reason": "[^"]*"' "$dir/flight_rank0.json" 2>/dev/null)"
if [ $status -ne 143 ] || ! grep -q '"reason": "SIGTERM"' "$dir/flight_rank0.json" 2>/dev/null; then
  echo "  FAILED: SIGTERM did not write rank 0's flight record and end it with status 143"
  failed=1
fi
echo "$trials trials and SIGTERM"
exit $failed
