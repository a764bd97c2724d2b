# Sourced by the process-level test scripts (tests/elastic, tests/netns): finish waits for every
# pid in $pids and leaves their exit statuses, in the same order, in $statuses.
finish() {
  statuses=()
  for pid in "${pids[@]}"; do
    wait "$pid"
    statuses+=($?)
  done
}
