// The one translation unit of coltrain::separate (cmake/coltrainSeparate.cmake).
#include <coltrain/src.hpp>
