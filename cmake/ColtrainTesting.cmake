# Helpers that register coltrain's tests with CTest. Every test gets a timeout, so a hang fails fast, and
# labels from this set: unit, mpi, tcp, gpu, parity, slow, headers, compile_fail, consumer, slurm.

include(Catch)

set(COLTRAIN_TEST_TIMEOUT 60 CACHE STRING "Default per-test timeout in seconds")
set(COLTRAIN_SLOW_TEST_TIMEOUT 900 CACHE STRING "Timeout in seconds for tests labelled slow")
# The return code CTest reads as "skipped" (GPU tests without a device).
set(COLTRAIN_SKIP_RETURN_CODE 77)

# Catch's implementation, compiled once (15-30 s) for the four kinds of test main below, which call
# it through tests/support/catch_session.hpp.
add_library(coltrain_catch_session STATIC "${CMAKE_CURRENT_LIST_DIR}/../tests/support/catch_session.cpp")
target_link_libraries(coltrain_catch_session PUBLIC Catch2::Catch2)
add_library(coltrain_catch_main OBJECT "${CMAKE_CURRENT_LIST_DIR}/../tests/support/catch_main.cpp")
target_link_libraries(coltrain_catch_main PUBLIC coltrain_catch_session)

# The Catch main of a kind of test, compiled once and linked into every suite of that kind.
function(_coltrain_catch_main_library name source)
  if(NOT TARGET ${name})
    add_library(${name} OBJECT "${PROJECT_SOURCE_DIR}/tests/support/${source}")
    target_link_libraries(${name} PUBLIC coltrain::coltrain coltrain_catch_session
                                  PRIVATE coltrain_warnings)
  endif()
endfunction()

# COLTRAIN_SANITIZE_TESTS: the suites named in COLTRAIN_SANITIZED_SUITES (set by tests/CMakeLists.txt:
# the transports, collectives, failure paths and parsers) are built with AddressSanitizer (and
# LeakSanitizer) and UndefinedBehaviorSanitizer in this build, in place of a plain build of them, so
# CI builds and runs them once (a separate sanitizer build took 13 of CI's 63 minutes). -O0:
# instrumented code builds in a half to a third of -O1's time, which more than pays for its slower
# run; the sanitizers miss nothing for it, and assertions stay on (-UNDEBUG). -g1 (line tables) is
# all a stack trace needs. _GLIBCXX_ASSERTIONS adds libstdc++'s bounds checks (operator[] within
# capacity, which ASan cannot see). ASan makes g++ 12 warn falsely of uninitialised members inside
# libstdc++ (<regex>, std::function), hence -Wno-maybe-uninitialized for these suites alone. Any
# report ends the program with an error, failing its test.
option(COLTRAIN_SANITIZE_TESTS "Build the transport, collective and parser suites with ASan+UBSan" OFF)
set(COLTRAIN_SANITIZER_FLAGS -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all)
# The suites in COLTRAIN_NUMERIC_SANITIZED_SUITES (layers, optimizers, trainers) leave out UBSan's
# checks of every memory access and dynamic type: at -O0 they made these suites' instrumented
# code about 1.5 times as slow to compile (test_layers.cpp: 90 s against 58 s, both sanitizers).
# ASan still catches null and out-of-bounds accesses there, and their tensors are aligned by
# construction; the transports and parsers, which reinterpret bytes from the wire or a file, keep
# every check.
set(COLTRAIN_NUMERIC_SANITIZER_EXCEPTIONS -fno-sanitize=alignment,null,object-size,vptr)
# Their timeouts are tripled for the slower code.
set(COLTRAIN_SANITIZED_TIMEOUT_FACTOR 3)

function(_coltrain_is_sanitized target out)
  if(COLTRAIN_SANITIZE_TESTS AND target IN_LIST COLTRAIN_SANITIZED_SUITES)
    set(${out} ON PARENT_SCOPE)
  else()
    set(${out} OFF PARENT_SCOPE)
  endif()
endfunction()

