#!/bin/sh
# The installed coltrain.pc: it reports the project's version, and its flags alone build and run a
# program that includes coltrain (Eigen included) and links what the host build needs.
# usage: pkg_config_check.sh PREFIX VERSION COMPILER SOURCE_DIR OUTPUT
set -eu
prefix=$1 version=$2 compiler=$3 source_dir=$4 output=$5
export PKG_CONFIG_PATH="$prefix/share/pkgconfig"
actual=$(pkg-config --modversion coltrain)
if [ "$actual" != "$version" ]; then
  echo "pkg-config reports coltrain $actual, expected $version" >&2
  exit 1
fi
mkdir -p "$(dirname "$output")"
set -x
# shellcheck disable=SC2046 # pkg-config's output is a list of flags
$compiler $(pkg-config --cflags coltrain) "$source_dir/tests/consumer/pkg_config_probe.cpp" \
  -o "$output" $(pkg-config --libs coltrain)
"$output"
