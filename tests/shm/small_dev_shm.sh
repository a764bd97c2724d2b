#!/usr/bin/env bash
# A host whose /dev/shm is small, as a container's is: its ranks size their shared-memory rings to
# fit in half of it, or use TCP with one warning that says how much they would need, and every
# collective stays exact either way. 16 ranks of `rendezvous_bench --check`, each job in a mount
# namespace of its own with a tmpfs on /dev/shm: 4 MiB (too small for 120 segments: TCP) and
# 64 MiB (128 KiB rings). Needs root; exits 77 (skipped) without.
#   usage: small_dev_shm.sh RENDEZVOUS_BENCH LAUNCH_LOCAL
set -uo pipefail
bench=$1 launch=$2

source "$(dirname "$0")/../support/script_outcome.sh"
[ "$(id -u)" = 0 ] || skip "mounting a tmpfs on /dev/shm in a mount namespace needs root"
command -v unshare >/dev/null || skip "no unshare command (util-linux)"

# The output of a 16-rank job whose /dev/shm holds $1.
run() {
  unshare --mount --propagation private sh -c \
    "mount -t tmpfs -o size=$1 tmpfs /dev/shm && exec '$launch' 16 '$bench' --check --max-elements 4096" 2>&1
}
# The largest shared memory any rank of the job held, as rendezvous_bench printed it.
shared_mib() {
  sed -n 's/.*shared memory \([0-9.]*\)).*/\1/p' <<<"$1"
}

out=$(run 4m) || fail "16 ranks, /dev/shm of 4 MiB: $out"
echo "$out"
grep -q "every collective exact" <<<"$out" || fail "4 MiB: no exact collectives reported"
[ "$(grep -c 'use TCP' <<<"$out")" = 1 ] || fail "4 MiB: expected one warning for the host"
grep -q "the 16 ranks on this host use TCP, not shared memory: /dev/shm holds 4 MiB" <<<"$out" ||
  fail "4 MiB: the warning does not name the host's ranks and the size of /dev/shm"
grep -q "shm-size=" <<<"$out" || fail "4 MiB: the warning does not say how to give it more"
[ "$(shared_mib "$out")" = "0.0" ] || fail "4 MiB: a rank held shared memory"

out=$(run 64m) || fail "16 ranks, /dev/shm of 64 MiB: $out"
echo "$out"
grep -q "every collective exact" <<<"$out" || fail "64 MiB: no exact collectives reported"
! grep -q "use TCP" <<<"$out" || fail "64 MiB: some ranks fell back to TCP"
shared=$(shared_mib "$out")
[ -n "$shared" ] && [ "$shared" != "0.0" ] || fail "64 MiB: no rank held shared memory"
echo "PASSED: TCP with one warning in 4 MiB; shared memory ($shared MiB a rank at most) in 64 MiB"
