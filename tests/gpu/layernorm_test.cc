// LayerNorm kernels (plain, fused with the residual add, backward) against the CPU oracle run in
// fp32 on the same bf16-rounded inputs. Outputs are poisoned first (an unwritten element shows
// as NaN), gradients pre-filled with random values (accumulation), and every run repeated to
// check that the bits do not change.
//
// Tolerances: bf16 outputs (out, dinp) carry one bf16 rounding, about 2^-9 relative: 1e-2.
// mean/rstd and dweight/dbias are fp32 results of the very same fp32 inputs as the oracle's,
// only summed in another order: 1e-5 (tighter than the 1e-3 a bf16 input alone would allow).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/ops.cuh"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;

struct Shape {
  int N, C;
};

class LayerNorm : public ::testing::TestWithParam<Shape> {};

void check_forward(int N, int C, bool with_bias, bool fused) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C << " bias=" << with_bias
                                  << " fused=" << fused);
  std::mt19937_64 gen(seed() + 17 * N + C);
  // A non-zero mean and a spread of scales, so that the statistics matter.
  const auto a = round_bf16(randn(size_t(N) * C, gen, 2.0f, 0.5f));
  const auto b = round_bf16(randn(size_t(N) * C, gen, 1.0f));
  const auto w = round_bf16(randn(C, gen, 0.3f, 1.0f));
  const auto bias = round_bf16(randn(C, gen, 0.2f));

  std::vector<float> x = a;
  if (fused)
    for (size_t i = 0; i < x.size(); ++i) x[i] = a[i] + b[i];
  x = round_bf16(x);  // the residual is stored in bf16, and normalized as stored
  std::vector<float> ref(size_t(N) * C), rmean(N), rrstd(N);
  myriad::cpu::layernorm_forward<float>(ref.data(), rmean.data(), rrstd.data(), x.data(), w.data(),
                                        with_bias ? bias.data() : nullptr, N, C);

  Dev<bf16> da(a.size()), db(b.size()), dw(C), dbias(C), out(a.size()), resid(a.size());
  Dev<float> mean(N), rstd(N);
  up(da, a), up(db, b), up(dw, w), up(dbias, bias);
  std::vector<float> first_out, first_mean, first_rstd;
  for (int run = 0; run < 2; ++run) {
    out.poison(), mean.poison(), rstd.poison(), resid.poison();
    if (fused)
      cu::residual_layernorm_forward(resid.p, out.p, mean.p, rstd.p, da.p, db.p, dw.p,
                                     with_bias ? dbias.p : nullptr, N, C, 0);
    else
      cu::layernorm_forward(out.p, mean.p, rstd.p, da.p, dw.p, with_bias ? dbias.p : nullptr, N, C, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto o = down(out), m = mean.download(), r = rstd.download();
    if (run == 0) {
      const double eo = rel_err(o, ref), em = rel_err(m, rmean), er = rel_err(r, rrstd);
      std::printf("  layernorm fwd N=%d C=%d bias=%d fused=%d: out %.2e mean %.2e rstd %.2e\n", N, C,
                  int(with_bias), int(fused), eo, em, er);
      EXPECT_LT(eo, 1e-2);
      EXPECT_LT(em, 1e-5);
      EXPECT_LT(er, 1e-5);
      if (fused) {
        EXPECT_EQ(down(resid), x);  // bf16(a + b), bit for bit
      }
      first_out = o, first_mean = m, first_rstd = r;
    } else {
      EXPECT_EQ(o, first_out);
      EXPECT_EQ(m, first_mean);
      EXPECT_EQ(r, first_rstd);
    }
  }
}

TEST_P(LayerNorm, Forward) {
  const Shape s = GetParam();
  check_forward(s.N, s.C, true, false);
  check_forward(s.N, s.C, false, false);
}

TEST_P(LayerNorm, ResidualForward) {
  const Shape s = GetParam();
  check_forward(s.N, s.C, true, true);
  check_forward(s.N, s.C, false, true);
}

void check_backward(int N, int C, bool with_bias) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C << " bias=" << with_bias);
  std::mt19937_64 gen(seed() + 31 * N + C);
  const auto x = round_bf16(randn(size_t(N) * C, gen, 1.5f, 0.3f));
  const auto dout = round_bf16(randn(size_t(N) * C, gen, 1.0f));
  const auto w = round_bf16(randn(C, gen, 0.3f, 1.0f));
  const auto bias = round_bf16(randn(C, gen, 0.2f));
  const auto dinp0 = round_bf16(randn(size_t(N) * C, gen, 1.0f));
  const auto dw0 = randn(C, gen, 1.0f), db0 = randn(C, gen, 1.0f);
  std::vector<float> y(size_t(N) * C), mean(N), rstd(N);
  myriad::cpu::layernorm_forward<float>(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                        bias.data(), N, C);
  std::vector<float> rdinp = dinp0, rdw = dw0, rdb = db0;
  myriad::cpu::layernorm_backward<float>(rdinp.data(), rdw.data(), with_bias ? rdb.data() : nullptr,
                                         dout.data(), x.data(), w.data(), mean.data(), rstd.data(),
                                         N, C);

  Dev<bf16> dx(x.size()), ddout(dout.size()), dw(C), dinp(x.size());
  Dev<float> dmean(N), drstd(N), dweight(C), dbias(C), scratch(cu::layernorm_scratch_floats(N, C));
  up(dx, x), up(ddout, dout), up(dw, w);
  dmean.upload(mean), drstd.upload(rstd);
  std::vector<float> first_dinp, first_dw, first_db;
  for (int run = 0; run < 2; ++run) {
    up(dinp, dinp0), dweight.upload(dw0), dbias.upload(db0);
    scratch.poison();
    cu::layernorm_backward(dinp.p, dweight.p, with_bias ? dbias.p : nullptr, scratch.p, ddout.p,
                           dx.p, dw.p, dmean.p, drstd.p, N, C, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto gi = down(dinp), gw = dweight.download(), gb = dbias.download();
    if (run == 0) {
      const double ei = rel_err(gi, rdinp), ew = rel_err(gw, rdw), eb = rel_err(gb, rdb);
      std::printf("  layernorm bwd N=%d C=%d bias=%d: dinp %.2e dweight %.2e dbias %.2e\n", N, C,
                  int(with_bias), ei, ew, eb);
      EXPECT_LT(ei, 1e-2);
      EXPECT_LT(ew, 1e-5);
      if (with_bias) {
        EXPECT_LT(eb, 1e-5);
      } else {
        EXPECT_EQ(gb, db0);  // null dbias: nothing written
      }
      first_dinp = gi, first_dw = gw, first_db = gb;
    } else {
      EXPECT_EQ(gi, first_dinp);
      EXPECT_EQ(gw, first_dw);
      EXPECT_EQ(gb, first_db);
    }
  }
}

TEST_P(LayerNorm, Backward) {
  const Shape s = GetParam();
  check_backward(s.N, s.C, true);
  check_backward(s.N, s.C, false);
}

// 768, 2048, 4096: one and several warps per row; 136, 8200: lanes with no full share; 100, 99,
// 1004: the scalar path (C % 8 != 0).
INSTANTIATE_TEST_SUITE_P(Shapes, LayerNorm,
                         ::testing::Values(Shape{333, 768}, Shape{333, 136}, Shape{64, 2048},
                                           Shape{40, 4096}, Shape{21, 8200}, Shape{333, 100},
                                           Shape{50, 1004}, Shape{17, 99}, Shape{1, 768}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return "N" + std::to_string(i.param.N) + "_C" + std::to_string(i.param.C);
                         });

}  // namespace
