// GELU, add, cast to bf16 and in-place scale against the CPU oracle (or exact host arithmetic),
// on the vector path (aligned) and the scalar path (pointers offset by one element), with n not
// a multiple of the vector width; outputs poisoned first.
//
// Tolerances: GELU outputs are bf16 (one rounding, ~2^-9 relative) computed with the fast exp:
// 1e-2. add, cast and scale are a single fp32 operation followed by one rounding, so they must
// equal the host's result bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/ops.cuh"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;

struct Case {
  int64_t n;
  int offset;  // elements: 1 forces the scalar path
};

class Elementwise : public ::testing::TestWithParam<Case> {};

TEST_P(Elementwise, Gelu) {
  const auto [n, off] = GetParam();
  std::mt19937_64 gen(seed() + n + off);
  const auto x = round_bf16(randn(n, gen, 2.5f));
  const auto dout = round_bf16(randn(n, gen, 1.0f));
  std::vector<float> ry(n), rdx(n, 0.0f);
  myriad::cpu::gelu_forward<float>(ry.data(), x.data(), n);
  myriad::cpu::gelu_backward<float>(rdx.data(), x.data(), dout.data(), n);  // += into zeros

  Dev<bf16> dx(n + off), dy(n + off), dd(n + off);
  std::vector<bf16> hx(off, __float2bfloat16(0.0f)), hd(off, __float2bfloat16(0.0f));
  const auto bx = to_bf16(x), bd = to_bf16(dout);
  hx.insert(hx.end(), bx.begin(), bx.end());
  hd.insert(hd.end(), bd.begin(), bd.end());
  dx.upload(hx);
  dd.upload(hd);
  dy.poison();
  cu::gelu_forward(dy.p + off, dx.p + off, n, 0);
  // In place: dinp aliases dout.
  cu::gelu_backward(dd.p + off, dx.p + off, dd.p + off, n, 0);
  CUDA_OK(cudaDeviceSynchronize());
  auto y = to_float(dy.download()), dxg = to_float(dd.download());
  y.erase(y.begin(), y.begin() + off);
  dxg.erase(dxg.begin(), dxg.begin() + off);
  const double ef = rel_err(y, ry), eb = rel_err(dxg, rdx);
  std::printf("  gelu n=%lld off=%d: fwd %.2e bwd %.2e\n", static_cast<long long>(n), off, ef, eb);
  EXPECT_LT(ef, 1e-2);
  EXPECT_LT(eb, 1e-2);
  EXPECT_TRUE(all_finite(y));
  EXPECT_TRUE(all_finite(dxg));
}

TEST_P(Elementwise, AddCastScale) {
  const auto [n, off] = GetParam();
  std::mt19937_64 gen(seed() + 7 * n + off);
  const auto a = round_bf16(randn(n, gen, 1.0f)), b = round_bf16(randn(n, gen, 3.0f));
  std::vector<float> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
  const auto want_sum = round_bf16(sum);

  Dev<bf16> da(n + off), db(n + off), dout(n + off);
  da.upload(to_bf16([&] { std::vector<float> t(off, 0.0f); t.insert(t.end(), a.begin(), a.end()); return t; }()));
  db.upload(to_bf16([&] { std::vector<float> t(off, 0.0f); t.insert(t.end(), b.begin(), b.end()); return t; }()));
  dout.poison();
  cu::add(dout.p + off, da.p + off, db.p + off, n, 0);
  cu::add(da.p + off, da.p + off, db.p + off, n, 0);  // out aliases a
  CUDA_OK(cudaDeviceSynchronize());
  auto got = to_float(dout.download()), got_alias = to_float(da.download());
  got.erase(got.begin(), got.begin() + off);
  got_alias.erase(got_alias.begin(), got_alias.begin() + off);
  EXPECT_EQ(got, want_sum);
  EXPECT_EQ(got_alias, want_sum);

  // cast_to_bf16 and scale_inplace on fp32.
  auto f = randn(n + off, gen, 10.0f);
  Dev<float> df(n + off), dscale(1);
  Dev<bf16> dc(n + off);
  df.upload(f);
  const float s = 0.37f;
  dscale.upload({s});
  dc.poison();
  cu::cast_to_bf16(dc.p + off, df.p + off, n, 0);
  cu::scale_inplace(df.p + off, dscale.p, n, 0);
  CUDA_OK(cudaDeviceSynchronize());
  const auto c = dc.download();
  const auto scaled = df.download();
  int64_t cast_bad = 0, scale_bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bf16 want = __float2bfloat16(f[off + i]);
    cast_bad += std::memcmp(&want, &c[off + i], sizeof(bf16)) != 0;
    scale_bad += scaled[off + i] != f[off + i] * s;
  }
  for (int i = 0; i < off; ++i) scale_bad += scaled[i] != f[i];  // untouched before the range
  EXPECT_EQ(cast_bad, 0);
  EXPECT_EQ(scale_bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, Elementwise,
                         ::testing::Values(Case{333 * 768 + 5, 0}, Case{333 * 768 + 5, 1},
                                           Case{8, 0}, Case{3, 0}, Case{1, 1},
                                           Case{4 * 1024 * 1024, 0}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "n" + std::to_string(i.param.n) + "_off" + std::to_string(i.param.offset);
                         });

}  // namespace
