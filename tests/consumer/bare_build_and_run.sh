#!/bin/sh
# Builds the consumer with a bare compiler line, the way the README shows, then runs it.
# usage: bare_build_and_run.sh OUTPUT SOURCE_DIR "COMPILER FLAGS..." [LAUNCHER ARGS...]
set -eu
output=$1 source_dir=$2 compile=$3
shift 3
mkdir -p "$(dirname "$output")"
set -x
$compile -I "$source_dir/include" "$source_dir/tests/consumer/main.cpp" -o "$output"
"$@" "$output"
