# Sourced by the shell-script tests: how they end. `skip REASON` exits 77, which their CTest
# entries declare as SKIP_RETURN_CODE, and scripts/test_report lists REASON; `fail REASON` exits 1,
# after the script's own `on_failure` (its ranks' last output, say) where it defines one.
skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAILED: $*"
  if declare -F on_failure >/dev/null; then on_failure; fi
  exit 1
}
