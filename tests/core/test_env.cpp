// Tests for launch-environment detection (coltrain/core/env.hpp): each launcher's variables, their
// validation, how the sources are reconciled, and the Slurm host-list parser.

#include <coltrain/core/env.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace {

using Vars = std::map<std::string, std::string>;
using Catch::Matchers::Contains;
using coltrain::Launcher;

coltrain::LaunchEnv detect(Vars vars) {
  return coltrain::detect_launch_env(coltrain::env_lookup_from(std::move(vars)));
}

// The message of the ConfigError that detection throws; fails the test when it does not throw one.
std::string config_error_of(Vars vars) {
  try {
    detect(std::move(vars));
  } catch (const coltrain::ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return {};
}

std::string host_list_error_of(std::string_view list) {
  try {
    coltrain::first_slurm_host(list);
  } catch (const coltrain::ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError for host list \"" << list << "\"");
  return {};
}

}  // namespace

TEST_CASE("name_of names every launcher", "[env]") {
  CHECK(coltrain::name_of(Launcher::kNone) == "none");
  CHECK(coltrain::name_of(Launcher::kTorchrun) == "torchrun");
  CHECK(coltrain::name_of(Launcher::kOpenMpi) == "Open MPI");
  CHECK(coltrain::name_of(Launcher::kMpich) == "MPICH/Hydra");
  CHECK(coltrain::name_of(Launcher::kSlurm) == "Slurm");
}

TEST_CASE("no launcher variables means a single process with default master", "[env]") {
  const Vars cases[] = {{}, {{"PATH", "/usr/bin"}, {"HOME", "/root"}}};
  for (const Vars& vars : cases) {
    const auto env = detect(vars);
    CHECK(env.launcher == Launcher::kNone);
    CHECK(env.rank == 0);
    CHECK(env.world_size == 1);
    CHECK(env.local_rank == 0);
    CHECK(env.local_world_size == 1);
    CHECK(env.master_addr == "127.0.0.1");
    CHECK(env.master_port == 29500);
    CHECK(env.is_root());
  }
}

TEST_CASE("empty variables count as unset", "[env]") {
  const auto env =
      detect({{"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_ADDR", ""}, {"MASTER_PORT", ""}});
  CHECK(env.launcher == Launcher::kNone);
  CHECK(env.world_size == 1);
  CHECK(env.master_addr == "127.0.0.1");
  CHECK(env.master_port == 29500);
}

TEST_CASE("torchrun variables give rank, local rank and master", "[env][torchrun]") {
  const auto env = detect({{"RANK", "5"},
                           {"WORLD_SIZE", "8"},
                           {"LOCAL_RANK", "1"},
                           {"LOCAL_WORLD_SIZE", "4"},
                           {"MASTER_ADDR", "10.0.0.7"},
                           {"MASTER_PORT", "12345"}});
  CHECK(env.launcher == Launcher::kTorchrun);
  CHECK(env.rank == 5);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 4);
  CHECK(env.master_addr == "10.0.0.7");
  CHECK(env.master_port == 12345);
  CHECK_FALSE(env.is_root());
}

TEST_CASE("Kubeflow PyTorchJob env with a master hostname and no local rank", "[env][torchrun]") {
  const auto env = detect({{"RANK", "2"},
                           {"WORLD_SIZE", "3"},
                           {"MASTER_ADDR", "pytorchjob-mnist-master-0"},
                           {"MASTER_PORT", "23456"}});
  CHECK(env.launcher == Launcher::kTorchrun);
  CHECK(env.rank == 2);
  CHECK(env.world_size == 3);
  // Nothing says where the processes run, so one node is assumed.
  CHECK(env.local_rank == 2);
  CHECK(env.local_world_size == 3);
  CHECK(env.master_addr == "pytorchjob-mnist-master-0");
  CHECK(env.master_port == 23456);
}

TEST_CASE("Open MPI variables give rank and local rank", "[env][ompi]") {
  const auto env = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(env.launcher == Launcher::kOpenMpi);
  CHECK(env.rank == 3);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
  CHECK(env.master_addr == "127.0.0.1");
  CHECK(env.master_port == 29500);
}

