// Checkpoint sidecars (train/checkpoint.hpp): the fuzz input replaces the JSON sidecar of a real
// checkpoint (checkpoint_fixture.hpp), then load_checkpoint reads it, checks it against a freshly
// built network and optimizer and loads the two safetensors files it names; find_latest_checkpoint
// scans the folder. Bad input must be an IoError (damaged checkpoint) or InvalidArgument (one that
// does not fit the network).

#include <coltrain/core/error.hpp>
#include <coltrain/train/checkpoint.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "checkpoint_fixture.hpp"
#include "fuzz_support.hpp"

namespace {

// The fixture's checkpoint, saved once per process.
const coltrain::train::CheckpointFiles& saved_checkpoint() {
  static const coltrain::train::CheckpointFiles files =
      coltrain::fuzz::CheckpointFixture().save(coltrain::fuzz::scratch_dir());
  return files;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using coltrain::fuzz::fuzz_check;
  const std::filesystem::path sidecar = saved_checkpoint().sidecar;
  coltrain::fuzz::write_input(sidecar.filename().string(), data, size);
  coltrain::fuzz::CheckpointFixture run;
  try {
    const coltrain::train::TrainingState state =
        coltrain::train::load_checkpoint(sidecar, run.net, run.optimizer);
    static_cast<void>(state);
  } catch (const coltrain::IoError&) {
  } catch (const coltrain::InvalidArgument&) {
  }
  try {
    const auto latest = coltrain::train::find_latest_checkpoint(sidecar.parent_path());
    fuzz_check(!latest || latest->sidecar == sidecar, "checkpoint: the only sidecar is the latest");
  } catch (const coltrain::IoError&) {
  }
  return 0;
}
