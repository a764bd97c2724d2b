# Sourced by the other scripts: the build folder and the CUDA toolkit on PATH when it is installed in
# its usual place but not on PATH (a fresh machine), so CMake finds nvcc.
COLTRAIN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COLTRAIN_BUILD_DIR=${COLTRAIN_BUILD_DIR:-$COLTRAIN_ROOT/build}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# Configures the build folder unless it already is; extra arguments go to CMake.
coltrain_configure() {
  local generator=()
  if [ ! -f "$COLTRAIN_BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
  fi
  cmake -S "$COLTRAIN_ROOT" -B "$COLTRAIN_BUILD_DIR" "${generator[@]}" "$@"
}