TEST_CASE("MPICH/Hydra variables give rank and local rank", "[env][mpich]") {
  const auto env = detect({{"PMI_RANK", "0"},
                           {"PMI_SIZE", "6"},
                           {"MPI_LOCALRANKID", "0"},
                           {"MPI_LOCALNRANKS", "3"},
                           {"MASTER_ADDR", "head"}});
  CHECK(env.launcher == Launcher::kMpich);
  CHECK(env.rank == 0);
  CHECK(env.world_size == 6);
  CHECK(env.local_rank == 0);
  CHECK(env.local_world_size == 3);
  CHECK(env.master_addr == "head");
  CHECK(env.is_root());
}

TEST_CASE("Slurm variables with a step node list take the first node as master", "[env][slurm]") {
  const auto env = detect({{"SLURM_PROCID", "6"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "2"},
                           {"SLURM_STEP_NODELIST", "gpu[03-04]"},
                           {"SLURM_JOB_NODELIST", "gpu[01-04]"}});
  CHECK(env.launcher == Launcher::kSlurm);
  CHECK(env.rank == 6);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 2);
  CHECK_FALSE(env.local_world_size.has_value());
  CHECK(env.master_addr == "gpu03");
  CHECK(env.master_port == 29500);
}

// srun --mpi=pmix (an Open MPI binary under Slurm) exports PMIX_RANK but no world size: the ranks
// are Slurm's, and MPI_Init can reach the others, so the automatic backend is MPI.
TEST_CASE("a PMIx server marks an MPI launch, its ranks come from Slurm", "[env][slurm][pmix]") {
  Vars vars{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"PMIX_RANK", "1"}};
  const auto env = detect(vars);
  CHECK(env.launcher == Launcher::kSlurm);
  CHECK(env.rank == 1);
  CHECK(env.world_size == 2);
  CHECK(env.pmix_server);
  CHECK(env.started_by_mpi());
  // Without it, srun's tasks are no MPI launch (srun --mpi=none: the TCP backend).
  vars.erase("PMIX_RANK");
  CHECK_FALSE(detect(vars).started_by_mpi());
  // torchrun's variables are explicit: its workers are not MPI's even inside a PMIx job.
  const auto torchrun = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"PMIX_RANK", "0"}});
  CHECK(torchrun.launcher == Launcher::kTorchrun);
  CHECK_FALSE(torchrun.started_by_mpi());
  CHECK(detect({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}}).started_by_mpi());
  CHECK(detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}).started_by_mpi());
  CHECK_FALSE(detect({}).started_by_mpi());
}

TEST_CASE("Slurm falls back to the job node list, then to localhost", "[env][slurm]") {
  Vars vars{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}};
  CHECK(detect(vars).master_addr == "127.0.0.1");
  vars["SLURM_JOB_NODELIST"] = "a-b-[001-002]";
  CHECK(detect(vars).master_addr == "a-b-001");
  vars["MASTER_ADDR"] = "explicit-host";
  CHECK(detect(vars).master_addr == "explicit-host");
}

TEST_CASE("Slurm reads SLURM_NPROCS when SLURM_NTASKS is unset", "[env][slurm]") {
  CHECK(detect({{"SLURM_PROCID", "1"}, {"SLURM_NPROCS", "4"}}).world_size == 4);
  CHECK(detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NPROCS", "4"}}).world_size ==
        2);
}

TEST_CASE("Slurm without SLURM_LOCALID assumes one node", "[env][slurm]") {
  const auto env = detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
}

