// The Llama-family CUDA kernels (RMSNorm plain, fused with the residual add, and backward; RoPE
// forward and backward; SwiGLU forward and backward) against the CPU ops run in fp32 on the same
// bf16-rounded inputs. Outputs are poisoned first (an unwritten element shows as NaN), gradients
// that accumulate are pre-filled with random values, and every run is repeated to check that the
// bits do not change.
//
// Tolerances (relative, ||gpu - cpu|| / ||cpu||):
// - bf16 outputs carry one bf16 rounding, about 2^-9 relative per element: 1e-2.
// - rstd and dweight are fp32 results of the same fp32 products as the oracle's, summed in
//   another order: 1e-5.
// - RoPE: the GPU takes the frequencies rounded to fp32 (the CPU op keeps them in double), which
//   moves an angle by at most pos * freq * 2^-24 radians: 8e-3 at position 2^17 for the fastest
//   pair, and far less for the others, so the bf16 rounding still dominates and 1e-2 holds at
//   Llama 3.1's long-context positions (checked at pos0 = 120000).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/ops.cuh"
#include "ops/rope.h"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;

// ---------------------------------------------------------------------------------------------
// RMSNorm

struct NormShape {
  int N, C;
};

class RmsNorm : public ::testing::TestWithParam<NormShape> {};

void check_rms_forward(int N, int C, double eps, bool fused) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C << " eps=" << eps << " fused=" << fused);
  std::mt19937_64 gen(seed() + 101 * N + C);
  // A non-zero mean: RMSNorm must not subtract it.
  const auto a = round_bf16(randn(size_t(N) * C, gen, 2.0f, 0.5f));
  const auto b = round_bf16(randn(size_t(N) * C, gen, 1.0f));
  const auto w = round_bf16(randn(C, gen, 0.3f, 1.0f));
  std::vector<float> x = a;
  if (fused)
    for (size_t i = 0; i < x.size(); ++i) x[i] = a[i] + b[i];
  x = round_bf16(x);  // the residual is stored in bf16 and normalized as stored
  std::vector<float> ref(size_t(N) * C), rrstd(N);
  myriad::cpu::rmsnorm_forward<float>(ref.data(), rrstd.data(), x.data(), w.data(), N, C, eps);

  Dev<bf16> da(a.size()), db(b.size()), dw(C), out(a.size()), resid(a.size());
  Dev<float> rstd(N);
  up(da, a), up(db, b), up(dw, w);
  std::vector<float> first_out, first_rstd, first_resid;
  for (int run = 0; run < 2; ++run) {
    out.poison(), rstd.poison(), resid.poison();
    if (fused)
      cu::residual_rmsnorm_forward(resid.p, out.p, rstd.p, da.p, db.p, dw.p, N, C, eps, 0);
    else
      cu::rmsnorm_forward(out.p, rstd.p, da.p, dw.p, N, C, eps, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto o = down(out), r = rstd.download(), rs = down(resid);
    if (run == 0) {
      const double eo = rel_err(o, ref), er = rel_err(r, rrstd);
      std::printf("  rmsnorm fwd N=%d C=%d fused=%d: out %.2e rstd %.2e\n", N, C, int(fused), eo, er);
      EXPECT_LT(eo, 1e-2);
      EXPECT_LT(er, 1e-5);
      if (fused) {
        EXPECT_EQ(rs, x);  // bf16(a + b), bit for bit
      }
      first_out = o, first_rstd = r, first_resid = rs;
    } else {
      EXPECT_EQ(o, first_out);
      EXPECT_EQ(r, first_rstd);
      if (fused) {
        EXPECT_EQ(rs, first_resid);
      }
    }
  }
}

TEST_P(RmsNorm, Forward) {
  const NormShape s = GetParam();
  check_rms_forward(s.N, s.C, 1e-5, false);
  check_rms_forward(s.N, s.C, 1e-6, false);
}

