#pragma once
// Datasets and input pipelines (coltrain::data): MNIST IDX and CIFAR-10 readers, the shipped MNIST
// subset, the distributed sampler, augmentation and normalisation, and the prefetching loader.

#include <coltrain/core/config.hpp>
#include <coltrain/data/cifar10.hpp>
#include <coltrain/data/dataset.hpp>
#include <coltrain/data/epoch_plan.hpp>
#include <coltrain/data/file_io.hpp>
#include <coltrain/data/idx.hpp>
#include <coltrain/data/loader.hpp>
#include <coltrain/data/mnist.hpp>
#include <coltrain/data/random.hpp>
#include <coltrain/data/sampler.hpp>
#include <coltrain/data/transform.hpp>