TEST_CASE("an salloc shell with SLURM_NTASKS but no SLURM_PROCID runs alone", "[env][slurm]") {
  const auto env = detect({{"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "node[1-2]"}});
  CHECK(env.launcher == Launcher::kNone);
  CHECK(env.world_size == 1);
  CHECK(env.master_addr == "127.0.0.1");
}

TEST_CASE("a source with its rank but not its world size is an error", "[env][partial]") {
  CHECK_THAT(config_error_of({{"RANK", "1"}}),
             Contains("incomplete torchrun") && Contains("RANK=1") && Contains("WORLD_SIZE"));
  CHECK_THAT(config_error_of({{"OMPI_COMM_WORLD_RANK", "0"}}),
             Contains("OMPI_COMM_WORLD_RANK=0") && Contains("OMPI_COMM_WORLD_SIZE"));
  CHECK_THAT(config_error_of({{"PMI_RANK", "2"}}), Contains("PMI_RANK=2") && Contains("PMI_SIZE"));
  CHECK_THAT(config_error_of({{"SLURM_PROCID", "3"}}),
             Contains("SLURM_PROCID=3") && Contains("SLURM_NTASKS") && Contains("SLURM_NPROCS"));
}

TEST_CASE("a source with its world size but not its rank is an error", "[env][partial]") {
  CHECK_THAT(config_error_of({{"WORLD_SIZE", "4"}}),
             Contains("WORLD_SIZE=4") && Contains("RANK is not"));
  CHECK_THAT(config_error_of({{"OMPI_COMM_WORLD_SIZE", "4"}}),
             Contains("OMPI_COMM_WORLD_SIZE=4") && Contains("OMPI_COMM_WORLD_RANK"));
  CHECK_THAT(config_error_of({{"PMI_SIZE", "4"}}), Contains("PMI_SIZE=4") && Contains("PMI_RANK"));
}

TEST_CASE("an incomplete lower-precedence source is still an error", "[env][partial]") {
  CHECK_THAT(config_error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"PMI_RANK", "0"}}),
             Contains("PMI_RANK=0") && Contains("PMI_SIZE"));
}

TEST_CASE("integer values must be whole base-10 numbers", "[env][parse]") {
  CHECK_THAT(config_error_of({{"RANK", "abc"}, {"WORLD_SIZE", "4"}}),
             Contains("not a base-10 integer") && Contains("RANK=abc"));
  CHECK_THAT(config_error_of({{"RANK", "1"}, {"WORLD_SIZE", "4x"}}), Contains("WORLD_SIZE=4x"));
  CHECK_THAT(config_error_of({{"RANK", " 1"}, {"WORLD_SIZE", "4"}}), Contains("RANK= 1"));
  CHECK_THAT(config_error_of({{"RANK", "+1"}, {"WORLD_SIZE", "4"}}), Contains("RANK=+1"));
  CHECK_THAT(config_error_of({{"RANK", "1.0"}, {"WORLD_SIZE", "4"}}), Contains("RANK=1.0"));
  CHECK_THAT(config_error_of({{"RANK", "0x1"}, {"WORLD_SIZE", "4"}}), Contains("RANK=0x1"));
  CHECK_THAT(config_error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2 "}}),
             Contains("OMPI_COMM_WORLD_SIZE=2 "));
}

TEST_CASE("integer values that overflow int are an error", "[env][parse]") {
  CHECK_THAT(config_error_of({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}),
             Contains("out of range") && Contains("WORLD_SIZE=99999999999"));
  CHECK_THAT(config_error_of({{"PMI_RANK", "-99999999999"}, {"PMI_SIZE", "2"}}),
             Contains("PMI_RANK=-99999999999"));
}

TEST_CASE("leading zeros are accepted", "[env][parse]") {
  const auto env = detect({{"RANK", "007"}, {"WORLD_SIZE", "010"}});
  CHECK(env.rank == 7);
  CHECK(env.world_size == 10);
}

TEST_CASE("rank and world size must be in range", "[env][range]") {
  CHECK_THAT(config_error_of({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}),
             Contains("rank must be in") && Contains("RANK=-1") && Contains("WORLD_SIZE=4"));
  CHECK_THAT(config_error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
             Contains("RANK=4") && Contains("WORLD_SIZE=4"));
  CHECK_THAT(config_error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
             Contains("world size must be at least 1") && Contains("WORLD_SIZE=0"));
  CHECK_THAT(config_error_of({{"SLURM_PROCID", "0"}, {"SLURM_NPROCS", "-2"}}),
             Contains("SLURM_NPROCS=-2"));
}