TEST_P(RmsNorm, ResidualForward) {
  const NormShape s = GetParam();
  check_rms_forward(s.N, s.C, 1e-5, true);
}

TEST_P(RmsNorm, Backward) {
  const auto [N, C] = GetParam();
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
  std::mt19937_64 gen(seed() + 211 * N + C);
  const auto x = round_bf16(randn(size_t(N) * C, gen, 1.5f, 0.3f));
  const auto dout = round_bf16(randn(size_t(N) * C, gen, 1.0f));
  const auto w = round_bf16(randn(C, gen, 0.3f, 1.0f));
  const auto dinp0 = round_bf16(randn(size_t(N) * C, gen, 1.0f));
  const auto dw0 = randn(C, gen, 1.0f);
  std::vector<float> y(size_t(N) * C), rstd(N);
  myriad::cpu::rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
  std::vector<float> rdinp = dinp0, rdw = dw0;
  myriad::cpu::rmsnorm_backward<float>(rdinp.data(), rdw.data(), dout.data(), x.data(), w.data(),
                                       rstd.data(), N, C);

  Dev<bf16> dx(x.size()), ddout(dout.size()), dw(C), dinp(x.size());
  Dev<float> drstd(N), dweight(C), scratch(cu::rmsnorm_scratch_floats(N, C));
  up(dx, x), up(ddout, dout), up(dw, w);
  drstd.upload(rstd);
  std::vector<float> first_dinp, first_dw;
  for (int run = 0; run < 2; ++run) {
    up(dinp, dinp0), dweight.upload(dw0);  // pre-filled: both accumulate
    scratch.poison();
    cu::rmsnorm_backward(dinp.p, dweight.p, scratch.p, ddout.p, dx.p, dw.p, drstd.p, N, C, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto gi = down(dinp), gw = dweight.download();
    if (run == 0) {
      const double ei = rel_err(gi, rdinp), ew = rel_err(gw, rdw);
      std::printf("  rmsnorm bwd N=%d C=%d: dinp %.2e dweight %.2e\n", N, C, ei, ew);
      EXPECT_LT(ei, 1e-2);
      EXPECT_LT(ew, 1e-5);
      first_dinp = gi, first_dw = gw;
    } else {
      EXPECT_EQ(gi, first_dinp);
      EXPECT_EQ(gw, first_dw);
    }
  }
}

// 2048, 4096 (Llama 3.2 1B, Llama 3 8B): one and several warps per row; 8200: lanes with no full
// share; 3072: Llama 3.2 3B; 99, 1004: the scalar path (C % 8 != 0); odd N throughout; 4099 rows:
// more row groups than the backward's grid holds, so each group visits several rows.
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm,
                         ::testing::Values(NormShape{333, 768}, NormShape{65, 2048},
                                           NormShape{41, 4096}, NormShape{21, 8200},
                                           NormShape{33, 3072}, NormShape{50, 1004},
                                           NormShape{17, 99}, NormShape{1, 2048},
                                           NormShape{4099, 2048}),
                         [](const ::testing::TestParamInfo<NormShape>& i) {
                           return "N" + std::to_string(i.param.N) + "_C" + std::to_string(i.param.C);
                         });

// ---------------------------------------------------------------------------------------------
// RoPE

struct RopeCase {
  int B, T, Hkv, G, D, pos0;
  bool llama3;  // Llama 3.1's scaled frequencies (theta 500000), else theta 10000 unscaled
};

class Rope : public ::testing::TestWithParam<RopeCase> {};

// Whether element k of a (B,T,Hkv*(G+2)*D) buffer is in a value head (left untouched).
bool is_value(size_t k, int G, int D) { return (k / D) % (G + 2) == size_t(G + 1); }

