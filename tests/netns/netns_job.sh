#!/usr/bin/env bash
# Multi-host jobs without a cluster: two network namespaces joined by a veth pair stand for two
# hosts, ranks 0-1 in the first and 2-3 in the second, all traffic on addresses this test gives the
# namespaces. MASTER_ADDR is a host name that the first "host" maps to 127.0.1.1 (Debian's default
# for the machine's own name) and the second to its real address, so the job works only if rank 0
# listens where the others can reach it. Every connection proves a shared secret.
#  1. exact collectives across the hosts (tests/netns/netns_worker.cpp), over IPv4 by host name,
#     and over IPv6 with COLTRAIN_SOCKET_IFNAME naming each host's interface;
#  2. a short training run (the mnist_mlp sample, TCP backend);
#  3. the same collectives with delay and loss: tc netem where the kernel has it; else 2% of
#     host A's outgoing packets dropped by nftables and its link slowed to 100 Mbit/s (tc tbf),
#     whose queue delays packets;
#  4. the link cut mid-run: every rank fails within COLTRAIN_TIMEOUT and a bit, naming a rank on
#     the other side.
# Exits 77 (skipped) where it cannot create namespaces.
#   usage: netns_job.sh NETNS_WORKER FAULT_WORKER MNIST_MLP WORK_DIR
set -uo pipefail
worker=$1 looper=$2 sample=$3 work=$4

source "$(dirname "$0")/../support/script_outcome.sh"
# The ranks' last lines.
on_failure() {
  for f in "$dir"/out.*; do echo "--- $f"; tail -5 "$f"; done
}
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v ip >/dev/null || skip "no ip command (iproute2)"

tag="ct$$"
hostA="${tag}a" hostB="${tag}b"
net="10.$((100 + $$ % 100)).$(($$ / 100 % 250))"  # a /24 of this run's own
net6="fd77:$(printf %x $(($$ % 65536)))::"          # and a /64
cleanup() {
  ip netns del "$hostA" 2>/dev/null
  ip netns del "$hostB" 2>/dev/null
  rm -rf "/etc/netns/$hostA" "/etc/netns/$hostB"
}
trap cleanup EXIT
ip netns add "$hostA" 2>/dev/null || skip "cannot create network namespaces here (ip netns add)"
ip netns add "$hostB" || fail "second namespace"
ip link add "${tag}va" type veth peer name "${tag}vb" || skip "cannot create veth pairs here"
ip link set "${tag}va" netns "$hostA" && ip link set "${tag}vb" netns "$hostB" || fail "veth move"
ip -n "$hostA" addr add "$net.1/24" dev "${tag}va" && ip -n "$hostB" addr add "$net.2/24" dev "${tag}vb"
ipv6=1
ip -n "$hostA" -6 addr add "${net6}1/64" dev "${tag}va" nodad 2>/dev/null &&
  ip -n "$hostB" -6 addr add "${net6}2/64" dev "${tag}vb" nodad 2>/dev/null || ipv6=0
for host in "$hostA" "$hostB"; do ip -n "$host" link set lo up; done
ip -n "$hostA" link set "${tag}va" up && ip -n "$hostB" link set "${tag}vb" up || fail "links up"
# `ip netns exec` mounts /etc/netns/NAME/hosts over /etc/hosts inside the namespace.
master="${tag}-node0"
mkdir -p "/etc/netns/$hostA" "/etc/netns/$hostB"
printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$master" >"/etc/netns/$hostA/hosts"
printf '127.0.0.1 localhost\n%s.1 %s\n' "$net" "$master" >"/etc/netns/$hostB/hosts"

port=$((20000 + $$ % 20000))
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
pids=()
# launch DIR TIMEOUT COMMAND...: ranks 0-1 on host A, 2-3 on host B; MASTER_ADDR is $master and
# COLTRAIN_SOCKET_IFNAME each host's veth when $by_interface is 1.
by_interface=0
launch() {
  dir=$1 timeout_s=$2
  shift 2
  rm -rf "$dir" && mkdir -p "$dir"
  pids=()
  for rank in 0 1 2 3; do
    host=$hostA link="${tag}va"
    [ $rank -ge 2 ] && host=$hostB link="${tag}vb"
    interface=() && [ $by_interface = 1 ] && interface=(COLTRAIN_SOCKET_IFNAME=$link)
    ip netns exec "$host" env "${interface[@]}" RANK=$rank WORLD_SIZE=4 LOCAL_RANK=$((rank % 2)) LOCAL_WORLD_SIZE=2 \
      MASTER_ADDR="$master" MASTER_PORT=$port COLTRAIN_BACKEND=tcp COLTRAIN_AUTH_TOKEN="$secret" \
      COLTRAIN_AUTH=required COLTRAIN_TIMEOUT=$timeout_s \
      timeout 120 "$@" >"$dir/out.$rank" 2>&1 &
    pids+=($!)
  done
  port=$((port + 1))
}
# shellcheck source=../support/wait_ranks.sh
source "$(dirname "$0")/../support/wait_ranks.sh"
all_passed() { for s in "${statuses[@]}"; do [ "$s" = 0 ] || return 1; done; }