# Sanitized programs link as fixed-address executables (-no-pie): ASan's metadata for every global
# made a position-independent one carry about a million relocations (nn_tests: 980,911), which the
# loader applied at each start, a tenth of a second; a run starts one per test case (574) and more
# for the MPI suites' ranks and the fault tests' workers. nn_tests' start: 0.24 -> 0.145 s.
function(_coltrain_add_sanitizer_flags target)
  target_compile_options(${target} PRIVATE ${COLTRAIN_SANITIZER_FLAGS} -fno-omit-frame-pointer
                         -O0 -g1 -UNDEBUG -D_GLIBCXX_ASSERTIONS -Wno-maybe-uninitialized)
  target_link_options(${target} PRIVATE ${COLTRAIN_SANITIZER_FLAGS} -no-pie)
endfunction()

# coltrain_sanitize(target): the sanitizer build of one program, if COLTRAIN_SANITIZE_TESTS is on
# and the program is one of COLTRAIN_SANITIZED_SUITES.
function(coltrain_sanitize target)
  _coltrain_is_sanitized(${target} sanitized)
  if(sanitized)
    _coltrain_add_sanitizer_flags(${target})
    if(target IN_LIST COLTRAIN_NUMERIC_SANITIZED_SUITES)
      target_compile_options(${target} PRIVATE ${COLTRAIN_NUMERIC_SANITIZER_EXCEPTIONS})
    endif()
  endif()
endfunction()

# coltrain_link_for_tests(target): links a test program with coltrain compiled separately
# (core/config.hpp): its files see the Communicator's declarations only, and one library per build
# flavour compiles the definitions once, the CPU products' too (a file of layers' tests: a third
# less time): the programs' libraries of the top-level CMakeLists (baseline and -march=native), and
# a sanitized one, with every UBSan check. A test file over the communicator then compiles in a
# quarter of the time (test_point_to_point.cpp, sanitized at -O0: 7.1 s against 29.2 s), and every
# suite runs the separately compiled library users may choose; the header checks and consumer tests
# build header-only. Call it after the program's -march option, before coltrain_sanitize. Programs
# that change a configuration macro (COLTRAIN_WITH_OPENSSL=0...) stay header-only: the library's
# definitions would be the other configuration's.
function(coltrain_link_for_tests target)
  _coltrain_is_sanitized(${target} sanitized)
  if(sanitized)
    _coltrain_sanitized_separate_library()
    target_link_libraries(${target} PRIVATE coltrain_tests_separate_sanitized)
  else()
    coltrain_link_separately(${target})
  endif()
endfunction()

# _coltrain_sanitized_separate_library(): creates that library's sanitized flavour,
# coltrain_tests_separate_sanitized, on first use.
function(_coltrain_sanitized_separate_library)
  set(library coltrain_tests_separate_sanitized)
  if(TARGET ${library})
    return()
  endif()
  coltrain_add_separate_library(${library} "${PROJECT_SOURCE_DIR}/cmake" "${Eigen3_FOUND}")
  target_link_libraries(${library} PRIVATE coltrain_warnings)
  _coltrain_add_sanitizer_flags(${library})
  # The CPU products are the numeric suites' code, sanitized as those suites are: with every
  # UBSan check they ran nn_tests' gradient checks a third slower (a small ResNet 19.0 -> 26.8 s).
  set_source_files_properties("${PROJECT_SOURCE_DIR}/cmake/separate_compilation_tensor.cpp"
                              PROPERTIES COMPILE_OPTIONS "${COLTRAIN_NUMERIC_SANITIZER_EXCEPTIONS}")
endfunction()

# The timeout of a suite's tests: the one given, else the label's default; tripled if sanitized.
function(_coltrain_timeout_for target labels given out)
  if(given)
    set(timeout ${given})
  elseif("slow" IN_LIST labels)
    set(timeout ${COLTRAIN_SLOW_TEST_TIMEOUT})
  else()
    set(timeout ${COLTRAIN_TEST_TIMEOUT})
  endif()
  _coltrain_is_sanitized(${target} sanitized)
  if(sanitized)
    math(EXPR timeout "${timeout} * ${COLTRAIN_SANITIZED_TIMEOUT_FACTOR}")
  endif()
  set(${out} ${timeout} PARENT_SCOPE)
