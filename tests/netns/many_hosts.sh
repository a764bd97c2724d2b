#!/usr/bin/env bash
# Many hosts without a cluster: HOSTS network namespaces (8 by default) stand for hosts, each with
# RANKS_PER_HOST ranks (4), joined through a bridge in a namespace of its own (a switch), so every
# rank reaches every other over a veth link and the ranks of one "host" share memory. One job
# over all of them (TCP backend, a shared secret): rendezvous, then every collective of
# benchmarks/rendezvous_bench --check on int64 values that identify rank, block and element,
# exact on every rank. Prints rank 0's lines: the job's size, its start-up and per-rank costs.
# Exits 77 (skipped) where it cannot create namespaces.
#   usage: many_hosts.sh RENDEZVOUS_BENCH WORK_DIR [HOSTS [RANKS_PER_HOST [MAX_ELEMENTS]]]
set -uo pipefail
bench=$1 work=$2 hosts=${3:-8} per_host=${4:-4} max_elements=${5:-65536}

source "$(dirname "$0")/../support/script_outcome.sh"
# The ranks' last lines.
on_failure() {
  for f in "$work"/out.*; do
    [ -s "$f" ] && { echo "--- $f"; tail -5 "$f"; }
  done
}
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null || skip "no ip command (iproute2)"
[ "$hosts" -ge 2 ] && [ "$hosts" -le 60 ] && [ "$per_host" -ge 1 ] || fail "usage: 2-60 hosts"

tag="cm$$"
switch="${tag}sw"
net="10.$((100 + $$ % 100)).$(($$ / 100 % 250))"  # a /24 of this run's own
cleanup() {
  for ((h = 0; h < hosts; ++h)); do ip netns del "${tag}h$h" 2>/dev/null; done
  ip netns del "$switch" 2>/dev/null
}
trap cleanup EXIT
ip netns add "$switch" 2>/dev/null || skip "cannot create network namespaces here (ip netns add)"
ip -n "$switch" link add br0 type bridge || skip "cannot create a bridge here"
ip -n "$switch" link set br0 up || fail "bridge up"
for ((h = 0; h < hosts; ++h)); do
  host="${tag}h$h"
  ip netns add "$host" || fail "namespace $host"
  ip link add "${tag}v$h" type veth peer name "${tag}p$h" || skip "cannot create veth pairs here"
  ip link set "${tag}v$h" netns "$host" && ip link set "${tag}p$h" netns "$switch" || fail "veth $h"
  ip -n "$switch" link set "${tag}p$h" master br0 && ip -n "$switch" link set "${tag}p$h" up ||
    fail "switch port $h"
  ip -n "$host" addr add "$net.$((h + 1))/24" dev "${tag}v$h" || fail "address of host $h"
  ip -n "$host" link set lo up && ip -n "$host" link set "${tag}v$h" up || fail "links of host $h"
done

rm -rf "$work" && mkdir -p "$work"
world=$((hosts * per_host))
port=$((20000 + $$ % 20000))
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
# One `ip netns exec` per host: it gives its processes a mount namespace of their own, and ranks
# count as one host (shared memory between them) only within one mount namespace.
export bench max_elements work world per_host port secret
export MASTER_ADDR="$net.1"
pids=()
for ((h = 0; h < hosts; ++h)); do
  ip netns exec "${tag}h$h" bash -c '
    for ((local = 0; local < per_host; ++local)); do
      rank=$(('"$h"' * per_host + local))
      (RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$local LOCAL_WORLD_SIZE=$per_host \
        MASTER_PORT=$port COLTRAIN_BACKEND=tcp COLTRAIN_AUTH_TOKEN="$secret" COLTRAIN_AUTH=required \
        COLTRAIN_TIMEOUT=60 timeout 240 "$bench" --check --max-elements "$max_elements" \
        >"$work/out.$rank" 2>&1; echo $? >"$work/status.$rank") &
    done
    wait' &
  pids+=($!)
done
# shellcheck source=../support/wait_ranks.sh
source "$(dirname "$0")/../support/wait_ranks.sh"
finish
for ((rank = 0; rank < world; ++rank)); do
  status=$(cat "$work/status.$rank" 2>/dev/null || echo none)
  [ "$status" = 0 ] || fail "rank $rank exited with status $status"
done
grep -q "^$world ranks: every collective exact" "$work/out.0" || fail "rank 0 printed no check line"
echo "$hosts hosts x $per_host ranks:"
cat "$work/out.0"
