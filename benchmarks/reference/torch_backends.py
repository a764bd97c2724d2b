"""What the PyTorch reference runs on, printed with its figures: a reference on Debian's netlib BLAS
(libblas3, the default when no optimised BLAS is installed) is several times slower than on
OpenBLAS, and a ratio against it says nothing about coltrain."""

import os

import torch


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


def describe():
    return (f"pytorch {torch.__version__}, {torch.get_num_threads()} threads; "
            f"BLAS: {blas_library()}; convolution: {convolution_engine()}")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, help="as the benchmark sets them")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(describe())
