// The checkpoint directory's rules, on real files: leftovers of failed or killed saves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace myriad;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / cat("myriad_ckpt_unit_", getpid(), "_", ::testing::UnitTest::GetInstance()->random_seed());
  TempDir() { fs::remove_all(path), fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<float> saved_values(const std::string& dir) {
  std::vector<float> out(4);
  checkpoint::load(dir, checkpoint::read_meta(dir), {{"x", {4}, {0}, {4}, out.data()}});
  return out;
}

// A save killed between moving the committed step_X aside and putting its new step_X in place
// leaves step_X.replaced: the next start puts it back instead of deleting it.
TEST(CheckpointLeftovers, AReplacedCheckpointWithoutItsSuccessorIsRestored) {
  TempDir t;
  std::vector<float> x = {1, 2, 3, 4};
  const std::string dir = checkpoint::save(t.path.string(), 4, nlohmann::json::object(), {{"x", {4}, {0}, {4}, x.data()}});
  fs::rename(dir, dir + ".replaced");
  fs::create_directories(t.path / "step_00000004.77.partial");
  checkpoint::remove_leftovers(t.path.string());
  ASSERT_EQ(checkpoint::latest(t.path.string()), dir);
  EXPECT_EQ(saved_values(dir), x);
  EXPECT_FALSE(fs::exists(t.path / "step_00000004.77.partial"));
  EXPECT_FALSE(fs::exists(dir + ".replaced"));
}

// prune keeps this start's partial directories of later steps (saves under way on other ranks)
// and removes those of steps already committed (a failed save's) and other starts'.
TEST(CheckpointLeftovers, PruneKeepsOnlyThePartialSavesThatMayBeUnderWay) {
  TempDir t;
  for (const char* name : {"step_00000008.5.partial", "step_00000004.5.partial", "step_00000012.9.partial"})
    fs::create_directories(t.path / name);
  checkpoint::prune(t.path.string(), 0, 0, "5", 6);
  EXPECT_TRUE(fs::exists(t.path / "step_00000008.5.partial"));
  EXPECT_FALSE(fs::exists(t.path / "step_00000004.5.partial"));
  EXPECT_FALSE(fs::exists(t.path / "step_00000012.9.partial"));
}

}  // namespace
