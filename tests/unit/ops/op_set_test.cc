// The op sets' contract (ops/op_set.h) holds for the CPU op set and refuses a type that lacks a
// kernel; the CUDA op set is checked where GptModel<CudaOps> is instantiated (model/cuda/).
#include "ops/op_set.h"

#include <gtest/gtest.h>

#include "ops/cpu/cpu_ops.h"

namespace myriad {
namespace {

// CpuOps with one kernel hidden: no longer an op set.
struct WithoutAttention : cpu::CpuOps {
  void attention_forward() = delete;
};

static_assert(OpSet<cpu::CpuOps>);
static_assert(!OpSet<WithoutAttention>);
static_assert(!OpSet<int>);

TEST(OpSet, TheCpuOpSetMeetsTheContractAndAMissingKernelDoesNot) {
  EXPECT_TRUE(OpSet<cpu::CpuOps>);
  EXPECT_FALSE(OpSet<WithoutAttention>);
}

}  // namespace
}  // namespace myriad
