#!/usr/bin/env bash
# Out of local ports: in a network namespace of its own whose ephemeral range
# (net.ipv4.ip_local_port_range, per namespace) holds one port, a job of four ranks cannot make
# the connections it needs (three to rank 0's port alone). Every rank must fail well before a
# minute, without a collective run, and at least one must name the limit and its fix: the range
# with its bounds, and the sysctl that widens it. Then the same job with the range widened runs.
# Exits 77 (skipped) where it cannot create namespaces.
#   usage: port_range_limit.sh RENDEZVOUS_BENCH WORK_DIR
set -uo pipefail
bench=$1 work=$2

source "$(dirname "$0")/../support/script_outcome.sh"
# The ranks' last lines.
on_failure() {
  for f in "$work"/out.*; do
    [ -s "$f" ] && { echo "--- $f"; tail -5 "$f"; }
  done
}
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null || skip "no ip command (iproute2)"

ns="cp$$"
cleanup() { ip netns del "$ns" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$ns" 2>/dev/null || skip "cannot create network namespaces here (ip netns add)"
ip -n "$ns" link set lo up || fail "loopback up"
rm -rf "$work" && mkdir -p "$work" || fail "work directory $work"

# shellcheck source=../support/wait_ranks.sh
source "$(dirname "$0")/../support/wait_ranks.sh"

# Runs a job of four ranks in the namespace with the given port range; sets `statuses` (their exit
# statuses, in rank order) and `took` (seconds until the last rank ended).
run_job() {
  ip netns exec "$ns" sh -c "echo '$1' > /proc/sys/net/ipv4/ip_local_port_range" ||
    fail "set the namespace's port range to $1"
  local port=$((20000 + $$ % 10000)) start=$SECONDS rank
  pids=()
  for rank in 0 1 2 3; do
    ip netns exec "$ns" env RANK=$rank WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      COLTRAIN_TIMEOUT=4 timeout 60 "$bench" >"$work/out.$rank" 2>&1 &
    pids+=($!)
  done
  finish
  took=$((SECONDS - start))
}

run_job "40000 40000"
echo "one port: exit codes ${statuses[*]} after ${took} s"
for rank in 0 1 2 3; do
  [ "${statuses[$rank]}" != 0 ] || fail "rank $rank succeeded with one local port"
  [ "${statuses[$rank]}" != 124 ] || fail "rank $rank hung until the test's 60 s timeout"
done
[ "$took" -lt 30 ] || fail "the ranks took $took s to fail (COLTRAIN_TIMEOUT=4)"
grep -l "no local port left (net.ipv4.ip_local_port_range = 40000-40000, 1 ports" "$work"/out.* ||
  fail "no rank named the port range"
grep -h "sysctl -w net.ipv4.ip_local_port_range" "$work"/out.* | head -1 ||
  fail "no rank said how to widen the range"

run_job "40000 40100"
echo "101 ports: exit codes ${statuses[*]} after ${took} s"
for rank in 0 1 2 3; do
  [ "${statuses[$rank]}" = 0 ] || fail "rank $rank failed with 101 local ports"
done
echo "PASSED"