TEST_CASE("local rank and local world size must be in range", "[env][range]") {
  const Vars base{{"RANK", "1"}, {"WORLD_SIZE", "4"}};
  auto with = [&](Vars extra) {
    Vars vars = base;
    vars.insert(extra.begin(), extra.end());
    return vars;
  };
  CHECK_THAT(config_error_of(with({{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})),
             Contains("local rank must be in") && Contains("LOCAL_RANK=2") &&
                 Contains("LOCAL_WORLD_SIZE=2"));
  CHECK_THAT(config_error_of(with({{"LOCAL_RANK", "-1"}, {"LOCAL_WORLD_SIZE", "2"}})),
             Contains("LOCAL_RANK=-1"));
  CHECK_THAT(config_error_of(with({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "0"}})),
             Contains("LOCAL_WORLD_SIZE=0"));
  CHECK_THAT(config_error_of(with({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}})),
             Contains("LOCAL_WORLD_SIZE=8") && Contains("WORLD_SIZE=4"));
  CHECK_THAT(config_error_of(with({{"LOCAL_RANK", "4"}})),
             Contains("LOCAL_RANK=4") && Contains("WORLD_SIZE=4"));
  CHECK_THAT(config_error_of(with({{"LOCAL_RANK", "one"}})), Contains("LOCAL_RANK=one"));
  CHECK_THAT(
      config_error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "2"}}),
      Contains("SLURM_LOCALID=2"));
}

TEST_CASE("MASTER_PORT must be an integer in [1, 65535], or 0 for a published port",
          "[env][port]") {
  CHECK(detect({{"MASTER_PORT", "1"}}).master_port == 1);
  CHECK(detect({{"MASTER_PORT", "65535"}}).master_port == 65535);
  CHECK(detect({{"MASTER_PORT", "0"}}).master_port == 0);
  CHECK(detect({{"MASTER_PORT", "0"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}}).master_port == 0);
  CHECK_THAT(config_error_of({{"MASTER_PORT", "-1"}}),
             Contains("master port") && Contains("MASTER_PORT=-1"));
  CHECK_THAT(config_error_of({{"MASTER_PORT", "65536"}}), Contains("MASTER_PORT=65536"));
  CHECK_THAT(config_error_of({{"MASTER_PORT", "-80"}}), Contains("MASTER_PORT=-80"));
  CHECK_THAT(config_error_of({{"MASTER_PORT", "29500abc"}}),
             Contains("not a base-10 integer") && Contains("MASTER_PORT=29500abc"));
  CHECK_THAT(config_error_of({{"MASTER_PORT", "99999999999999999999"}}),
             Contains("MASTER_PORT=99999999999999999999"));
}

