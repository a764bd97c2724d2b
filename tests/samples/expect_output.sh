#!/bin/sh
# Runs a command, shows its output, and fails unless it exits 0 and printed a line matching the
# extended regular expression.   usage: expect_output.sh REGEX COMMAND [ARGS...]
regex=$1
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ $status -ne 0 ]; then
  echo "expect_output.sh: exit status $status" >&2
  exit $status
fi
if ! printf '%s\n' "$output" | grep -Eq "$regex"; then
  echo "expect_output.sh: no line matches: $regex" >&2
  exit 1
fi
