#!/usr/bin/env bash
# A job in a memory cgroup, as in a container with --memory or a Slurm job with --mem: shared-memory
# rings are charged to it, and a cgroup over its limit is ended by the OOM killer with no message
# (8 ranks' full rings are 112 MiB: before this check such a job died in its setup). Each job runs
# `rendezvous_bench --check` in a fresh cgroup:
#   80 MiB, 8 ranks: smaller rings, said once; every collective exact.
#   20 MiB, 8 ranks: TCP, with one warning that names the cgroup and how to raise its limit; exact.
#   64 MiB with 60 MiB already in use, 2 ranks: each rank stops before it connects, with a
#     ConfigError that names the cgroup, its limit and the fix; no rank is killed.
# Needs root and a memory cgroup it can make (v1's memory hierarchy, or v2 with the memory
# controller enabled for children); exits 77 (skipped) without.
#   usage: memory_cgroup.sh RENDEZVOUS_BENCH LAUNCH_LOCAL
set -uo pipefail
bench=$1 launch=$2

source "$(dirname "$0")/../support/script_outcome.sh"
[ "$(id -u)" = 0 ] || skip "making a memory cgroup needs root"

# The cgroup and its limit file: v1's memory hierarchy, else v2's root where it hands the memory
# controller to its children.
if [ -w /sys/fs/cgroup/memory/cgroup.procs ]; then
  groups=/sys/fs/cgroup/memory limit_file=memory.limit_in_bytes
elif grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  groups=/sys/fs/cgroup limit_file=memory.max
else
  skip "no memory cgroup can be made here (the kernel or container offers neither v1's memory hierarchy nor v2's memory controller to children)"
fi
ballast=/dev/shm/coltrain-test-ballast-$$
cleanup() {
  rm -f "$ballast"
  rmdir "$groups"/coltrain-test-$$-* 2>/dev/null
}
trap cleanup EXIT

# The output of a job of $2 ranks in a fresh cgroup limited to $1 MiB, after $3 MiB of shared
# memory (charged to the cgroup) are taken; its status as the function's. Each job gets a cgroup
# of its own (job_cgroup), so that none waits for the last one's to be removed.
job_cgroup() {
  echo "/coltrain-test-$$-$1m-$2r-$3b"
}
run() {
  local group=$groups$(job_cgroup "$@")
  mkdir "$group" || fail "cannot make $group"
  echo $(($1 << 20)) >"$group/$limit_file" || fail "cannot limit $group to $1 MiB"
  # A fixed MASTER_PORT outside the ephemeral range: scripts/free_port starts Python, which a
  # cgroup this full has no room for.
  sh -c "echo \$\$ > '$group/cgroup.procs' && head -c $3M /dev/zero > '$ballast' &&
         MASTER_PORT=29661 COLTRAIN_LOG_LEVEL=info exec '$launch' $2 '$bench' --check --max-elements 4096" 2>&1
  local status=$?
  rm -f "$ballast"
  return $status
}
# The largest shared memory any rank of the job held, as rendezvous_bench printed it.
shared_mib() {
  sed -n 's/.*shared memory \([0-9.]*\)).*/\1/p' <<<"$1"
}

out=$(run 80 8 0) || fail "8 ranks in 80 MiB: $out"
echo "$out" | grep -v ' info: TCP mesh'
grep -q "every collective exact" <<<"$out" || fail "80 MiB: no exact collectives reported"
! grep -q "use TCP" <<<"$out" || fail "80 MiB: some ranks fell back to TCP"
[ "$(grep -c 'use shared-memory rings of' <<<"$out")" = 1 ] ||
  fail "80 MiB: expected one line for the host saying the rings are smaller"
grep -q "rings of [0-9]* KiB, not 2048 KiB: the memory cgroup $(job_cgroup 80 8 0)" <<<"$out" ||
  fail "80 MiB: the line does not name the ring sizes and the cgroup"
shared=$(shared_mib "$out")
[ -n "$shared" ] && [ "$shared" != "0.0" ] || fail "80 MiB: no rank held shared memory"

out=$(run 20 8 0) || fail "8 ranks in 20 MiB: $out"
echo "$out" | grep -v ' info: TCP mesh'
grep -q "every collective exact" <<<"$out" || fail "20 MiB: no exact collectives reported"
[ "$(grep -c 'use TCP' <<<"$out")" = 1 ] || fail "20 MiB: expected one warning for the host"
grep -q "the 8 ranks on this host use TCP, not shared memory: the memory cgroup $(job_cgroup 20 8 0)" <<<"$out" ||
  fail "20 MiB: the warning does not name the host's ranks and the cgroup"
grep -q -- "--memory" <<<"$out" || fail "20 MiB: the warning does not say how to raise the limit"
[ "$(shared_mib "$out")" = "0.0" ] || fail "20 MiB: a rank held shared memory"

out=$(run 64 2 60) && fail "2 ranks in 64 MiB with 60 in use ran: $out"
echo "$out"
grep -q "a rank of a job of 2 ranks needs about [0-9]* KiB more memory to connect to its peers, but the memory cgroup $(job_cgroup 64 2 60) ($limit_file 64 MiB" <<<"$out" ||
  fail "64 MiB with 60 in use: no error naming the need, the cgroup and its limit"
grep -q "Slurm's --mem" <<<"$out" || fail "64 MiB with 60 in use: the error does not name the fix"
grep -q "operation TCP rendezvous" <<<"$out" || fail "64 MiB with 60 in use: not stopped in the rendezvous"
! grep -q "signal" <<<"$out" || fail "64 MiB with 60 in use: a rank was killed"
echo "PASSED: rings of $shared MiB a rank at most in 80 MiB; TCP with one warning in 20 MiB; an error naming the cgroup before connecting with 4 MiB left"
