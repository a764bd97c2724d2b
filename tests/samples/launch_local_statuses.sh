#!/usr/bin/env bash
# scripts/launch_local reports each rank's own status, and stops the job as soon as one fails.
# With `wait -n` it did neither reliably: bash retires a job that ends while it reports another,
# or whose death by a signal it prints, and `wait -n` then said 127 ("rank ?") for jobs whose ranks
# all succeeded (1 job in a few hundred of 3 ranks running `true`; once in ten `ctest -L tcp`
# runs), and for a rank killed at once it waited for the others to end before saying 127. Each
# case runs several times.
#   usage: launch_local_statuses.sh LAUNCH_LOCAL
set -u
launch=$1
export MASTER_PORT=1 # the ranks below never listen; no port needs to be free

jobs_run=200
for ((job = 0; job < jobs_run; job++)); do
  if ! errors=$(timeout 20 "$launch" 4 true 2>&1); then
    echo "FAIL: job $job of 4 ranks that all exit 0 failed (124: still running after 20 s): $errors"
    exit 1
  fi
done
echo "ok: $jobs_run jobs of 4 ranks that exit 0 together all succeeded"

# expect NAME STATUS MESSAGE COMMAND...: the job ends within 20 s (the other ranks, which would
# sleep for a minute, are stopped) with STATUS, and stderr names the rank with MESSAGE. (A
# launcher still running after 40 s is stopped: status 124.)
expect() {
  local name=$1 want=$2 message=$3
  shift 3
  for attempt in 1 2 3; do
    local start=$SECONDS errors status
    errors=$(timeout 40 "$launch" "$@" 2>&1)
    status=$?
    if [ $status -ne "$want" ] || ! printf '%s\n' "$errors" | grep -q "$message"; then
      echo "FAIL: $name (attempt $attempt): status $status, expected $want; stderr: $errors"
      exit 1
    fi
    if [ $((SECONDS - start)) -ge 20 ]; then
      echo "FAIL: $name (attempt $attempt): the other ranks were not stopped ($((SECONDS - start)) s)"
      exit 1
    fi
  done
  echo "ok: $name: $message"
}
expect "a rank exits 3" 3 "rank 2 of 3 ended with status 3" \
  3 sh -c '[ "$RANK" = 2 ] && exit 3; exec sleep 60'
# Rank 0 dies while the launcher is still starting the other 15: the old launcher lost it every
# time, waited for the 15, and said "rank ? ... status 127".
expect "a rank is killed at once" 137 "rank 0 of 16 ended with signal KILL" \
  16 sh -c '[ "$RANK" = 0 ] && kill -KILL $$; exec sleep 60'
expect "a rank is killed later" 143 "rank 0 of 3 ended with signal TERM" \
  3 sh -c '[ "$RANK" = 0 ] && { sleep 0.3; kill -TERM $$; }; exec sleep 60'
