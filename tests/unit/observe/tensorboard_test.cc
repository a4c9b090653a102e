// TensorBoard event files: the bytes against the TFRecord and protobuf specifications (not only
// against our own reader), the checksums, and a round trip.
#include "observe/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "observe/metrics.h"

namespace fs = std::filesystem;

namespace myriad {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The check value every CRC-32C implementation must give (RFC 3720, appendix B.4).
TEST(TensorBoard, Crc32cOfTheStandardCheckString) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

// The file version, then a session START at the first step (2), then an event with the scalar
// "a" = 1.0 at step 3, which by the protobuf wire format is
//   09 <wall_time, 8 bytes>  10 03  2a 0a  [0a 08 [0a 01 'a' 15 00 00 80 3f]]
// each framed as a TFRecord: length, its masked CRC, the data, its masked CRC.
TEST(TensorBoard, BytesFollowTheSpecifications) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_tb_", getpid());
  std::string path;
  {
    TensorBoardWriter w(dir.string(), 2);
    w.write(3, {{"a", 1.0}});
    path = w.path();
  }
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  const std::string b = slurp(path);
  // The first record: the file version.
  uint64_t n0 = 0;
  std::memcpy(&n0, b.data(), 8);
  ASSERT_EQ(n0, 9u + 2 + 15);  // wall_time, step 0, file_version "brain.Event:2"
  EXPECT_EQ(b.substr(12 + 9, 2), std::string("\x10\x00", 2));
  EXPECT_EQ(b.substr(12 + 11, 15), std::string("\x1a\x0d") + "brain.Event:2");
  // The second: SessionLog{status: START} at step 2 (Event.session_log is field 7; 6 is the
  // deprecated log_message, which TensorBoard ignores: a real TensorBoard caught that).
  const size_t at1 = 12 + n0 + 4;
  uint64_t n1 = 0;
  std::memcpy(&n1, b.data() + at1, 8);
  ASSERT_EQ(n1, 9u + 2 + 4);
  EXPECT_EQ(b.substr(at1 + 12 + 9, 6), std::string("\x10\x02\x3a\x02\x08\x01", 6));
  // The third: the scalar.
  const size_t at = at1 + 12 + n1 + 4;
  uint64_t n = 0;
  std::memcpy(&n, b.data() + at, 8);
  const std::string data = b.substr(at + 12, n);
  ASSERT_EQ(data.size(), 9u + 2 + 12);
  EXPECT_EQ(data[0], '\x09');
  EXPECT_EQ(data.substr(9), std::string("\x10\x03\x2a\x0a\x0a\x08\x0a\x01" "a" "\x15\x00\x00\x80\x3f", 14));
  auto masked = [](const std::string& s) {
    const uint32_t c = crc32c(s.data(), s.size());
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
  };
  uint32_t len_crc = 0, data_crc = 0;
  std::memcpy(&len_crc, b.data() + at + 8, 4);
  std::memcpy(&data_crc, b.data() + at + 12 + n, 4);
  EXPECT_EQ(len_crc, masked(b.substr(at, 8)));
  EXPECT_EQ(data_crc, masked(data));
  EXPECT_EQ(b.size(), at + 12 + n + 4);
  fs::remove_all(dir);
}

TEST(TensorBoard, ScalarsReadBackAndDamageIsNamed) {
  const fs::path dir = fs::temp_directory_path() / cat("myriad_tb2_", getpid());
  std::string path;
  {
    TensorBoardWriter w(dir.string(), 1);
    for (int64_t s = 1; s <= 300; ++s) w.write(s, {{"lm loss", 10.0 / double(s)}, {"learning-rate", 3e-4}});
    path = w.path();
  }
  const std::vector<TensorBoardScalar> got = read_tensorboard(path);
  ASSERT_EQ(got.size(), 600u);
  EXPECT_EQ(got[0].tag, "lm loss");
  EXPECT_EQ(got[0].step, 1);
  EXPECT_EQ(got[598].step, 300);  // a step past 127 takes a 2-byte varint
  EXPECT_EQ(got[598].value, float(10.0 / 300));
  EXPECT_EQ(got[599].tag, "learning-rate");
  EXPECT_EQ(got[599].value, float(3e-4));
  EXPECT_GT(got[0].wall_time, 1.7e9);
  // One byte changed in a record: its checksum names the file.
  std::string b = slurp(path);
  b[b.size() - 10] ^= 1;
  std::ofstream(path, std::ios::binary) << b;
  try {
    read_tensorboard(path);
    ADD_FAILURE() << "a damaged record was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum does not match"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace myriad

namespace {

// Every key of a metrics.jsonl record reaches TensorBoard under the tag users know from
// Megatron-LM (iteration time in seconds), at the record's step, and a skipped step's record
// (no loss) writes no scalar.
TEST(TensorBoard, EveryMetricKeyIsWrittenUnderItsTag) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / myriad::cat("myriad_tb_tags_", getpid());
  std::filesystem::create_directories(dir);
  const nlohmann::json record = {{"step", 7}, {"loss", 2.5}, {"val_loss", 2.75}, {"lr", 3e-4}, {"grad_norm", 0.8},
                                 {"step_ms", 250.0}, {"tokens_per_s", 65536.0}, {"mfu", 0.59}, {"forward_ms", 80.0},
                                 {"backward_ms", 150.0}, {"bubble_ms", 12.0}, {"dp_wait_ms", 3.0},
                                 {"optimizer_ms", 9.0}, {"peak_memory_gib", 49.5}};
  {
    myriad::MetricsWriter w((dir / "metrics.jsonl").string(), 0, (dir / "tb").string());
    w.write(record);
    w.write({{"step", 8}, {"skipped", true}});
  }
  const std::map<std::string, std::pair<std::string, double>> expect = {
      {"lm loss", {"loss", 1}}, {"lm loss validation", {"val_loss", 1}}, {"learning-rate", {"lr", 1}},
      {"grad-norm", {"grad_norm", 1}}, {"iteration-time", {"step_ms", 1e-3}},
      {"throughput/tokens_per_s", {"tokens_per_s", 1}}, {"throughput/mfu", {"mfu", 1}},
      {"phase/forward_ms", {"forward_ms", 1}}, {"phase/backward_ms", {"backward_ms", 1}},
      {"phase/bubble_ms", {"bubble_ms", 1}}, {"phase/dp_wait_ms", {"dp_wait_ms", 1}},
      {"phase/optimizer_ms", {"optimizer_ms", 1}}, {"memory/peak_gib", {"peak_memory_gib", 1}}};
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir / "tb")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  std::map<std::string, int> seen;
  for (const myriad::TensorBoardScalar& s : myriad::read_tensorboard(files[0].string())) {
    ASSERT_TRUE(expect.count(s.tag)) << "unexpected tag " << s.tag;
    EXPECT_EQ(s.step, 7) << s.tag;
    const auto& [key, scale] = expect.at(s.tag);
    EXPECT_EQ(s.value, float(record[key].get<double>() * scale)) << s.tag;
    ++seen[s.tag];
  }
  EXPECT_EQ(seen.size(), expect.size());
  for (const auto& [tag, n] : seen) EXPECT_EQ(n, 1) << tag;
  std::filesystem::remove_all(dir);
}

}  // namespace
