// Tests for CUDA device selection (coltrain/core/device_selection.hpp) from every launcher's
// variables, read through detect_launch_env as a job would: no GPU needed, the visible device
// count is an argument.

#include <coltrain/core/device_selection.hpp>

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>

namespace {

using Vars = std::map<std::string, std::string>;
using Catch::Matchers::Contains;

coltrain::LaunchEnv detect(Vars vars) {
  return coltrain::detect_launch_env(coltrain::env_lookup_from(std::move(vars)));
}

int device_for(Vars vars, int visible_devices) {
  return coltrain::select_cuda_device(detect(std::move(vars)), visible_devices);
}

// The message of the ConfigError that selection throws; fails the test when it does not throw one.
std::string config_error_of(Vars vars, int visible_devices) {
  try {
    device_for(std::move(vars), visible_devices);
  } catch (const coltrain::ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return {};
}

// Rank 6 of 8, 4 per node: local rank 2 on the second node, as each launcher writes it.
const Vars kTorchrun{
    {"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"}};
const Vars kOpenMpi{{"OMPI_COMM_WORLD_RANK", "6"},
                    {"OMPI_COMM_WORLD_SIZE", "8"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
const Vars kMpich{
    {"PMI_RANK", "6"}, {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "4"}};
const Vars kSlurm{{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}};

}  // namespace

TEST_CASE("the launcher's local rank is the device", "[device_selection]") {
  for (const Vars& vars : {kTorchrun, kOpenMpi, kMpich, kSlurm}) {
    INFO(vars.begin()->first);
    CHECK(detect(vars).local_rank_from_launcher);
    CHECK(device_for(vars, 4) == 2);
    CHECK(device_for(vars, 8) == 2);  // more devices than ranks: the first ones
  }
}

TEST_CASE("without a local rank (Kubeflow PyTorchJob) the device is the rank modulo the count",
          "[device_selection]") {
  const Vars kubeflow{{"RANK", "6"},
                      {"WORLD_SIZE", "8"},
                      {"MASTER_ADDR", "job-master-0"},
                      {"MASTER_PORT", "23456"}};
  CHECK_FALSE(detect(kubeflow).local_rank_from_launcher);
  CHECK(detect(kubeflow).local_rank == 6);  // the assumption env.hpp keeps
  CHECK(device_for(kubeflow, 4) == 2);
  CHECK(device_for(kubeflow, 8) == 6);
  CHECK(device_for(kubeflow, 3) == 0);
  CHECK(device_for(kubeflow, 1) == 0);
  // MPICH started without Hydra's local rank (srun with PMI): the same rule.
  CHECK(device_for({{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}}, 4) == 1);
}

TEST_CASE("a process started alone uses device 0", "[device_selection]") {
  CHECK_FALSE(detect({}).local_rank_from_launcher);
  CHECK(device_for({}, 1) == 0);
  CHECK(device_for({}, 8) == 0);
}

TEST_CASE("one visible device serves every rank on the node", "[device_selection]") {
  // Slurm's --gpus-per-task=1 leaves each task one device in CUDA_VISIBLE_DEVICES; ranks sharing
  // one device (tests) read the same.
  for (const Vars& vars : {kTorchrun, kOpenMpi, kMpich, kSlurm}) {
    INFO(vars.begin()->first);
    CHECK(device_for(vars, 1) == 0);
  }
}

TEST_CASE("no visible device is an error", "[device_selection]") {
  for (const Vars& vars : {Vars{}, kTorchrun, kSlurm}) {
    const std::string message = config_error_of(vars, 0);
    CHECK_THAT(message, Contains("no CUDA device is visible"));
    CHECK_THAT(message, Contains("CUDA_VISIBLE_DEVICES"));
    CHECK_THAT(message, Contains("select CUDA device"));
  }
}

TEST_CASE("more ranks per node than devices is an error on every rank of the node",
          "[device_selection]") {
  // Four ranks per node, two devices: local rank 0 fails too, so no rank waits for the others.
  Vars first = kOpenMpi;
  first["OMPI_COMM_WORLD_RANK"] = "4";
  first["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  for (const Vars& vars : {kTorchrun, kOpenMpi, kMpich, first}) {
    INFO(vars.begin()->first);
    const std::string message = config_error_of(vars, 2);
    CHECK_THAT(message, Contains("4 ranks per node"));
    CHECK_THAT(message, Contains("2 visible CUDA devices"));
    CHECK_THAT(message, Contains("--gpus-per-task=1"));
  }
  CHECK_THAT(config_error_of(kMpich, 3), Contains("4 ranks per node (MPICH/Hydra) but 3 visible"));
}

TEST_CASE("a Slurm local rank beyond the devices is an error naming both counts",
          "[device_selection]") {
  // Slurm does not say how many tasks share the node: only the ranks beyond the count can tell.
  const std::string message = config_error_of(kSlurm, 2);
  CHECK_THAT(message, Contains("at least 3 ranks per node (Slurm local rank 2)"));
  CHECK_THAT(message, Contains("2 visible CUDA devices"));
  CHECK_THAT(message, Contains("rank 6"));
  Vars second = kSlurm;
  second["SLURM_LOCALID"] = "1";
  CHECK(device_for(second, 2) == 1);
}

TEST_CASE("a negative device count is an invalid argument", "[device_selection]") {
  CHECK_THROWS_AS(coltrain::select_cuda_device(coltrain::LaunchEnv{}, -1),
                  coltrain::InvalidArgument);
}
