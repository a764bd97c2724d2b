#!/bin/sh
# Runs allreduce_bench --latency (the command after the first two arguments, which must write CSV),
# then checks what the CSV holds, since the exit status alone would pass a run that timed nothing:
# at least one row from each backend named, every row checked and exact (#wrong 0, not empty as
# with -c 0), and p50 and p99 present with 0 < p50 <= p99.
#
#   run_and_check_csv.sh CSV "BACKEND..." COMMAND...
set -eu
csv=$1
backends=$2
shift 2
rm -f "$csv"  # a stale file from an earlier run must not pass for this one's
"$@"
awk -F, -v backends="$backends" '
NR == 1 {
  for (i = 1; i <= NF; ++i) column[$i] = i
  if (!("backend" in column) || !("p50_us" in column) || !("p99_us" in column) ||
      !("wrong" in column)) {
    print "run_and_check_csv: " FILENAME " lacks a backend, p50_us, p99_us or wrong column"
    bad = 1
    exit
  }
  next
}
{
  seen[$column["backend"]] = 1
  p50 = $column["p50_us"]
  p99 = $column["p99_us"]
  if (p50 == "" || p99 == "" || p50 + 0 <= 0 || p99 + 0 < p50 + 0) {
    print "run_and_check_csv: line " NR ": p50 \"" p50 "\", p99 \"" p99 "\": " $0
    bad = 1
  }
  if ($column["wrong"] != "0") {
    print "run_and_check_csv: line " NR ": #wrong \"" $column["wrong"] "\": " $0
    bad = 1
  }
}
END {
  if (NR == 0) {
    print "run_and_check_csv: " FILENAME " is empty"
    bad = 1
  }
  count = split(backends, wanted, " ")
  for (i = 1; i <= count; ++i) {
    if (!(wanted[i] in seen)) {
      print "run_and_check_csv: no rows from backend " wanted[i]
      bad = 1
    }
  }
  exit bad
}' "$csv"
