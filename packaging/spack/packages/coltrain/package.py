# Spack recipe for coltrain. From a clone of the repository:
#   spack repo add packaging/spack
#   spack dev-build coltrain@develop +mpi          # or +cuda cuda_arch=90 +nccl +cudnn
# (no release tarball is published yet, so `develop` builds the clone it is run in). The library is
# header-only: what gets installed is the headers, the CMake package (find_package(coltrain)) and a
# pkg-config file; the variants choose which backends its CMake target carries.

from spack.package import *


class Coltrain(CMakePackage, CudaPackage):
    """Header-only C++20 collectives (ring, tree, halving-doubling and hierarchical allreduce over
    MPI, NCCL and its own TCP transport) and data-parallel training for HPC clusters."""

    maintainers("coltrain")
    license("BSD-3-Clause")

    version("develop")

    variant("mpi", default=True, description="MPI backend (coltrain::coltrain links MPI::MPI_CXX)")
    variant("nccl", default=False, when="+cuda", description="NCCL backend for device buffers")
    variant("cudnn", default=False, when="+cuda", description="cuDNN convolutions on GPUs")
    variant("openssl", default=True, description="authenticated TCP rendezvous (libcrypto)")

    depends_on("cmake@3.25:", type="build")
    depends_on("eigen@3.3:")
    depends_on("zlib-api")
    depends_on("mpi", when="+mpi")
    depends_on("openssl", when="+openssl")
    depends_on("nccl", when="+nccl")
    depends_on("cudnn@9:", when="+cudnn")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define_from_variant("COLTRAIN_WITH_MPI", "mpi"),
            self.define_from_variant("COLTRAIN_WITH_CUDA", "cuda"),
            self.define("COLTRAIN_WITH_NCCL", spec.satisfies("+nccl")),
            self.define("COLTRAIN_WITH_CUDNN", spec.satisfies("+cudnn")),
            # The library installs alone; its tests, samples and benchmarks stay in the clone.
            self.define("COLTRAIN_BUILD_TESTS", False),
            self.define("COLTRAIN_BUILD_SAMPLES", False),
            self.define("COLTRAIN_BUILD_BENCHMARKS", False),
        ]
        if spec.satisfies("+mpi"):
            args.append(self.define("MPI_CXX_COMPILER", spec["mpi"].mpicxx))
        if spec.satisfies("+cuda"):
            args.append(self.define("CMAKE_CUDA_ARCHITECTURES", spec.variants["cuda_arch"].value))
        if spec.satisfies("+nccl"):
            args.append(self.define("NCCL_ROOT", spec["nccl"].prefix))
        if spec.satisfies("+cudnn"):
            args.append(self.define("CUDNN_ROOT", spec["cudnn"].prefix))
        return args
