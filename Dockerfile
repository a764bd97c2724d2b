# The images that samples/k8s/*.yaml name, built from this repository (docker or podman):
#
#   docker build --target mnist-convnet -t registry.example.org/coltrain/mnist-convnet:latest .
#   docker build --target mnist-convnet-gpu \
#       -t registry.example.org/coltrain/mnist-convnet-gpu:latest .
#
# Each holds /opt/coltrain/mnist_convnet, built as the manifest's comment says (no MPI: the TCP
# backend rendezvouses through the variables the Kubeflow operator sets), and /opt/coltrain/data,
# the repository's MNIST subset (COLTRAIN_DATA_DIR). The GPU image's base is a build argument:
# --build-arg CUDA_IMAGE=nvidia/cuda:<version>-cudnn-devel-<os> for another CUDA (13.0 or newer).
# tests/packaging/test_containers.py checks that the manifests and this file agree.

ARG DEBIAN_IMAGE=debian:12
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04

# ---- CPU: g++ with Eigen, zlib and libcrypto --------------------------------------------------
FROM ${DEBIAN_IMAGE} AS cpu-build
RUN apt-get update && apt-get install -y --no-install-recommends \
      g++ libeigen3-dev zlib1g-dev libssl-dev libcli11-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY include include
COPY samples samples
RUN mkdir -p /opt/coltrain && g++ -std=c++20 -O3 -march=x86-64-v3 -I include \
      -DCOLTRAIN_WITH_OPENSSL=1 samples/mnist_convnet.cpp -lz -lcrypto -pthread \
      -o /opt/coltrain/mnist_convnet

FROM ${DEBIAN_IMAGE} AS mnist-convnet
RUN apt-get update && apt-get install -y --no-install-recommends zlib1g libssl3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=cpu-build /opt/coltrain/mnist_convnet /opt/coltrain/mnist_convnet
COPY data /opt/coltrain/data
ENV COLTRAIN_DATA_DIR=/opt/coltrain/data
ENTRYPOINT ["/opt/coltrain/mnist_convnet"]

# ---- GPU: nvcc with cuBLAS, cuDNN and NCCL ---------------------------------------------------
FROM ${CUDA_IMAGE} AS gpu-build
RUN apt-get update && apt-get install -y --no-install-recommends \
      g++ libeigen3-dev zlib1g-dev libssl-dev libcli11-dev libnccl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY include include
COPY samples samples
RUN mkdir -p /opt/coltrain && nvcc -x cu -std=c++20 -O3 -arch=sm_90 \
      -DCOLTRAIN_SAMPLE_PRECISION=fp16 -I include -DCOLTRAIN_WITH_OPENSSL=1 \
      samples/mnist_convnet.cpp -lz -lcrypto -lcublas -lcudnn -lnccl \
      -o /opt/coltrain/mnist_convnet

FROM ${CUDA_RUNTIME_IMAGE} AS mnist-convnet-gpu
RUN apt-get update && apt-get install -y --no-install-recommends zlib1g libssl3t64 libnccl2 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=gpu-build /opt/coltrain/mnist_convnet /opt/coltrain/mnist_convnet
COPY data /opt/coltrain/data
ENV COLTRAIN_DATA_DIR=/opt/coltrain/data COLTRAIN_DEVICE=cuda
ENTRYPOINT ["/opt/coltrain/mnist_convnet"]