endfunction()

# coltrain_add_unit_test(NAME n SOURCES s... [HEADER_ONLY] [NATIVE] [LABELS l...] [LINK t...])
# One executable; every Catch test case in it becomes its own CTest test "<n>.<case name>".
# Compiled against coltrain_link_for_tests' library unless HEADER_ONLY; NATIVE: for this machine's
# instruction set (-march=native).
function(coltrain_add_unit_test)
  cmake_parse_arguments(ARG "HEADER_ONLY;NATIVE" "NAME" "SOURCES;LABELS;LINK" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE coltrain::coltrain coltrain_warnings coltrain_catch_main
                                            ${ARG_LINK})
  if(ARG_NATIVE)
    target_compile_options(${ARG_NAME} PRIVATE -march=native)
  endif()
  if(NOT ARG_HEADER_ONLY)
    coltrain_link_for_tests(${ARG_NAME})
  endif()
  coltrain_sanitize(${ARG_NAME})
  set(labels unit ${ARG_LABELS})
  _coltrain_timeout_for(${ARG_NAME} "${labels}" "" timeout)
  # --warn NoTests: a test whose name matches no case fails instead of passing having run nothing
  # (CMake splits discovered names at ';', so a case named "a; b" was run as "a" and matched none).
  catch_discover_tests(${ARG_NAME} TEST_PREFIX "${ARG_NAME}." EXTRA_ARGS --warn NoTests)
  # The labels and timeout are set by a file CTest reads after the discovered cases (their names
  # are in ${ARG_NAME}_TESTS, catch_discover_tests' default TEST_LIST), not through
  # catch_discover_tests' PROPERTIES: that flattens a list, so "LABELS unit;tcp TIMEOUT 180" became
  # LABELS unit alone, and the TCP suites ran without their label or timeout.
  set(properties "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_properties.cmake")
  file(WRITE "${properties}"
       "if(${ARG_NAME}_TESTS)\n"
       "  set_tests_properties(\${${ARG_NAME}_TESTS} PROPERTIES LABELS \"${labels}\"\n"
       "                       TIMEOUT ${timeout})\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${properties}")
endfunction()

