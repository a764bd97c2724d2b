// Linked against the tests' separately compiled library (built for the portable x86-64 width): as
// it is, it links and runs; compiled with -mavx2 its calls name the 32-byte kernels, which that
// library does not hold, so the link fails and names them (tensor/cpu_vector_width.hpp).
#include <coltrain/tensor/cpu_microkernels.hpp>

int main() {
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  float c[4];
  coltrain::tensor::gemm_nn_small_m(2, 2, 2, a, 2, b, 2, c, 2, false);
  // [1 2; 3 4] x [5 6; 7 8] = [19 22; 43 50]
  return c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50 ? 0 : 1;
}
