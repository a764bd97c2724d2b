#!/bin/sh
# Runs a command, shows its output, and fails unless it exits with STATUS and printed a line
# matching the extended regular expression.   usage: expect_error.sh STATUS REGEX COMMAND [ARGS...]
expected=$1
regex=$2
shift 2
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ $status -ne "$expected" ]; then
  echo "expect_error.sh: exit status $status, expected $expected" >&2
  exit 1
fi
if ! printf '%s\n' "$output" | grep -Eq -e "$regex"; then
  echo "expect_error.sh: no line matches: $regex" >&2
  exit 1
fi