# coltrain_add_mpi_test(NAME n SOURCES s... RANKS r... [PLAIN_RANKS r...] [LABELS l...] [LINK t...]
#                       [TIMEOUT s])
# One executable, run as "mpiexec -n r" for each r; CTest test "<n>.np<r>". PROCESSORS keeps CTest from
# running more ranks than cores alongside other tests. TIMEOUT overrides the label's default for
# suites that oversubscribe the cores with many ranks. PLAIN_RANKS: where the suite is sanitized,
# these rank counts run a plain build of it instead ("<n>_plain"): sanitized, 4 and 5 ranks on 2
# cores took collective_tests 223 s against 78 s plain, and 3 ranks already take the
# non-power-of-two paths.
function(coltrain_add_mpi_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;RANKS;PLAIN_RANKS;LABELS;LINK" ${ARGN})
  _coltrain_catch_main_library(coltrain_catch_mpi_main catch_mpi_main.cpp)
  set(programs ${ARG_NAME})
  _coltrain_is_sanitized(${ARG_NAME} sanitized)
  if(sanitized AND ARG_PLAIN_RANKS)
    list(APPEND programs ${ARG_NAME}_plain)
  endif()
  foreach(program IN LISTS programs)
    add_executable(${program} ${ARG_SOURCES})
    target_link_libraries(${program} PRIVATE coltrain::coltrain coltrain_warnings
                                             coltrain_catch_mpi_main ${ARG_LINK})
    coltrain_link_for_tests(${program})
  endforeach()
  coltrain_sanitize(${ARG_NAME})
  set(labels mpi ${ARG_LABELS})
  _coltrain_timeout_for(${ARG_NAME} "${labels}" "${ARG_TIMEOUT}" timeout)
  _coltrain_timeout_for(${ARG_NAME}_plain "${labels}" "${ARG_TIMEOUT}" plain_timeout)
  foreach(ranks IN LISTS ARG_RANKS ARG_PLAIN_RANKS)
    set(program ${ARG_NAME})
    set(test_timeout ${timeout})
    if(ranks IN_LIST ARG_PLAIN_RANKS AND TARGET ${ARG_NAME}_plain)
      set(program ${ARG_NAME}_plain)
      set(test_timeout ${plain_timeout})
    endif()
    set(test "${ARG_NAME}.np${ranks}")
    add_test(NAME ${test}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${program}> ${MPIEXEC_POSTFLAGS})
    # MPI_Init loads hwloc's plugins; those for GL and OpenCL (X11, the OpenCL loader) probe for
    # GPUs that no test uses, and leave thread-local storage that LeakSanitizer's scan at exit
    # crashes on ("Tracer caught signal 11"), failing a sanitized suite that passed.
    set_tests_properties(${test} PROPERTIES LABELS "${labels}" TIMEOUT ${test_timeout}
                                            PROCESSORS ${ranks}
                                            ENVIRONMENT "HWLOC_COMPONENTS=-gl,-opencl")
  endforeach()
endfunction()

# coltrain_add_gpu_test(NAME n SOURCES s... [LINK t...] [RUN_WITH command...])
# Sources may mix .cu (nvcc) and .cpp. Without a CUDA device the test reports "skipped: no CUDA device"
# and CTest lists it as skipped; under COLTRAIN_GPU_CHECK_ONLY it is not linked and says so,
# skipped as well. RUN_WITH: a command that runs the test program, given as its last argument (a
# wrapper that prepares its inputs first).
function(coltrain_add_gpu_test)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LINK;RUN_WITH" ${ARGN})
  coltrain_add_gpu_program(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE coltrain::coltrain coltrain_warnings ${ARG_LINK})
  if(COLTRAIN_GPU_CHECK_ONLY)
    target_link_libraries(${ARG_NAME} PRIVATE coltrain_catch_session CUDA::cudart)
    add_test(NAME ${ARG_NAME}
             COMMAND sh -c "echo 'skipped: no GPU; compiled by nvcc -ptx, not linked \
(COLTRAIN_GPU_CHECK_ONLY)'; exit ${COLTRAIN_SKIP_RETURN_CODE}")
  else()
    if(NOT TARGET coltrain_catch_gpu_main)
      _coltrain_catch_main_library(coltrain_catch_gpu_main catch_gpu_main.cpp)
      target_link_libraries(coltrain_catch_gpu_main PUBLIC CUDA::cudart)
    endif()
    target_link_libraries(${ARG_NAME} PRIVATE coltrain_catch_gpu_main)
    add_test(NAME ${ARG_NAME} COMMAND ${ARG_RUN_WITH} $<TARGET_FILE:${ARG_NAME}>)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS gpu TIMEOUT ${COLTRAIN_TEST_TIMEOUT}
                                              SKIP_RETURN_CODE ${COLTRAIN_SKIP_RETURN_CODE})
endfunction()

# coltrain_add_compile_fail_test(FILE f)
# Eigen-style failtest: f must compile as is (test "<name>.control") and must fail to compile with
# -DCOLTRAIN_SHOULD_FAIL, printing the regular expression on f's line "// expected-error: <regex>"
# (test "<name>"), so a failure for any other reason does not count.
function(coltrain_add_compile_fail_test)
  cmake_parse_arguments(ARG "" "FILE" "" ${ARGN})
  get_filename_component(stem "${ARG_FILE}" NAME_WE)
  file(STRINGS "${ARG_FILE}" expected REGEX "^// expected-error: ")
  if(NOT expected)
    message(FATAL_ERROR "${ARG_FILE} has no '// expected-error: <regex>' line")
  endif()
  string(REGEX REPLACE "^// expected-error: " "" expected "${expected}")
  set(compile ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only ${COLTRAIN_GCC_HEAP_FLAGS}
              -I${PROJECT_SOURCE_DIR}/include ${COLTRAIN_HEADER_CHECK_FLAGS} "${ARG_FILE}")
  add_test(NAME compile_fail.${stem} COMMAND ${compile} -DCOLTRAIN_SHOULD_FAIL)
  set_tests_properties(compile_fail.${stem} PROPERTIES LABELS compile_fail
                       TIMEOUT ${COLTRAIN_TEST_TIMEOUT} PASS_REGULAR_EXPRESSION "${expected}")
  add_test(NAME compile_fail.${stem}.control COMMAND ${compile})
  set_tests_properties(compile_fail.${stem}.control PROPERTIES LABELS compile_fail
                       TIMEOUT ${COLTRAIN_TEST_TIMEOUT})
