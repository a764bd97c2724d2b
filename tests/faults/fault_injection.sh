#!/usr/bin/env bash
# Kills (SIGKILL) or stops (SIGSTOP) one rank of a 4-rank TCP job in the middle of its allreduce
# loop, for several victims (rank 0, the rendezvous host, included), and checks that
#  - every survivor fails (exit status 1) within COLTRAIN_TIMEOUT (2 s) plus a margin,
#  - every survivor wrote its flight record, and
#  - scripts/diagnose names the victim as the rank that wrote none.
#   usage: fault_injection.sh WORKER PYTHON DIAGNOSE WORKDIR
set -uo pipefail
worker=$1 python=$2 diagnose=$3 work=$4
ranks=4
timeout_s=2
margin_s=4  # a loaded CI machine; the times are printed
failed=0
for signal in KILL STOP; do
  for victim in 0 2 3; do
    dir="$work/$signal-rank$victim"
    rm -rf "$dir" && mkdir -p "$dir"
    port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    pids=()
    for ((rank = 0; rank < ranks; rank++)); do
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$ranks RANK=$rank LOCAL_RANK=$rank \
        LOCAL_WORLD_SIZE=$ranks COLTRAIN_TIMEOUT=$timeout_s COLTRAIN_TRACE_DIR="$dir" \
        "$worker" "$dir/ready.$rank" > "$dir/output.$rank" 2>&1 &
      pids+=($!)
    done
    for ((i = 0; i < 200; i++)); do  # at most 20 s for the rendezvous and 20 calls
      [ "$(ls "$dir" | grep -c '^ready\.')" -eq $ranks ] && break
      sleep 0.1
    done
    kill -$signal "${pids[$victim]}"
    struck=$(date +%s%N)
    # Every survivor must exit by the deadline; poll, then stop everything that is left.
    limit=$((timeout_s + margin_s))
    for ((i = 0; i < limit * 20; i++)); do
      alive=0
      for ((rank = 0; rank < ranks; rank++)); do
        [ $rank -eq $victim ] && continue
        kill -0 "${pids[$rank]}" 2>/dev/null && alive=1
      done
      [ $alive -eq 0 ] && break
      sleep 0.05
    done
    milliseconds=$((($(date +%s%N) - struck) / 1000000))
    kill -KILL "${pids[@]}" 2>/dev/null
    statuses=()
    for ((rank = 0; rank < ranks; rank++)); do
      wait "${pids[$rank]}"
      statuses+=($?)
    done
    verdict=$("$python" "$diagnose" "$dir" 2>&1 | head -1)
    echo "SIG$signal rank $victim: survivors out after ${milliseconds} ms; statuses ${statuses[*]}; $verdict"
    for ((rank = 0; rank < ranks; rank++)); do
      [ $rank -eq $victim ] && continue
      if [ "${statuses[$rank]}" -ne 1 ]; then
        echo "  FAILED: survivor rank $rank exited with ${statuses[$rank]}, not 1:"
        sed 's/^/    /' "$dir/output.$rank"
        failed=1
      elif [ ! -s "$dir/flight_rank$rank.json" ]; then
        echo "  FAILED: survivor rank $rank wrote no flight record"
        failed=1
      fi
    done
    if [[ "$verdict" != "rank $victim wrote no flight record"* ]]; then
      echo "  FAILED: diagnose does not name rank $victim"
      failed=1
    fi
  done
done
exit $failed
