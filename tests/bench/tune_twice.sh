#!/bin/sh
# coltrain_tune as a user runs it: on 2 ranks, then on 3 into the same file, which must then hold
# the rules of both job shapes for both backends (every collective measured), fitted constants
# for both, and both runs in its history; the single-copy ranges measured on 2 ranks of this
# host; then a file that is not a tuning file is refused, naming it, and left as it was. Tiny
# sizes: no timing is asserted.
#
#   tune_twice.sh MPIEXEC TUNE PYTHON DIR
set -eu
mpiexec=$1 tune=$2 python=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir"
file="$dir/cluster.tuning.json"
for ranks in 2 3; do
  "$mpiexec" -n "$ranks" "$tune" --out "$file" --max-bytes 2K --rounds 1
done
"$python" - "$file" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
assert t["format"] == "coltrain-tuning" and t["version"] == 1, t
collectives = {"allreduce", "broadcast", "allgather", "reduce_scatter", "reduce", "alltoall",
               "barrier"}
for backend in ("mpi", "tcp"):
    for ranks in (2, 3):
        got = {r["collective"] for r in t["rules"]
               if r["backend"] == backend and r["ranks"] == ranks and r["hosts"] == 1}
        assert got == collectives, (backend, ranks, sorted(got))
    link = t["cost_models"][backend]["point_to_point"]
    assert link["alpha_us"] > 0 and link["beta_us_per_byte"] > 0, link
assert len(t["rules"]) == 28, len(t["rules"])
assert [run["ranks"] for run in t["measured"]] == [2, 3], t["measured"]
print("tuning file ok: 28 rules, 2 runs")
PY
# The single-copy ranges, measured over TCP between the ranks of each host (or the reason printed
# where they cannot be): a size per doubling from 64 KiB, and ranges a reader accepts. On 2 ranks
# of this host, and on 4 ranks posing as 2 hosts of 2 (COLTRAIN_HOST_ID), where each host's pair
# measures in a group of its own and the file holds one result for all.
for shape in one_host two_hosts; do
  sc="$dir/single_copy_$shape.tuning.json"
  if [ "$shape" = one_host ]; then
    "$mpiexec" -n 2 "$tune" --out "$sc" --collectives barrier --max-bytes 256K --rounds 1 \
      > "$dir/single_copy_$shape.out"
  else
    "$mpiexec" -n 4 sh -c \
      'COLTRAIN_HOST_ID=host$(( ${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}} / 2 )) exec "$0" "$@"' \
      "$tune" --out "$sc" --collectives barrier --max-bytes 256K --rounds 1 \
      > "$dir/single_copy_$shape.out"
  fi
  "$python" - "$sc" "$dir/single_copy_$shape.out" "$shape" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read()
shape = sys.argv[3]
shared = t.get("shared_memory")
if shared is None:
    reason = "tcp  single copy: not measured: no two ranks of a host reach each other"
    assert reason in out, out
    print(shape, "single copy not measured: this host refuses it")
    sys.exit(0)
sizes = [int(l.split()[3]) for l in out.splitlines() if l.startswith("tcp  single copy  ")]
assert sizes == [65536, 131072, 262144], (sizes, out)
for key, value in shared.items():
    assert key in ("single_copy_exchanges", "single_copy_exchanges_on_small_pages"), key
    if value != "never":
        assert isinstance(value["from_bytes"], int) and value["from_bytes"] >= 0, value
        assert value.get("below_bytes", 2**64) > value["from_bytes"], value
assert "single_copy_exchanges" in shared, shared
hosts = {r["hosts"] for r in t["rules"]}
assert hosts == ({1} if shape == "one_host" else {2}), hosts
print(shape, "single copy measured:", shared)
PY
done
bad="$dir/bad.json"
echo '{"format": "something else"}' > "$bad"
if "$mpiexec" -n 2 "$tune" --out "$bad" --max-bytes 64 --rounds 1 > "$dir/bad.out" 2>&1; then
  echo "tune_twice: coltrain_tune overwrote a file that is not a tuning file"
  exit 1
fi
grep -q "tuning file $bad, /format" "$dir/bad.out" || { cat "$dir/bad.out"; exit 1; }
grep -q "something else" "$bad" || { echo "tune_twice: $bad was changed"; exit 1; }
echo "a file that is not a tuning file was refused and left alone"
