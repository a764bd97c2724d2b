# FindCUDNN: locates NVIDIA cuDNN.
#
# Hints: CUDNN_ROOT (CMake or environment variable), then the CUDA toolkit's own directories. Python wheels
# (nvidia-cudnn-cu*) ship only libcudnn.so.9, so versioned names are searched too.
#
# Result: CUDNN_FOUND, CUDNN_VERSION, CUDNN_INCLUDE_DIRS, CUDNN_LIBRARIES and the imported target
# CUDNN::cudnn.

set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()

find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 libcudnn.so.8
             HINTS ${_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

# cuDNN 8 and later keep the version in cudnn_version.h; older releases in cudnn.h.
foreach(_header cudnn_version.h cudnn.h)
  if(NOT CUDNN_VERSION AND CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/${_header}")
    file(STRINGS "${CUDNN_INCLUDE_DIR}/${_header}" _cudnn_version_lines
         REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)[ \t]+[0-9]+")
    if(_cudnn_version_lines)
      foreach(_part MAJOR MINOR PATCHLEVEL)
        string(REGEX REPLACE ".*#define CUDNN_${_part}[ \t]+([0-9]+).*" "\\1" _cudnn_${_part}
               "${_cudnn_version_lines}")
      endforeach()
      set(CUDNN_VERSION "${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL}")
    endif()
  endif()
endforeach()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
                                  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND)
  set(CUDNN_INCLUDE_DIRS "${CUDNN_INCLUDE_DIR}")
  set(CUDNN_LIBRARIES "${CUDNN_LIBRARY}")
  if(NOT TARGET CUDNN::cudnn)
    add_library(CUDNN::cudnn UNKNOWN IMPORTED)
    set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
                                                  INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