endfunction()

# coltrain_add_header_checks(HEADERS h... [CUDA_HEADERS cuh...])
# Each public header must compile on its own, twice included (the include guard holds), with warnings
# as errors, with the configured backends; and every header must compile with no backends (as plain
# g++ sees it), which header.all.plain checks in one translation unit: a check a header took 2.4 s,
# 270 s of CI for 112 headers, and the plain build's failure (code that needs a backend outside its
# #if) shows in one translation unit as well. Under nvcc
# every .hpp is compiled in one translation unit, header.all.nvcc (each .hpp's self-containment is
# g++'s check; nvcc adds its front end and device pass, at 3.6 s a header when each had its own),
# and each CUDA header (.cuh, nvcc-only) on its own through nvcc's device pass (the GPU targets
# compile them completely).
# A header that only includes others (coltrain.hpp, train.hpp...: no code, no conditions) is
# self-contained when they are, so it has no check of its own (train.hpp's took 13 s of CI); the
# all-headers file with the backends, header.all.backends, compiles it with the rest under g++.
# A header with a line `#if !COLTRAIN_WITH_<BACKEND>` (MPI, CUDA, NCCL, CUDNN) + `#error` exists only
# with that backend: it is checked only when the backend is configured, and never in the plain variant.
function(coltrain_add_header_checks)
  cmake_parse_arguments(ARG "" "" "HEADERS;CUDA_HEADERS" ${ARGN})
  set(include_root "${PROJECT_SOURCE_DIR}/include")
  set(check_dir "${CMAKE_CURRENT_BINARY_DIR}/header_check")
  set(nvcc ${CMAKE_CUDA_COMPILER} -std=c++20 -x cu -arch=sm_${COLTRAIN_NVCC_ARCH}
           -Werror all-warnings -I${include_root} ${COLTRAIN_HEADER_CHECK_FLAGS})
  set(gxx ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only -Wall -Wextra -Wpedantic -Werror
          ${COLTRAIN_GCC_HEAP_FLAGS} -I${include_root})
  set(all_includes "")
  set(plain_includes "")
  foreach(header IN LISTS ARG_HEADERS ARG_CUDA_HEADERS)
    file(STRINGS "${header}" needs_backends REGEX "^#if !COLTRAIN_WITH_(MPI|CUDA|NCCL|CUDNN)$")
    set(backend_missing OFF)
    foreach(line IN LISTS needs_backends)
      string(REGEX REPLACE "^#if !COLTRAIN_WITH_" "" backend "${line}")
      if(NOT COLTRAIN_WITH_${backend}_ENABLED)
        set(backend_missing ON)
      endif()
    endforeach()
    if(backend_missing)
      continue()
    endif()
    file(RELATIVE_PATH relative "${include_root}" "${header}")
    string(REGEX REPLACE "\\.[^.]+$" "" stem "${relative}")
    set(content "#include <${relative}>\n#include <${relative}>\nint main() { return 0; }\n")
    if(header MATCHES "\\.cuh$")
      if(CMAKE_CUDA_COMPILER)
        file(CONFIGURE OUTPUT "${check_dir}/${stem}.cu" CONTENT "${content}")
        # nvcc's device pass alone (-ptx: cicc parses the whole file, host functions included, so
        # a header that misses an include fails there): half the time of -cuda, which runs the
        # same front end a second time for the host (cudafe++; trainer.cuh: 11.4 s against 23.5).
        # mnist_convnet_cuda, compiled completely in every build, includes every .cuh.
        add_test(NAME header.${relative}.nvcc
                 COMMAND ${nvcc} -ptx "${check_dir}/${stem}.cu" -o "${check_dir}/${stem}.ptx")
        set_tests_properties(header.${relative}.nvcc PROPERTIES LABELS headers
                             TIMEOUT ${COLTRAIN_TEST_TIMEOUT})
      endif()
      continue()
    endif()
    # <coltrain/src.hpp> and <coltrain/tensor/src.hpp> are for separate compilation only
    # (core/config.hpp), so each is checked alone, in that mode, and left out of the all-headers
    # files.
    set(separate_only OFF)
    set(mode_flags "")
    if(relative MATCHES "^coltrain/(tensor/)?src[.]hpp$")
      set(separate_only ON)
      set(mode_flags -DCOLTRAIN_SEPARATE_COMPILATION=1)
    endif()
    if(NOT separate_only)
      string(APPEND all_includes "#include <${relative}>\n")
    endif()
    # Any line of code or preprocessor condition: not an umbrella of includes alone.
    file(STRINGS "${header}" code_lines
         REGEX "^[ \t]*([^ \t/#]|#[ \t]*(if|el|endif|define|undef|error|warning|line))")
    if(code_lines)
      set(source "${check_dir}/${stem}.cpp")
      file(CONFIGURE OUTPUT "${source}" CONTENT "${content}")
      add_test(NAME header.${relative}.backends
               COMMAND ${gxx} ${COLTRAIN_HEADER_CHECK_FLAGS} ${mode_flags} "${source}")
      set_tests_properties(header.${relative}.backends PROPERTIES LABELS headers
                           TIMEOUT ${COLTRAIN_TEST_TIMEOUT})
    endif()
    if(NOT needs_backends AND NOT separate_only)
      string(APPEND plain_includes "#include <${relative}>\n")
    endif()
  endforeach()
  file(CONFIGURE OUTPUT "${check_dir}/all_headers_plain.cpp"
       CONTENT "${plain_includes}int main() { return 0; }\n")
  add_test(NAME header.all.plain
           COMMAND ${gxx} -DCOLTRAIN_WITH_MPI=0 -DCOLTRAIN_WITH_CUDA=0 -DCOLTRAIN_WITH_NCCL=0
                   -DCOLTRAIN_WITH_CUDNN=0 "${check_dir}/all_headers_plain.cpp")
  set_tests_properties(header.all.plain PROPERTIES LABELS headers TIMEOUT ${COLTRAIN_TEST_TIMEOUT})
  file(CONFIGURE OUTPUT "${check_dir}/all_headers.cpp" CONTENT "${all_includes}int main() { return 0; }\n")
  add_test(NAME header.all.backends
           COMMAND ${gxx} ${COLTRAIN_HEADER_CHECK_FLAGS} "${check_dir}/all_headers.cpp")
  set_tests_properties(header.all.backends PROPERTIES LABELS headers TIMEOUT ${COLTRAIN_TEST_TIMEOUT})
  # What <coltrain/comm.hpp> brings into a file: no training, tensors or Eigen; and under separate
  # compilation declarations only, without <filesystem>, <fstream>, the JSON library, OpenSSL or
  # any out-of-line definition (issue 45's calling file).
  file(CONFIGURE OUTPUT "${check_dir}/comm_only.cpp"
       CONTENT "#include <coltrain/comm.hpp>\nint main() { return 0; }\n")
  string(REPLACE ";" "|" compiler "${gxx};${COLTRAIN_HEADER_CHECK_FLAGS}")
  set(no_training "coltrain/nn/|coltrain/train/|coltrain/tensor/|coltrain/data/|Eigen/")
  add_test(NAME header.comm.collectives_only
           COMMAND ${CMAKE_COMMAND} "-DCOMPILER=${compiler}" "-DSOURCE=${check_dir}/comm_only.cpp"
                   "-DFORBIDDEN=${no_training}"
                   -P "${PROJECT_SOURCE_DIR}/cmake/CheckIncludedHeaders.cmake")
  add_test(NAME header.comm.separate_declarations
           COMMAND ${CMAKE_COMMAND} "-DCOMPILER=${compiler}|-DCOLTRAIN_SEPARATE_COMPILATION=1"
                   "-DSOURCE=${check_dir}/comm_only.cpp"
                   "-DFORBIDDEN=${no_training}|/filesystem$|/fstream$|coltrain/core/json[.]hpp$|/impl/|openssl/"
                   -P "${PROJECT_SOURCE_DIR}/cmake/CheckIncludedHeaders.cmake")
  set_tests_properties(header.comm.collectives_only header.comm.separate_declarations
                       PROPERTIES LABELS headers TIMEOUT ${COLTRAIN_TEST_TIMEOUT})
  if(CMAKE_CUDA_COMPILER)
    file(CONFIGURE OUTPUT "${check_dir}/all_headers.cu"
         CONTENT "${all_includes}int main() { return 0; }\n")
    # Compiled completely, host compile included, unless the build skips the host compile of GPU
    # code (COLTRAIN_GPU_CHECK_ONLY); mnist_convnet_cuda then compiles the headers completely.
    set(phase -c)
    if(COLTRAIN_GPU_CHECK_ONLY)
      set(phase -cuda)
    endif()
    add_test(NAME header.all.nvcc
             COMMAND ${nvcc} ${phase} "${check_dir}/all_headers.cu" -o "${check_dir}/all_headers.o")
    # One full nvcc run over every header: 64 s alone on the 2-core machine (2026-11-27), over the
    # default limit.
    set_tests_properties(header.all.nvcc PROPERTIES LABELS headers TIMEOUT 240)
  endif()
