"""Builds coltrain_torch, coltrain's collectives as a torch.distributed backend, against the
PyTorch of the Python that runs it (Debian: python3-torch with libtorch-dev for the c10d headers).

    python3 -m pip install --no-build-isolation --no-deps python/coltrain_torch

Offline: everything comes from this repository and the installed PyTorch. The extension compiles
coltrain's headers with the TCP transport (shared memory between ranks of a host), and with CUDA
when PyTorch has it; a libcrypto found on the system authenticates the connections with
COLTRAIN_AUTH_TOKEN/COLTRAIN_AUTH_FILE.
"""
import ctypes.util
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

here = os.path.dirname(os.path.abspath(__file__))
include = os.environ.get("COLTRAIN_INCLUDE_DIR", os.path.join(here, "..", "..", "include"))

with_openssl = os.path.exists("/usr/include/openssl/hmac.h") and ctypes.util.find_library("crypto")
# A PyTorch with CUDA: CUDA tensors go through coltrain's staged device collectives (CUDA runtime
# only, compiled by the host compiler; no nvcc, no NCCL).
with_cuda = torch.version.cuda is not None and CUDA_HOME is not None
macros = [("COLTRAIN_WITH_MPI", "0"), ("COLTRAIN_WITH_CUDA", "1" if with_cuda else "0"),
          ("COLTRAIN_TORCH_WITH_CUDA", "1" if with_cuda else "0"), ("COLTRAIN_WITH_NCCL", "0"),
          ("COLTRAIN_WITH_CUDNN", "0"), ("COLTRAIN_WITH_OPENSSL", "1" if with_openssl else "0")]
Extension = CUDAExtension if with_cuda else CppExtension

setup(
    name="coltrain_torch",
    version="0.1.0",
    description="coltrain's collectives as a torch.distributed backend",
    packages=["coltrain_torch"],
    ext_modules=[
        Extension(
            "coltrain_torch._coltrain",
            ["csrc/process_group.cpp"],
            include_dirs=[os.path.abspath(include)],
            define_macros=macros,
            libraries=["crypto"] if with_openssl else [],
            # PyTorch 1.13's headers use std::iterator and std::is_pod, deprecated in C++20.
            # -g0 overrides Python's -g: debug information for PyTorch's templates took a third
            # of the compile (74 s against 50 s on the 2-core machine) and most of the module.
            extra_compile_args=["-std=c++20", "-O2", "-g0", "-Wno-deprecated-declarations"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