TEST_CASE("under torchrun's static rendezvous the port above its agent's store is used",
          "[env][port][torchrun]") {
  CHECK(detect({{"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}}).master_port ==
        29501);
  CHECK(detect({{"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}}).master_port ==
        29500);  // c10d rendezvous (--standalone): the port is free
  CHECK(detect({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}).master_port == 29501);
  CHECK_THAT(config_error_of({{"MASTER_PORT", "65535"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}}),
             Contains("MASTER_PORT=65535"));
}

TEST_CASE("sources that agree on rank and world size are accepted", "[env][agree]") {
  const auto env = detect({{"RANK", "2"},
                           {"WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_RANK", "2"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"PMI_RANK", "2"},
                           {"PMI_SIZE", "4"}});
  CHECK(env.launcher == Launcher::kTorchrun);
  CHECK(env.rank == 2);
}

TEST_CASE("equal world sizes with different ranks is an error naming both", "[env][agree]") {
  CHECK_THAT(config_error_of({{"RANK", "1"},
                              {"WORLD_SIZE", "4"},
                              {"OMPI_COMM_WORLD_RANK", "2"},
                              {"OMPI_COMM_WORLD_SIZE", "4"}}),
             Contains("disagree") && Contains("RANK=1") && Contains("OMPI_COMM_WORLD_RANK=2"));
  CHECK_THAT(config_error_of({{"OMPI_COMM_WORLD_RANK", "0"},
                              {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"PMI_RANK", "1"},
                              {"PMI_SIZE", "2"}}),
             Contains("OMPI_COMM_WORLD_RANK=0") && Contains("PMI_RANK=1"));
}

TEST_CASE("stale RANK and WORLD_SIZE under mpiexec are an error", "[env][agree]") {
  // The shell kept RANK=0 WORLD_SIZE=1 from an earlier run; mpiexec then started 4 processes.
  const std::string message =
      config_error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"PMI_RANK", "3"}, {"PMI_SIZE", "4"}});
  CHECK_THAT(message, Contains("fewer processes") && Contains("stale") &&
                          Contains("WORLD_SIZE=1") && Contains("PMI_SIZE=4"));
}

TEST_CASE("torchrun nested under Open MPI with a multiple world size is accepted", "[env][agree]") {
  // mpiexec starts one torchrun per node on 2 nodes; torchrun starts 4 workers on each.
  const auto env = detect({{"RANK", "5"},
                           {"WORLD_SIZE", "8"},
                           {"LOCAL_RANK", "1"},
                           {"LOCAL_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_RANK", "1"},
                           {"OMPI_COMM_WORLD_SIZE", "2"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  CHECK(env.launcher == Launcher::kTorchrun);
  CHECK(env.rank == 5);
  CHECK(env.world_size == 8);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 4);
}

TEST_CASE("a nested world size that is not a multiple is an error", "[env][agree]") {
  CHECK_THAT(
      config_error_of({{"RANK", "5"},
                       {"WORLD_SIZE", "6"},
                       {"OMPI_COMM_WORLD_RANK", "1"},
                       {"OMPI_COMM_WORLD_SIZE", "4"}}),
      Contains("not a multiple") && Contains("WORLD_SIZE=6") && Contains("OMPI_COMM_WORLD_SIZE=4"));
}

TEST_CASE("mpiexec inside a Slurm allocation ignores the inherited SLURM_PROCID", "[env][slurm]") {
  const auto env = detect({{"SLURM_PROCID", "0"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "0"},
                           {"SLURM_JOB_NODELIST", "node[01-02]"},
                           {"PMI_RANK", "3"},
                           {"PMI_SIZE", "4"}});
  CHECK(env.launcher == Launcher::kMpich);
  CHECK(env.rank == 3);
  CHECK(env.world_size == 4);
  // The inherited SLURM_LOCALID is the batch step's, not this process's.
  CHECK(env.local_rank == 3);
  // The node list is only consulted when Slurm launched the processes.
  CHECK(env.master_addr == "127.0.0.1");
}

TEST_CASE("mpiexec in a batch script without --ntasks ignores a lone SLURM_PROCID",
          "[env][slurm]") {
  const auto env = detect({{"SLURM_PROCID", "0"},
                           {"SLURM_LOCALID", "0"},
                           {"OMPI_COMM_WORLD_RANK", "1"},
                           {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK(env.launcher == Launcher::kOpenMpi);
  CHECK(env.rank == 1);
}

TEST_CASE("local rank comes from another source that counts the same processes", "[env][local]") {
  const auto env = detect({{"RANK", "3"},
                           {"WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_RANK", "3"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(env.launcher == Launcher::kTorchrun);
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
}

TEST_CASE("local rank without a local size leaves the local world size unknown", "[env][local]") {
  const auto env = detect({{"RANK", "3"},
                           {"WORLD_SIZE", "4"},
                           {"PMI_RANK", "3"},
                           {"PMI_SIZE", "4"},
                           {"MPI_LOCALRANKID", "1"}});
  CHECK(env.local_rank == 1);
  CHECK_FALSE(env.local_world_size.has_value());
}

TEST_CASE("the chosen source's local rank wins over other sources", "[env][local]") {
  const auto env = detect({{"OMPI_COMM_WORLD_RANK", "3"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                           {"PMI_RANK", "3"},
                           {"PMI_SIZE", "4"},
                           {"MPI_LOCALRANKID", "0"}});
  CHECK(env.launcher == Launcher::kOpenMpi);
  CHECK(env.local_rank == 1);
}

TEST_CASE("an outer launch's local rank is not used for a nested launch", "[env][local]") {
  const auto env = detect({{"RANK", "5"},
                           {"WORLD_SIZE", "8"},
                           {"OMPI_COMM_WORLD_RANK", "1"},
                           {"OMPI_COMM_WORLD_SIZE", "2"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  CHECK(env.local_rank == 5);
  CHECK(env.local_world_size == 8);
}

TEST_CASE("errors carry the detect launch environment operation", "[env][error]") {
  try {
    detect({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
    FAIL("expected a ConfigError");
  } catch (const coltrain::ConfigError& e) {
    CHECK(e.context().operation == "detect launch environment");
    CHECK_THAT(e.message(), Catch::Matchers::StartsWith("not a base-10 integer: RANK=x"));
    CHECK_THAT(std::string(e.what()), Contains("[operation detect launch environment]"));
  }
}

TEST_CASE("first_slurm_host reads compressed host lists", "[env][nodelist]") {
  CHECK(coltrain::first_slurm_host("node01") == "node01");
  CHECK(coltrain::first_slurm_host("node[01-04,07]") == "node01");
  CHECK(coltrain::first_slurm_host("gpu[3-5],cpu1") == "gpu3");
  CHECK(coltrain::first_slurm_host("a-b-[001-002]") == "a-b-001");
  CHECK(coltrain::first_slurm_host("node[007]") == "node007");
  CHECK(coltrain::first_slurm_host("node[10,2-3]") == "node10");
  CHECK(coltrain::first_slurm_host("cpu1,gpu[3-5]") == "cpu1");
  CHECK(coltrain::first_slurm_host("rack[1-2]-n[08-09]") == "rack1-n08");
  CHECK(coltrain::first_slurm_host("n[1-2]x,m[3-4]y") == "n1x");
  CHECK(coltrain::first_slurm_host("host.example.com") == "host.example.com");
  CHECK(coltrain::first_slurm_host("node[0-99999999999999]") == "node0");
}

TEST_CASE("first_slurm_host rejects malformed host lists", "[env][nodelist]") {
  const char* malformed[] = {"",         "node[",       "node[01-",    "node]",    "node[]",
                             "node[a]",  "node[4-2]",   "node[1,]",    "node[,1]", "node[1-]",
                             "node[-1]", "node[1-2-3]", "node[[1]]",   ",node1",   "node1,",
                             "n1,,n2",   "node 1",      "node[1 - 2]", "n[1]]",    "n[1-2],m["};
  for (const char* list : malformed) {
    INFO("host list \"" << list << "\"");
    CHECK_THAT(host_list_error_of(list),
               Contains("malformed Slurm host list") && Contains("\"" + std::string(list) + "\""));
  }
}

TEST_CASE("a malformed Slurm node list names its variable", "[env][nodelist]") {
  CHECK_THAT(
      config_error_of(
          {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_NODELIST", "node[01-"}}),
      Contains("malformed Slurm host list") && Contains("SLURM_STEP_NODELIST=node[01-"));
  CHECK_THAT(
      config_error_of(
          {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_NODELIST", "gpu[5-3]"}}),
      Contains("SLURM_JOB_NODELIST=gpu[5-3]"));
}

TEST_CASE("process_env_lookup reads the process environment", "[env]") {
  static_assert(std::is_same_v<decltype(coltrain::detect_launch_env()), coltrain::LaunchEnv>);
  const char* name = "COLTRAIN_TEST_ENV_PROBE";
  const auto lookup = coltrain::process_env_lookup();
  REQUIRE(::setenv(name, "probe-value", 1) == 0);
  CHECK(lookup(name) == std::optional<std::string>("probe-value"));
  REQUIRE(::unsetenv(name) == 0);
  CHECK_FALSE(lookup(name).has_value());
}
