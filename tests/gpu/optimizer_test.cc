// The fused AdamW and LAMB steps against the CPU optimizers (optim/optimizer.h) over a small
// GPT's parameter layout, several steps in a row; and AdamW over hand-made segments of awkward
// sizes (empty, odd offsets, a total not a multiple of 4) against the same formula on the host.
//
// Tolerances: both sides run the same fp32 formula on the same fp32 inputs; only contraction
// into FMAs (and for LAMB the fp32 norms against the CPU's double ones) differ: the weights
// within 1e-6 relative, the moments within 1e-6, the change of the weights over the steps
// within 1e-4; the bf16 copy must equal bf16(w) bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/config.h"
#include "gpu/gpu_test_util.h"
#include "model/params.h"
#include "ops/cuda/ops.cuh"
#include "optim/optimizer.h"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;

int64_t bf16_mismatches(const std::vector<bf16>& got, const std::vector<float>& w) {
  int64_t bad = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const bf16 want = __float2bfloat16(w[i]);
    bad += std::memcmp(&want, &got[i], sizeof(bf16)) != 0;
  }
  return bad;
}

std::vector<float> diff(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

class Optimizer : public ::testing::TestWithParam<const char*> {};

TEST_P(Optimizer, MatchesCpu) {
  const std::string name = GetParam();
  const myriad::Config cfg = myriad::parse_config(
      "", "gpu optimizer test",
      {"model.layers=2", "model.d_model=64", "model.heads=4", "model.seq_len=32",
       "model.vocab_size=256", "optim.name=\"" + name + "\"", "optim.weight_decay=0.1"});
  const myriad::ParamLayout layout(cfg);
  const int64_t total = layout.total();
  std::vector<int64_t> segments;
  std::vector<uint8_t> decay;
  for (const auto& t : layout.tensors()) segments.push_back(t.offset), decay.push_back(t.decay);
  segments.push_back(total);
  const int count = static_cast<int>(decay.size());

  std::mt19937_64 gen(seed() + (name == "lamb"));
  auto w = randn(total, gen, 0.02f);
  for (int64_t j = layout.tensors()[1].offset; j < layout.tensors()[2].offset; ++j) w[j] = 0.0f;  // a zero tensor: trust 1
  const auto w0 = w;
  auto cpu = myriad::make_optimizer(cfg.optim, layout);

  Dev<float> dw(total), dm(total), dv(total), dg(total), du(total),
      scratch(cu::lamb_scratch_floats(total, count));
  Dev<bf16> dwb(total);
  Dev<int64_t> dseg(segments.size());
  Dev<uint8_t> ddecay(decay.size());
  dw.upload(w), dm.zero(), dv.zero(), dseg.upload(segments), ddecay.upload(decay);

  const double lr = 3e-3;
  for (int t = 1; t <= 3; ++t) {
    const auto g = randn(total, gen, 0.01f * t);
    dg.upload(g);
    const float clip = t == 2 ? 0.37f : 1.0f;  // one step clipped: the update scales as it reads
    cpu->step(w.data(), g.data(), lr, clip);
    // The CPU optimizer's bias corrections: pow in double, then fp32.
    const cu::AdamParams p{float(lr), float(cfg.optim.beta1), float(cfg.optim.beta2),
                           float(cfg.optim.eps), float(cfg.optim.weight_decay),
                           float(1.0 - std::pow(cfg.optim.beta1, t)),
                           float(1.0 - std::pow(cfg.optim.beta2, t)), clip};
    dwb.poison(), du.poison(), scratch.poison();
    if (name == "adamw")
      cu::adamw_step(dw.p, dwb.p, dm.p, dv.p, dg.p, dseg.p, ddecay.p, count, total, p, 0);
    else
      cu::lamb_step(dw.p, dwb.p, dm.p, dv.p, dg.p, du.p, scratch.p, dseg.p, ddecay.p, count, total, p, 0);
    CUDA_OK(cudaDeviceSynchronize());
  }
  const auto gw = dw.download(), gm = dm.download(), gv = dv.download();
  const double ew = rel_err(gw, w), em = rel_err(gm, {cpu->m().begin(), cpu->m().end()}),
               ev = rel_err(gv, {cpu->v().begin(), cpu->v().end()});
  const double ed = rel_err(diff(gw, w0), diff(w, w0));
  std::printf("  %s (%lld params, %d tensors, 3 steps): w %.2e m %.2e v %.2e update %.2e\n",
              name.c_str(), static_cast<long long>(total), count, ew, em, ev, ed);
  EXPECT_LT(ew, 1e-6);
  EXPECT_LT(em, 1e-6);
  EXPECT_LT(ev, 1e-6);
  EXPECT_LT(ed, 1e-4);
  EXPECT_EQ(bf16_mismatches(dwb.download(), gw), 0);
}

INSTANTIATE_TEST_SUITE_P(Names, Optimizer, ::testing::Values("adamw", "lamb"));

// Host AdamW, the CPU optimizer's formula, for hand-made segments.
void host_adamw(std::vector<float>& w, std::vector<float>& m, std::vector<float>& v,
                const std::vector<float>& g, const std::vector<int64_t>& seg,
                const std::vector<uint8_t>& decay, const cu::AdamParams& p) {
  for (size_t i = 0; i + 1 < seg.size(); ++i) {
    const float dec = decay[i] ? 1.0f - p.lr * p.weight_decay : 1.0f;
    for (int64_t j = seg[i]; j < seg[i + 1]; ++j) {
      m[j] = p.beta1 * m[j] + (1 - p.beta1) * g[j];
      v[j] = p.beta2 * v[j] + (1 - p.beta2) * g[j] * g[j];
      w[j] = w[j] * dec - p.lr * (m[j] / p.c1) / (std::sqrt(v[j] / p.c2) + p.eps);
    }
  }
}

TEST(AdamW, AwkwardSegments) {
  const std::vector<int64_t> sizes = {5, 0, 1030, 1, 4099, 3, 0, 20000, 7};
  std::vector<int64_t> seg{0};
  std::vector<uint8_t> decay;
  for (size_t i = 0; i < sizes.size(); ++i) seg.push_back(seg.back() + sizes[i]), decay.push_back(i % 2);
  const int count = static_cast<int>(sizes.size());
  const int64_t total = seg.back();
  std::mt19937_64 gen(seed() + 5);
  auto w = randn(total, gen, 0.5f), m = randn(total, gen, 0.01f), v = randn(total, gen, 0.01f);
  for (auto& x : v) x = x * x;
  const auto g = randn(total, gen, 0.1f);
  const cu::AdamParams p{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f};
  Dev<float> dw(total), dm(total), dv(total), dg(total);
  Dev<bf16> dwb(total);
  Dev<int64_t> dseg(seg.size());
  Dev<uint8_t> ddecay(decay.size());
  dw.upload(w), dm.upload(m), dv.upload(v), dg.upload(g), dseg.upload(seg), ddecay.upload(decay);
  dwb.poison();
  cu::adamw_step(dw.p, dwb.p, dm.p, dv.p, dg.p, dseg.p, ddecay.p, count, total, p, 0);
  CUDA_OK(cudaDeviceSynchronize());
  const auto w0 = w;
  host_adamw(w, m, v, g, seg, decay, p);
  const auto gw = dw.download();
  const double ew = rel_err(gw, w), ed = rel_err(diff(gw, w0), diff(w, w0));
  std::printf("  adamw awkward segments (%lld params): w %.2e update %.2e\n",
              static_cast<long long>(total), ew, ed);
  EXPECT_LT(ew, 1e-6);
  EXPECT_LT(ed, 1e-5);
  EXPECT_LT(rel_err(dm.download(), m), 1e-6);
  EXPECT_LT(rel_err(dv.download(), v), 1e-6);
  EXPECT_EQ(bf16_mismatches(dwb.download(), gw), 0);
}

}  // namespace