void check_rope(const RopeCase& c, bool backward) {
  const auto [B, T, Hkv, G, D, pos0, llama3] = c;
  SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T << " Hkv=" << Hkv << " G=" << G
                                  << " D=" << D << " pos0=" << pos0 << " llama3=" << llama3
                                  << " backward=" << backward);
  std::mt19937_64 gen(seed() + 307 * T + 13 * D + G + Hkv + pos0);
  myriad::RopeScaling scaling;
  if (llama3) scaling.type = "llama3";
  const auto freqs = myriad::rope_frequencies(llama3 ? 500000.0 : 10000.0, D, scaling);
  std::vector<float> freqs32(freqs.begin(), freqs.end());  // what the CUDA op is given

  const size_t n = size_t(B) * T * Hkv * (G + 2) * D;
  const auto x = round_bf16(randn(n, gen, 1.0f));
  std::vector<float> ref = x;
  if (backward)
    myriad::cpu::rope_backward<float>(ref.data(), freqs.data(), B, T, Hkv, G, D, pos0);
  else
    myriad::cpu::rope_forward<float>(ref.data(), freqs.data(), B, T, Hkv, G, D, pos0);

  Dev<bf16> qkv(n);
  Dev<float> dfreqs(freqs32.size());
  dfreqs.upload(freqs32);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    up(qkv, x);  // in place: a fresh copy of the input each run
    if (backward)
      cu::rope_backward(qkv.p, dfreqs.p, B, T, Hkv, G, D, pos0, 0);
    else
      cu::rope_forward(qkv.p, dfreqs.p, B, T, Hkv, G, D, pos0, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto o = down(qkv);
    if (run == 0) {
      std::vector<float> o_qk, ref_qk;
      size_t v_changed = 0;
      for (size_t k = 0; k < n; ++k) {
        if (is_value(k, G, D)) {
          v_changed += o[k] != x[k];
        } else {
          o_qk.push_back(o[k]);
          ref_qk.push_back(ref[k]);
        }
      }
      const double e = rel_err(o_qk, ref_qk);
      std::printf("  rope %s B=%d T=%d Hkv=%d G=%d D=%d pos0=%d llama3=%d: q,k %.2e\n",
                  backward ? "bwd" : "fwd", B, T, Hkv, G, D, pos0, int(llama3), e);
      EXPECT_LT(e, 1e-2);
      EXPECT_EQ(v_changed, 0u);  // value heads: bit for bit the input
      first = o;
    } else {
      EXPECT_EQ(o, first);
    }
  }
}

TEST_P(Rope, Forward) { check_rope(GetParam(), false); }
TEST_P(Rope, Backward) { check_rope(GetParam(), true); }

// Forward then backward is the identity up to two bf16 roundings.
TEST_P(Rope, RoundTrip) {
  const auto [B, T, Hkv, G, D, pos0, llama3] = GetParam();
  std::mt19937_64 gen(seed() + 401 * T + D);
  myriad::RopeScaling scaling;
  if (llama3) scaling.type = "llama3";
  const auto freqs = myriad::rope_frequencies(llama3 ? 500000.0 : 10000.0, D, scaling);
  std::vector<float> freqs32(freqs.begin(), freqs.end());
  const size_t n = size_t(B) * T * Hkv * (G + 2) * D;
  const auto x = round_bf16(randn(n, gen, 1.0f));
  Dev<bf16> qkv(n);
  Dev<float> dfreqs(freqs32.size());
  dfreqs.upload(freqs32);
  up(qkv, x);
  cu::rope_forward(qkv.p, dfreqs.p, B, T, Hkv, G, D, pos0, 0);
  cu::rope_backward(qkv.p, dfreqs.p, B, T, Hkv, G, D, pos0, 0);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(down(qkv), x), 1e-2);
}