# ---- 1. exact collectives across the two hosts ------------------------------------------------
dir="$work/exact"
launch "$dir" 30 "$worker"
finish
all_passed || fail "collectives across hosts: exit statuses ${statuses[*]}"
grep -q "exact: 20 collectives on 4 ranks" "$dir/out.0" || fail "collectives: no result line"
echo "across hosts: $(cat "$dir/out.0")"

if [ $ipv6 = 1 ]; then
  dir="$work/exact-ipv6"
  name=$master master="${net6}1" by_interface=1
  launch "$dir" 30 "$worker"
  finish
  master=$name by_interface=0
  all_passed || fail "collectives over IPv6: exit statuses ${statuses[*]}"
  echo "across hosts over IPv6 (COLTRAIN_SOCKET_IFNAME): $(cat "$dir/out.0")"
else
  echo "SKIPPED part 1, IPv6: cannot give the namespaces IPv6 addresses here"
fi

# ---- 2. a short training run ------------------------------------------------------------------
dir="$work/train"
launch "$dir" 60 "$sample" --backend tcp --epochs 1 --no-progress
finish
all_passed || fail "training across hosts: exit statuses ${statuses[*]}"
grep -qE "^epoch: 01/01 .*validation accuracy: 0\.[89]" "$dir/out.0" || fail "training: no epoch line"
echo "training across hosts: $(grep '^epoch' "$dir/out.0")"

# ---- 3. delay and loss ------------------------------------------------------------------------
# lossy_link: impairs host A's veth, printing what it did, or fails where neither way works.
lossy_link() {
  if ip netns exec "$hostA" tc qdisc add dev "${tag}va" root netem delay 2ms 1ms loss 1% 2>/dev/null; then
    echo "2 ms delay (1 ms jitter) and 1% loss (tc netem)"
    return 0
  fi
  command -v nft >/dev/null || return 1
  ip netns exec "$hostA" nft add table inet coltrain_netns 2>/dev/null || return 1
  ip netns exec "$hostA" nft add chain inet coltrain_netns out \
    '{ type filter hook output priority 0; }' &&
    ip netns exec "$hostA" nft add rule inet coltrain_netns out oifname "${tag}va" \
      numgen random mod 100 '<' 2 counter drop &&
    ip netns exec "$hostA" tc qdisc add dev "${tag}va" root tbf rate 100mbit burst 64kb latency 50ms ||
    return 1
  echo "2% of host A's packets dropped (nftables) on a 100 Mbit/s link (tc tbf)"
}
if impairment=$(lossy_link); then
  dir="$work/netem"
  launch "$dir" 60 "$worker"
  finish
  all_passed || fail "collectives with $impairment: exit statuses ${statuses[*]}"
  dropped=$(ip netns exec "$hostA" nft list ruleset 2>/dev/null | grep -o 'packets [0-9]*' | head -1)
  echo "with $impairment: $(cat "$dir/out.0")${dropped:+ ($dropped dropped)}"
  ip netns exec "$hostA" tc qdisc del dev "${tag}va" root
  ip netns exec "$hostA" nft delete table inet coltrain_netns 2>/dev/null
else
  echo "SKIPPED part 3: neither tc netem nor nftables with tc tbf works here"
fi

# ---- 4. the link cut mid-run ------------------------------------------------------------------
dir="$work/cut"
timeout_s=4
launch "$dir" $timeout_s "$looper" "$dir/ready" 4096
for _ in $(seq 1 200); do [ -e "$dir/ready" ] && break; sleep 0.05; done
[ -e "$dir/ready" ] || fail "cut: the job never got going"
cut_at=$(date +%s.%N)
ip -n "$hostA" link set "${tag}va" down
finish
ended=$(date +%s.%N)
for rank in 0 1 2 3; do
  [ "${statuses[$rank]}" = 1 ] || fail "cut: rank $rank exited ${statuses[$rank]}, not with an error"
  across='rank [23]' && [ $rank -ge 2 ] && across='rank [01]'
  grep -qE "$across" "$dir/out.$rank" || fail "cut: rank $rank names no rank across the cut"
done
elapsed=$(awk "BEGIN { printf \"%.1f\", $ended - $cut_at }")
awk "BEGIN { exit !($elapsed < $timeout_s + 10) }" || fail "cut: the ranks took ${elapsed} s to fail"
echo "link cut: every rank failed within ${elapsed} s (COLTRAIN_TIMEOUT=$timeout_s):"
for rank in 0 1 2 3; do echo "  rank $rank: $(grep -m1 -E 'coltrain:' "$dir/out.$rank" | cut -c1-200)"; done
