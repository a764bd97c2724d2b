// Writes the fuzz targets' seed corpora, small valid and near-valid inputs, mostly through the
// library's own writers: write_seed_corpora <folder> (tests/fuzz/corpus). Each seed is a few KB at
// most; libFuzzer mutates from them, so a valid seed lets it reach the checks behind the header.

#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/data/cifar10.hpp>
#include <coltrain/data/file_io.hpp>
#include <coltrain/data/idx.hpp>
#include <coltrain/tensor/safetensors.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using namespace coltrain;

std::vector<std::uint8_t> bytes_of(std::string_view text) { return {text.begin(), text.end()}; }

void write(const fs::path& file, const std::vector<std::uint8_t>& bytes,
           data::Compression compression = data::Compression::kNone) {
  data::write_file_atomically(file, bytes, compression);
}

void write_idx(const fs::path& dir) {
  std::vector<std::uint8_t> pixels(2 * 4 * 4);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * 8);
  const std::vector<std::uint8_t> labels = {3, 7};
  data::write_idx_images(dir / "images_2x4x4.idx", 4, 4, pixels);
  data::write_idx_images(dir / "images_2x4x4.idx.gz", 4, 4, pixels, data::Compression::kGzip);
  data::write_idx_labels(dir / "labels_2.idx", labels);
  data::write_idx_labels(dir / "labels_2.idx.gz", labels, data::Compression::kGzip);

  // Near misses: a cut-off payload, a label out of range, a count claiming 2^32 - 1 images.
  std::vector<std::uint8_t> images = data::read_file(dir / "images_2x4x4.idx").bytes;
  write(dir / "images_truncated.idx", {images.begin(), images.end() - 5});
  std::vector<std::uint8_t> huge = images;
  std::memset(huge.data() + 4, 0xff, 4);
  write(dir / "images_huge_count.idx", huge);
  std::vector<std::uint8_t> bad_label = data::read_file(dir / "labels_2.idx").bytes;
  bad_label.back() = 10;
  write(dir / "labels_out_of_range.idx", bad_label);
}

void write_cifar10(const fs::path& dir) {
  auto records = [](std::initializer_list<std::uint8_t> labels) {
    std::vector<std::uint8_t> bytes;
    for (const std::uint8_t label : labels) {
      bytes.push_back(label);
      for (std::size_t i = 1; i < data::kCifar10RecordBytes; ++i)
        bytes.push_back(static_cast<std::uint8_t>(i % 251));
    }
    return bytes;
  };
  write(dir / "one_record.bin", records({6}));
  write(dir / "two_records.bin.gz", records({0, 9}), data::Compression::kGzip);
  write(dir / "label_10.bin", records({10}));
  std::vector<std::uint8_t> partial = records({1});
  partial.resize(partial.size() - 1);
  write(dir / "partial_record.bin", partial);
}

// A safetensors file with the given header text and data section, for the near misses.
std::vector<std::uint8_t> safetensors_bytes(std::string_view header, std::size_t data_bytes) {
  std::vector<std::uint8_t> bytes(8);
  const std::uint64_t length = header.size();
  std::memcpy(bytes.data(), &length, 8);
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_bytes, 0x3c);
  return bytes;
}

void write_safetensors(const fs::path& dir) {
  tensor::SafetensorsWriter writer;
  writer.add("x", {2, 2}, std::vector<float>{1, 2, 3, 4});
  writer.add("step", {}, std::vector<std::int64_t>{12});
  writer.add("h", {3}, std::vector<half>{half(1.0f), half(-2.0f), half(0.5f)});
  writer.add("b", {1, 2}, std::vector<bfloat16>{bfloat16(1.0f), bfloat16(3.0f)});
  writer.add("empty", {0, 4}, std::vector<std::uint8_t>{});
  writer.set_metadata("format", "pt");
  writer.write(dir / "valid.safetensors");

  write(dir / "overlap.safetensors",
        safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          8));
  write(dir / "size_mismatch.safetensors",
        safetensors_bytes(R"({"x":{"dtype":"F64","shape":[3],"data_offsets":[0,16]}})", 16));
  write(dir / "header_too_long.safetensors", safetensors_bytes(R"({"__metadata__":{"k":"v"}})", 0));
  std::vector<std::uint8_t> too_long = data::read_file(dir / "header_too_long.safetensors").bytes;
  too_long[4] = 0xff;  // a header length of about 10^12
  write(dir / "header_too_long.safetensors", too_long);
}

void write_checkpoint(const fs::path& dir) {
  const coltrain::testing::TempDir run("coltrain_seed_checkpoint");
  const train::CheckpointFiles files = fuzz::CheckpointFixture().save(run.path());
  std::vector<std::uint8_t> sidecar = data::read_file(files.sidecar).bytes;
  write(dir / "sidecar.json", sidecar);
  const std::string text(sidecar.begin(), sidecar.end());
  auto replaced = [&](std::string_view from, const std::string& to) {
    std::string edited = text;
    edited.replace(edited.find(from), from.size(), to);
    return bytes_of(edited);
  };
  write(dir / "sidecar_newer_version.json",
        replaced("\"format_version\": 1", "\"format_version\": 2"));
  // The faults fixed in the sidecar parser (train_tests' "A damaged sidecar..." case).
  write(dir / "sidecar_too_deep.json",
        replaced("\"extra\": {}", "\"extra\": " + std::string(70, '[') + std::string(70, ']')));
  write(dir / "sidecar_extra_array.json", replaced("\"extra\": {}", "\"extra\": []"));
  write(dir / "sidecar_epoch_2_64.json",
        replaced("\"epoch\": 1,", "\"epoch\": 18446744073709551615,"));
}

