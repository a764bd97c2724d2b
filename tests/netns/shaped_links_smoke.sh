#!/usr/bin/env bash
# scripts/bench_shaped_links, small: two "hosts" of one rank each, their links shaped to 1 Gbit/s,
# one round of every allreduce algorithm from 4 B to 64 KiB, in both placements. The script must
# end well and its table must be whole: a row for every size, each naming automatic's pick and
# giving both ratios, and the line on the largest size. Timing is judged in docs/benchmarks.md,
# not here. Exits 77 (skipped) where it cannot create namespaces or shape links.
#   usage: shaped_links_smoke.sh BUILD_DIR WORK_DIR
set -uo pipefail
build=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)

source "$(dirname "$0")/../support/script_outcome.sh"
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"
command -v tc >/dev/null || skip "no tc command (iproute2)"
probe="sp$$"
ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces here (ip netns add)"
tbf_works() {
  ip -n "$probe" link add d0 type veth peer name d1 && ip -n "$probe" link set d0 up &&
    tc -n "$probe" qdisc replace dev d0 root tbf rate 1gbit burst 131072 latency 20ms
}
tbf_works 2>/dev/null
shaped=$?
ip netns del "$probe"
[ "$shaped" = 0 ] || skip "tc cannot add a tbf qdisc here (sch_tbf)"

# coltrain_tune's sizes: 4, 16, 64, ... 65536 bytes (x4), 8 rows.
expected_rows=8
for placement in block cyclic; do
  out="$work/$placement"
  rm -rf "$out" && mkdir -p "$out" || fail "work directory $out"
  "$root/scripts/bench_shaped_links" --build "$build" --hosts 2 --ranks 1 --rates 1gbit \
    --max-bytes 64K --rounds 1 --placement "$placement" --out "$out/runs" >"$out/table.txt" 2>&1
  status=$?
  [ "$status" = 0 ] ||
    { cat "$out/table.txt"; fail "bench_shaped_links --placement $placement exited $status"; }
  rows=$(grep -cE '^\| [0-9]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [a-z_]+ \| [0-9.]+ \| [0-9.]+ \|$' \
    "$out/table.txt")
  [ "$rows" = "$expected_rows" ] ||
    { cat "$out/table.txt"; fail "$placement: $rows whole rows in the table, not $expected_rows"; }
  grep -q '^| 65536 |' "$out/table.txt" || { cat "$out/table.txt"; fail "$placement: no row for 64 KiB"; }
  grep -qE '^largest size 65536 B: fastest [a-z_]+, busbw [0-9.]+ GB/s' "$out/table.txt" ||
    { cat "$out/table.txt"; fail "$placement: no line for the largest size"; }
done
echo "bench_shaped_links, 2 hosts x 1 rank at 1 Gbit/s, block and cyclic: every size from 4 B to 64 KiB in the table"