// G = 1 (multi-head), 4 (Llama 3 8B's grouping), H (multi-query: Hkv = 1); D = 64, 128, and 80
// (D/2 = 40, still the vector path) and 36 (D/2 = 18: the scalar path); odd B*T; positions from
// pos0 > 0, up to Llama 3.1's long context with its scaled frequencies.
INSTANTIATE_TEST_SUITE_P(
    Cases, Rope,
    ::testing::Values(RopeCase{2, 33, 4, 1, 64, 0, false}, RopeCase{3, 17, 2, 4, 128, 5, false},
                      RopeCase{1, 41, 8, 4, 128, 3000, true}, RopeCase{2, 9, 1, 8, 128, 1000, true},
                      RopeCase{1, 23, 1, 32, 64, 17, false},
                      RopeCase{1, 31, 8, 4, 128, 120000, true},
                      RopeCase{3, 5, 3, 2, 80, 7, false}, RopeCase{1, 7, 2, 2, 36, 3, false}),
    [](const ::testing::TestParamInfo<RopeCase>& i) {
      const RopeCase& c = i.param;
      return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_Hkv" +
             std::to_string(c.Hkv) + "_G" + std::to_string(c.G) + "_D" + std::to_string(c.D) +
             "_pos" + std::to_string(c.pos0) + (c.llama3 ? "_llama3" : "");
    });

// ---------------------------------------------------------------------------------------------
// SwiGLU

struct GluCase {
  int64_t N, F;
  bool misaligned;  // every pointer one element off: the scalar path
};

class SwiGlu : public ::testing::TestWithParam<GluCase> {};

// Gates where exp(-g) overflows (g < -88) or vanishes (g > 88), and a near-overflow one.
std::vector<float> with_extremes(std::vector<float> gu) {
  const float gates[] = {-100.0f, 100.0f, -87.5f};
  for (size_t f = 0; f < 3 && 2 * f < gu.size(); ++f) gu[2 * f] = gates[f];
  return gu;
}

TEST_P(SwiGlu, Forward) {
  const auto [N, F, mis] = GetParam();
  SCOPED_TRACE(testing::Message() << "N=" << N << " F=" << F << " misaligned=" << mis);
  std::mt19937_64 gen(seed() + 503 * N + F);
  const size_t n = size_t(N * F), off = mis ? 1 : 0;
  const auto gu = with_extremes(round_bf16(randn(2 * n, gen, 3.0f)));  // wide: tails and dip
  std::vector<float> ref(n);
  myriad::cpu::swiglu_forward<float>(ref.data(), gu.data(), N, F);

  Dev<bf16> dgu(2 * n + off), out(n + off);
  std::vector<float> gu_host(2 * n + off, 0.0f);
  std::copy(gu.begin(), gu.end(), gu_host.begin() + off);
  up(dgu, gu_host);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    out.poison();
    cu::swiglu_forward(out.p + off, dgu.p + off, N, F, 0);
    CUDA_OK(cudaDeviceSynchronize());
    auto o = down(out);
    o.erase(o.begin(), o.begin() + off);
    if (run == 0) {
      const double e = rel_err(o, ref);
      std::printf("  swiglu fwd N=%lld F=%lld mis=%d: %.2e\n", (long long)N, (long long)F, int(mis), e);
      EXPECT_LT(e, 1e-2);
      first = o;
    } else {
      EXPECT_EQ(o, first);
    }
  }
}