void write_launch_env(const fs::path& dir) {
  write(dir / "torchrun.txt", bytes_of("RANK=5\nWORLD_SIZE=8\nLOCAL_RANK=1\nLOCAL_WORLD_SIZE=4\n"
                                       "MASTER_ADDR=node01\nMASTER_PORT=29501\n"));
  write(dir / "open_mpi.txt",
        bytes_of("OMPI_COMM_WORLD_RANK=2\nOMPI_COMM_WORLD_SIZE=4\nOMPI_COMM_WORLD_LOCAL_RANK=0\n"
                 "OMPI_COMM_WORLD_LOCAL_SIZE=2\n"));
  write(dir / "mpich.txt",
        bytes_of("PMI_RANK=1\nPMI_SIZE=3\nMPI_LOCALRANKID=1\nMPI_LOCALNRANKS=3\n"));
  write(dir / "slurm.txt",
        bytes_of("SLURM_PROCID=3\nSLURM_NTASKS=8\nSLURM_LOCALID=1\n"
                 "SLURM_STEP_NODELIST=gpu[03-04,07],cpu1\nSLURM_JOB_NODELIST=rack[1-2]-n[1-4]\n"));
  write(dir / "nested_launch.txt",
        bytes_of("RANK=5\nWORLD_SIZE=8\nLOCAL_RANK=1\nLOCAL_WORLD_SIZE=4\n"
                 "OMPI_COMM_WORLD_RANK=1\nOMPI_COMM_WORLD_SIZE=2\nSLURM_PROCID=0\n"));
  write(dir / "stale_rank.txt", bytes_of("RANK=0\nWORLD_SIZE=1\nPMI_RANK=2\nPMI_SIZE=4\n"));
}

void write_message_header(const fs::path& dir) {
  comm::MessageHeader header{.collective = comm::Collective::kReduce,
                             .algorithm = comm::Algorithm::kTree,
                             .dtype = DataType::kFloat16,
                             .op = comm::ReduceOp::kMax,
                             .root = 3,
                             .sequence = 41,
                             .count = 1000,
                             .bytes = 4000};
  auto bytes = [](const comm::MessageHeader& h) {
    std::vector<std::uint8_t> out(sizeof h);
    std::memcpy(out.data(), &h, sizeof h);
    return out;
  };
  write(dir / "expected.bin", bytes(header));
  header.count = 999;
  write(dir / "other_count.bin", bytes(header));
  header.magic = 0;
  write(dir / "no_magic.bin", bytes(header));
}

void write_json(const fs::path& dir) {
  // Written by dump(): every kind, the number edges and the escapes, compact and indented.
  const Json value = Json::object(
      {{"null", nullptr},
       {"booleans", Json::array({true, false})},
       {"integers", Json::array({0, -1, std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::uint64_t>::max()})},
       {"floats", Json::array({0.1, -0.0, 1.0, 5e-324, 1e300, -2.5e-7})},
       {"strings", Json::array({"", "\" \\ / \b \f \n \r \t \x01", "caf\xC3\xA9",
                                "\xF0\x9F\x98\x80", std::string("\0", 1)})},
       {"nested", Json::object({{"a", Json::array({Json::object(), Json::array()})},
                                {"b~/c", Json::object({{"d", Json::array({1, 2.5})}})}})}});
  write(dir / "compact.json", bytes_of(value.dump()));
  write(dir / "indented.json", bytes_of(value.dump(2)));
  // What dump() never writes but the grammar allows: escapes of any character, surrogate pairs,
  // exponents, integers beyond 64 bits, whitespace everywhere.
  write(dir / "escapes.json",
        bytes_of(R"([ "\u00e9\u00E9\ud83d\ude00\/" , 1E+2 , -0 , 18446744073709551616 ,)"
                 "\t\r\n 12.5e-3 ]"));
  // More than 32 keys, where duplicates are found by sorting, not key by key.
  std::string many = "{";
  for (int i = 0; i < 40; ++i) many += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  write(dir / "many_keys.json", bytes_of(many + "\"last\":null}"));
  write(dir / "many_keys_duplicate.json", bytes_of(many + "\"k7\":null}"));
  // Near misses: a duplicate key, a lone surrogate, bad UTF-8, a trailing comma, too deep.
  write(dir / "duplicate_key.json", bytes_of(R"({"x":[{"y":1,"y":2}]})"));
  write(dir / "lone_surrogate.json", bytes_of(R"(["\ud800"])"));
  write(dir / "overlong_utf8.json", bytes_of("[\"\xC0\x80\"]"));
  write(dir / "trailing_comma.json", bytes_of("{\"a\":[1,2,],}"));
  write(dir / "too_deep.json", bytes_of(std::string(129, '[') + std::string(129, ']')));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus folder>\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const std::pair<const char*, void (*)(const fs::path&)> targets[] = {
      {"idx", write_idx},
      {"cifar10", write_cifar10},
      {"safetensors", write_safetensors},
      {"checkpoint", write_checkpoint},
      {"launch_env", write_launch_env},
      {"message_header", write_message_header},
      {"json", write_json}};
  for (const auto& [name, write_seeds] : targets) {
    fs::create_directories(root / name);
    write_seeds(root / name);
  }
  return 0;
}
