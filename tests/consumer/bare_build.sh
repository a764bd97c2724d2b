#!/bin/sh
# Builds the consumer with a bare compiler line, the way the README shows; a test of its own runs
# it, so that the compile (one core) does not hold the two cores the run's ranks need.
# usage: bare_build.sh OUTPUT SOURCE_DIR "COMPILER FLAGS..."
set -eu
output=$1 source_dir=$2 compile=$3
mkdir -p "$(dirname "$output")"
set -x
$compile -I "$source_dir/include" "$source_dir/tests/consumer/main.cpp" -o "$output"
