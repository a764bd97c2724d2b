// The training half of coltrain::separate (cmake/coltrainSeparate.cmake), where Eigen was found: a
// file of its own, so that a program that only communicates links none of it.
#include <coltrain/tensor/src.hpp>
