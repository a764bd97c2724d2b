# Sourced by the other scripts: the build folder and the CUDA toolkit on PATH when it is installed in
# its usual place but not on PATH (a fresh machine), so CMake finds nvcc.
COLTRAIN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COLTRAIN_BUILD_DIR=${COLTRAIN_BUILD_DIR:-$COLTRAIN_ROOT/build}
# The fuzz targets' build (tests/fuzz): clang's, apart from the main g++ build.
COLTRAIN_FUZZ_BUILD_DIR=${COLTRAIN_FUZZ_BUILD_DIR:-$COLTRAIN_ROOT/build-fuzz}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# Configures the build folder unless it already is; extra arguments go to CMake.
coltrain_configure() {
  coltrain_configure_in "$COLTRAIN_ROOT" "$COLTRAIN_BUILD_DIR" "$@"
}

# Configures build folder $2 from source folder $1 with Ninja when it is installed (a folder already
# configured keeps its generator); extra arguments go to CMake. With at least 6 GiB of memory a core,
# g++ may grow its heap before collecting garbage (COLTRAIN_GCC_LARGE_HEAP: up to 4 GB a file, 5-10%
# faster compiles).
coltrain_configure_in() {
  local source=$1 build=$2 generator=() large_heap=OFF memory_kib
  shift 2
  if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
  fi
  memory_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  if [ "${memory_kib:-0}" -ge $((6 * 1024 * 1024 * $(nproc))) ]; then
    large_heap=ON
  fi
  cmake -S "$source" -B "$build" "${generator[@]}" -DCOLTRAIN_GCC_LARGE_HEAP=$large_heap "$@"
}

# Whether clang++-14 links a libFuzzer target with AddressSanitizer and UBSan: their runtimes come
# with libclang-rt-14-dev, which Debian's clang-14 only recommends.
coltrain_can_fuzz() {
  command -v clang++-14 >/dev/null 2>&1 || return 1
  local probe
  probe=$(mktemp -d) || return 1
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    >"$probe/probe.cpp"
  clang++-14 -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" \
    >/dev/null 2>&1
  local status=$?
  rm -rf "$probe"
  return $status
}
