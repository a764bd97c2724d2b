# coltrain::separate: coltrain with separate compilation (include/coltrain/core/config.hpp). Link it
# instead of coltrain::coltrain: every file that includes coltrain is compiled with
# COLTRAIN_SEPARATE_COMPILATION and sees the Communicator's declarations only, and this static library
# compiles <coltrain/src.hpp> once, and <coltrain/tensor/src.hpp> (the CPU products) where Eigen was
# found. Built only when something links it. Used by the source tree and by the installed package
# alike; `source_dir` holds separate_compilation.cpp and separate_compilation_tensor.cpp.
function(coltrain_add_separate_target source_dir with_eigen)
  if(TARGET coltrain_separate)
    return()
  endif()
  coltrain_add_separate_library(coltrain_separate "${source_dir}" "${with_eigen}")
  add_library(coltrain::separate ALIAS coltrain_separate)
endfunction()

# coltrain_add_separate_library(name source_dir with_eigen): the static library behind
# coltrain::separate under another name, for a program that needs it compiled with other flags
# (coltrain's own tests, samples and benchmarks: sanitized, or for this machine's instruction set).
function(coltrain_add_separate_library name source_dir with_eigen)
  set(sources "${source_dir}/separate_compilation.cpp")
  if(with_eigen)
    list(APPEND sources "${source_dir}/separate_compilation_tensor.cpp")
  endif()
  add_library(${name} STATIC EXCLUDE_FROM_ALL ${sources})
  target_link_libraries(${name} PUBLIC coltrain::coltrain)
  target_compile_definitions(${name} PUBLIC COLTRAIN_SEPARATE_COMPILATION=1)
endfunction()