endfunction()

# coltrain_add_parity_test(NAME n SOURCES s... SCRIPT py [LINK t...])
# Parity with PyTorch: the test "<n>.references" runs `python SCRIPT --out DIR` (PyTorch writes its
# results as safetensors), then every Catch test case in n becomes "<n>.<case>" and compares against DIR,
# found through COLTRAIN_PARITY_DIR. Without a Python that imports torch the suite is one test, "<n>",
# that reports "skipped: PyTorch is not installed" (CTest: skipped), so a missing PyTorch is visible.
function(coltrain_add_parity_test)
  cmake_parse_arguments(ARG "" "NAME;SCRIPT" "SOURCES;LINK" ${ARGN})
  _coltrain_catch_main_library(coltrain_catch_parity_main catch_parity_main.cpp)
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE coltrain::coltrain coltrain_warnings
                                            coltrain_catch_parity_main ${ARG_LINK})
  if(COLTRAIN_PYTHON_HAS_TORCH)
    set(dir "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_references")
    add_test(NAME ${ARG_NAME}.references
             COMMAND "${COLTRAIN_PYTHON}" "${ARG_SCRIPT}" --out "${dir}")
    set_tests_properties(${ARG_NAME}.references PROPERTIES LABELS parity
                         TIMEOUT ${COLTRAIN_TEST_TIMEOUT} FIXTURES_SETUP ${ARG_NAME}_references)
    # One label only: catch_discover_tests would split a list and drop the properties after it.
    catch_discover_tests(${ARG_NAME} TEST_PREFIX "${ARG_NAME}." EXTRA_ARGS --warn NoTests
                         PROPERTIES LABELS parity TIMEOUT ${COLTRAIN_TEST_TIMEOUT}
                                    ENVIRONMENT "COLTRAIN_PARITY_DIR=${dir}"
                                    FIXTURES_REQUIRED ${ARG_NAME}_references)
  else()
    add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
    set_tests_properties(${ARG_NAME} PROPERTIES LABELS parity TIMEOUT ${COLTRAIN_TEST_TIMEOUT}
                                                SKIP_RETURN_CODE ${COLTRAIN_SKIP_RETURN_CODE})
  endif()
endfunction()
