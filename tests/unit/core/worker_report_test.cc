// The records a worker gives its launcher (core/worker_report.h): each decodes to what was
// encoded, and a field of the wrong type is an error naming it.
#include "core/worker_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace myriad {
namespace {

TEST(WorkerReport, AFaultRecordRoundTripsEveryKind) {
  for (int k = 0; k <= static_cast<int>(FaultKind::kLost); ++k) {
    FaultRecord f;
    f.kind = static_cast<FaultKind>(k);
    f.cls = ErrorClass::kNumerics, f.rank = 3, f.node = 1, f.step = 42, f.detail = "step 42: loss is nan";
    f.evict = k % 2 == 1;
    EXPECT_EQ(decode_fault(nlohmann::json::parse(encode(f).dump())), f) << kind_name(f.kind);
    EXPECT_EQ(kind_from_name(kind_name(f.kind)), f.kind);
  }
  EXPECT_FALSE(kind_from_name("meteor"));
  EXPECT_THROW(decode_fault({{"kind", "meteor"}}), Error);
  EXPECT_THROW(decode_fault({{"step", "five"}}), Error);
}

TEST(WorkerReport, AnErrorBecomesTheRecordOfItsKind) {
  const FaultRecord loss = fault_of(nonfinite_loss(7, NAN), 1);
  EXPECT_EQ(loss.kind, FaultKind::kLoss);
  EXPECT_EQ(loss.cls, ErrorClass::kNumerics);
  EXPECT_EQ(loss.step, 7);
  EXPECT_EQ(loss.rank, 1);
  EXPECT_EQ(loss.detail.rfind("step 7: loss is nan", 0), 0u) << loss.detail;
  // An sdc names the rank whose copy differs, whoever raised it.
  const FaultRecord sdc = fault_of(FaultError(FaultKind::kSdc, ErrorClass::kRuntime, 6, "corrupt", 2), 0);
  EXPECT_EQ(sdc.kind, FaultKind::kSdc);
  EXPECT_EQ(sdc.rank, 2);
  EXPECT_EQ(sdc.step, 6);
  EXPECT_EQ(fault_of(Error(ErrorClass::kComm, "timed out"), 0).kind, FaultKind::kComm);
  EXPECT_EQ(fault_of(Error(ErrorClass::kRuntime, "disk full"), 0).kind, FaultKind::kCrash);
}

TEST(WorkerReport, AHeartbeatRoundTripsAndNamesABadField) {
  HeartbeatRecord h;
  h.beat = 12, h.step = 40, h.phase = "backward", h.allowance_s = 60, h.own_ms = 51.5, h.step_ms = 53;
  h.tokens_per_s = 9650, h.steps_run = 3, h.first_step = 38, h.first_step_unix_s = 1764835200.5, h.resumed_from = "ck/step_00000037";
  h.started = OpRef{"dp0", "reduce_scatter", 88, 85, 41, -1};
  h.finished = OpRef{"pp0", "send", 87, 60, 41, 3};
  h.groups = {{"tp0", "all_reduce", "done", 60}, {"batch.tp0", "take", "running", 41}};
  const HeartbeatRecord back = decode_heartbeat(nlohmann::json::parse(encode(h).dump()));
  EXPECT_EQ(encode(back), encode(h));
  EXPECT_EQ(back.finished->peer, 3);
  EXPECT_EQ(back.groups[1].state, "running");
  auto error_of = [](const nlohmann::json& j) {
    try {
      decode_heartbeat(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of({{"step", "five"}}), "step must be an integer, got \"five\"");
  EXPECT_EQ(error_of({{"finished", {{"match", -1}}}}), "finished.match must be a non-negative integer, got -1");
  EXPECT_EQ(error_of({{"groups", {7}}}), "groups[0] must be an object, got 7");
  EXPECT_EQ(error_of(nlohmann::json::array()), "the file must be an object, got []");
}

TEST(WorkerReport, RecordsAreReadFromTheirFilesOrNotAtAll) {
  const std::string path = (std::filesystem::temp_directory_path() / cat("myriad_report_", getpid())).string();
  EXPECT_FALSE(read_fault_record(path));
  FaultRecord f;
  f.kind = FaultKind::kSdc, f.rank = 1, f.step = 6, f.detail = "corrupt";
  ASSERT_TRUE(write_record(path, encode(f)));
  EXPECT_EQ(read_fault_record(path), f);
  std::ofstream(path) << "{\"kind\": ";  // cut: not a record
  EXPECT_FALSE(read_fault_record(path));
  EXPECT_FALSE(read_heartbeat(path));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace myriad
