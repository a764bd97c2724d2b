// The same program written with plain MPI: the floor scripts/bench_include compares against.
#include <mpi.h>

#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::vector<float> values(1024, 1.0f);
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
