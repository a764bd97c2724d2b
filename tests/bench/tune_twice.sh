#!/bin/sh
# coltrain_tune as a user runs it: on 2 ranks, then on 3 into the same file, which must then hold
# the rules of both job shapes for both backends (every collective measured), fitted constants
# for both, and both runs in its history; then a file that is not a tuning file is refused,
# naming it, and left as it was. Tiny sizes: no timing is asserted.
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
bad="$dir/bad.json"
echo '{"format": "something else"}' > "$bad"
if "$mpiexec" -n 2 "$tune" --out "$bad" --max-bytes 64 --rounds 1 > "$dir/bad.out" 2>&1; then
  echo "tune_twice: coltrain_tune overwrote a file that is not a tuning file"
  exit 1
fi
grep -q "tuning file $bad, /format" "$dir/bad.out" || { cat "$dir/bad.out"; exit 1; }
grep -q "something else" "$bad" || { echo "tune_twice: $bad was changed"; exit 1; }
echo "a file that is not a tuning file was refused and left alone"
