"""What the PyTorch reference runs on, printed with its figures: a reference on Debian's netlib BLAS
(libblas3, the default when no optimised BLAS is installed) is several times slower than on
OpenBLAS, and a ratio against it says nothing about coltrain."""

import ctypes
import os

import torch

_allocator = "glibc malloc, default (freed activations go back to the kernel)"


def blas_library():
    """The BLAS this process has mapped after a matrix product (Debian's torch calls the system
    libblas.so.3, which update-alternatives points at OpenBLAS or at netlib's reference code)."""
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # make sure the library is loaded
    mapped = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "blas" in os.path.basename(path) or "mkl" in os.path.basename(path):
                mapped.add(os.path.realpath(path))
    if not mapped:
        return "none found (a BLAS linked statically into libtorch?)"
    names = []
    for path in sorted(mapped):
        if "openblas" in path:
            names.append(f"OpenBLAS ({path})")
        elif "mkl" in path:
            names.append(f"MKL ({path})")
        elif "/blas/" in path:
            names.append(f"netlib reference BLAS, unoptimised ({path})")
        else:
            names.append(path)
    return "; ".join(names)


def convolution_engine():
    if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled:
        config = torch.__config__.show()
        version = next((part.strip() for part in config.splitlines() if "MKL-DNN" in part), "")
        return "oneDNN" + (f" ({version.lstrip('- ')})" if version else "")
    return "PyTorch's native convolution (im2col + BLAS)"


def keep_freed_memory():
    """Stops glibc from handing freed activations back to the kernel. By default a block above
    malloc's (moving) mmap threshold is unmapped when freed, so a step that frees and reallocates
    its activations faults their pages in again every step: on CifarNet, 2 threads, most processes
    then ran at 700-900 images/s and a few at 1,500-1,900, by chance. PyTorch's CPU tuning guide
    answers this with jemalloc or tcmalloc; glibc's own switches do the same here: a fixed mmap
    threshold at its maximum (32 MiB, above every activation of these models) and no trimming."""
    global _allocator
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    threshold = 32 << 20
    if libc.mallopt(m_mmap_threshold, threshold) != 1 or \
            libc.mallopt(m_trim_threshold, ctypes.c_int(2**31 - 1)) != 1:
        raise RuntimeError("mallopt refused the mmap or trim threshold")
    _allocator = "glibc malloc, mmap threshold 32 MiB, no trimming (freed memory kept for reuse)"


def describe():
    return (f"pytorch {torch.__version__}, {torch.get_num_threads()} threads; "
            f"BLAS: {blas_library()}; convolution: {convolution_engine()}; allocator: {_allocator}")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, help="as the benchmark sets them")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()  # as both benchmarks set it
    print(describe())
