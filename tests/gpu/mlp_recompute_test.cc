// The MLP projection's backward without its input: linear_backward recomputes the activation's
// output from the fc GEMM's (GptModel keeps fc only). Against the same backward given the
// forward's own output, on the CUDA op set:
// - SwiGLU (Myriad's kernel in both directions): the weight gradient and the input gradient are
//   the same bits;
// - GELU in bf16, whose forward took cuBLASLt's epilogue and whose recompute takes Myriad's
//   kernel: the two activations may differ in a last bit, so the weight gradient agrees to a bf16
//   rounding of its input (1e-2 relative; printed). The input gradient is the same bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "model/cuda/cuda_ops.h"
#include "ops/kinds.h"

using namespace gpu_test;
using myriad::cuda::CudaOps;
using myriad::Gemm;
using myriad::Mlp;

namespace {

struct Case {
  Mlp m;
  int N, C, F;
};

void check(const Case& c) {
  const int P = c.m == Mlp::kSwiGlu ? 2 * c.F : c.F;
  SCOPED_TRACE(testing::Message() << (c.m == Mlp::kSwiGlu ? "swiglu" : "gelu") << " N=" << c.N << " C=" << c.C
                                  << " F=" << c.F);
  std::mt19937_64 gen(seed() + c.N + c.F);
  const auto x = randn(size_t(c.N) * c.C, gen), w1 = randn(size_t(P) * c.C, gen, 0.1f),
             w2 = randn(size_t(c.C) * c.F, gen, 0.1f), dy = randn(size_t(c.N) * c.C, gen);
  CudaOps ops;
  Dev<bf16> gx(x.size()), gw1(w1.size()), gw2(w2.size()), gdy(dy.size()), pre(size_t(c.N) * P),
      act(size_t(c.N) * c.F), dpre_kept(pre.n), dpre_recomputed(pre.n);
  Dev<float> dw_kept(w2.size()), dw_recomputed(w2.size());
  gx.upload(to_bf16(x)), gw1.upload(to_bf16(w1)), gw2.upload(to_bf16(w2)), gdy.upload(to_bf16(dy));
  ops.linear_act_forward(c.m, act.p, pre.p, gx.p, gw1.p, nullptr, c.N, c.C, c.F);
  CUDA_OK(cudaMemset(dw_kept.p, 0, dw_kept.n * sizeof(float)));
  CUDA_OK(cudaMemset(dw_recomputed.p, 0, dw_recomputed.n * sizeof(float)));
  ops.linear_backward(c.m, dpre_kept.p, dw_kept.p, nullptr, gdy.p, act.p, gw2.p, pre.p, c.N, c.F, c.C, false);
  ops.linear_backward(c.m, dpre_recomputed.p, dw_recomputed.p, nullptr, gdy.p, nullptr, gw2.p, pre.p, c.N, c.F, c.C,
                      false);
  CUDA_OK(cudaDeviceSynchronize());
  const auto a = dw_kept.download(), b = dw_recomputed.download();
  EXPECT_EQ(to_float(dpre_kept.download()), to_float(dpre_recomputed.download()));  // from dy and pre alone
  if (c.m == Mlp::kSwiGlu) {
    EXPECT_EQ(a, b) << "the recomputed SwiGLU is the forward's, bit for bit";
  } else {
    const double e = rel_err(b, a);
    std::printf("  gelu N=%d C=%d F=%d: the weight gradient from the recomputed activation within %.2e\n", c.N, c.C,
                c.F, e);
    EXPECT_LT(e, 1e-2);
    EXPECT_TRUE(all_finite(b));
  }
}

}  // namespace

TEST(MlpRecompute, SwiGluIsTheSameBits) {
  for (const Case& c : {Case{Mlp::kSwiGlu, 256, 64, 96}, Case{Mlp::kSwiGlu, 1000, 128, 344}, Case{Mlp::kSwiGlu, 7, 32, 8}})
    check(c);
}

TEST(MlpRecompute, GeluAgreesToARounding) {
  for (const Case& c : {Case{Mlp::kGelu, 256, 64, 256}, Case{Mlp::kGelu, 1000, 128, 512}}) check(c);
}
