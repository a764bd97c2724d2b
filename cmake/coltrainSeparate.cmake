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
  set(sources "${source_dir}/separate_compilation.cpp")
  if(with_eigen)
    list(APPEND sources "${source_dir}/separate_compilation_tensor.cpp")
  endif()
  add_library(coltrain_separate STATIC EXCLUDE_FROM_ALL ${sources})
  add_library(coltrain::separate ALIAS coltrain_separate)
  target_link_libraries(coltrain_separate PUBLIC coltrain::coltrain)
  target_compile_definitions(coltrain_separate PUBLIC COLTRAIN_SEPARATE_COMPILATION=1)
endfunction()