TEST_P(SwiGlu, Backward) {
  const auto [N, F, mis] = GetParam();
  SCOPED_TRACE(testing::Message() << "N=" << N << " F=" << F << " misaligned=" << mis);
  std::mt19937_64 gen(seed() + 601 * N + F);
  const size_t n = size_t(N * F), off = mis ? 1 : 0;
  const auto gu = with_extremes(round_bf16(randn(2 * n, gen, 3.0f)));
  const auto dout = round_bf16(randn(n, gen, 1.0f));
  std::vector<float> ref(2 * n, 0.0f);  // the CPU op accumulates: from zero, it is the gradient
  myriad::cpu::swiglu_backward<float>(ref.data(), gu.data(), dout.data(), N, F);

  std::vector<float> gu_host(2 * n + off, 0.0f), dout_host(n + off, 0.0f);
  std::copy(gu.begin(), gu.end(), gu_host.begin() + off);
  std::copy(dout.begin(), dout.end(), dout_host.begin() + off);
  Dev<bf16> dgu_in(2 * n + off), ddout(n + off), dgu(2 * n + off);
  up(dgu_in, gu_host), up(ddout, dout_host);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    dgu.poison();  // written, not accumulated: every element must be written
    cu::swiglu_backward(dgu.p + off, dgu_in.p + off, ddout.p + off, N, F, 0);
    CUDA_OK(cudaDeviceSynchronize());
    auto o = down(dgu);
    o.erase(o.begin(), o.begin() + off);
    if (run == 0) {
      const double e = rel_err(o, ref);
      std::printf("  swiglu bwd N=%lld F=%lld mis=%d: %.2e\n", (long long)N, (long long)F, int(mis), e);
      EXPECT_LT(e, 1e-2);
      first = o;
    } else {
      EXPECT_EQ(o, first);
    }
  }
  // In place (dgu aliasing gu): the same bits.
  cu::swiglu_backward(dgu_in.p + off, dgu_in.p + off, ddout.p + off, N, F, 0);
  CUDA_OK(cudaDeviceSynchronize());
  auto inplace = down(dgu_in);
  inplace.erase(inplace.begin(), inplace.begin() + off);
  EXPECT_EQ(inplace, first);
}

// 8192 and 14336: Llama 3.2 1B's and Llama 3 8B's hidden sizes; 5: N*F % 4 != 0, the tail.
INSTANTIATE_TEST_SUITE_P(Cases, SwiGlu,
                         ::testing::Values(GluCase{333, 1024, false}, GluCase{17, 8192, false},
                                           GluCase{9, 14336, false}, GluCase{7, 5, false},
                                           GluCase{1, 3, false}, GluCase{33, 100, true},
                                           GluCase{5, 7, true}),
                         [](const ::testing::TestParamInfo<GluCase>& i) {
                           return "N" + std::to_string(i.param.N) + "_F" + std::to_string(i.param.F) +
                                  (i.param.misaligned ? "_misaligned" : "");
                         });

}  // namespace

// ---------------------------------------------------------------------------------------------
// Grouped-query QKV into the heads' layout (what cuDNN's attention reads in one call) and back:
// every element where the layouts' definitions put it, and the round trip exact.

TEST(QkvHeads, MovesEveryElementAndBack) {
  for (const auto& [H, Hkv, D] : {std::tuple{8, 2, 64}, std::tuple{4, 1, 128}, std::tuple{32, 8, 64}, std::tuple{6, 6, 16}}) {
    SCOPED_TRACE(::testing::Message() << "H " << H << " Hkv " << Hkv << " D " << D);
    const int G = H / Hkv, tokens = 37;
    const size_t per = size_t(H + 2 * Hkv) * D, n = tokens * per;
    std::mt19937_64 gen(seed() + H);
    const std::vector<float> x = round_bf16(randn(n, gen));
    std::vector<float> want(n);
    for (int t = 0; t < tokens; ++t)
      for (int g = 0; g < Hkv; ++g)
        for (int j = 0; j < G + 2; ++j)
          for (int d = 0; d < D; ++d) {
            const size_t from = t * per + (size_t(g) * (G + 2) + j) * D + d;
            const size_t to = t * per + (j < G ? (size_t(g) * G + j) * D : j == G ? size_t(H + g) * D : size_t(H + Hkv + g) * D) + d;
            want[to] = x[from];
          }
    Dev<bf16> a(n), b(n), c(n);
    up(a, x);
    b.poison();
    c.poison();
    cu::qkv_to_heads(b.p, a.p, tokens, H, Hkv, D, nullptr);
    cu::qkv_from_heads(c.p, b.p, tokens, H, Hkv, D, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(down(b), want);
    EXPECT_EQ(down(c), x);
  }
}
