// The FP8 kernels against the host's exact emulation (ops/fp8.h), and the FP8 GEMMs against a
// float64 product of the same quantized operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <thread>
#include <tuple>
#include <cstring>

#include "core/config.h"
#include "engine_cases.h"
#include "gpu_test_util.h"
#include "model/cuda/cuda_ops.h"
#include "model/cuda/matmul.h"
#include "model/gpt.h"
#include "model/memory_plan.h"
#include "runtime/engine.h"
#include "ops/cuda/ops.cuh"
#include "ops/fp8.h"

using namespace gpu_test;
using myriad::fp8::Format;
namespace fp8 = myriad::fp8;

namespace {

// Normal values with a few outliers 100x larger, so that the scale is set by a handful of values
// and the bulk sits binades below, subnormals included.
std::vector<float> with_outliers(size_t n, std::mt19937_64& gen, float std) {
  std::vector<float> x = randn(n, gen, std);
  std::uniform_int_distribution<size_t> at(0, n - 1);
  for (int i = 0; i < 5; ++i) x[at(gen)] *= 100;
  return round_bf16(x);
}

float host_amax(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

// What the device cast must write: the host emulation of x (rows,cols) and its transpose.
void expected(std::vector<uint8_t>& q, std::vector<uint8_t>& qt, const std::vector<float>& x, int rows, int cols,
              float scale, Format f) {
  q.resize(x.size()), qt.resize(x.size());
  fp8::quantize(q.data(), x.data(), int64_t(x.size()), scale, f);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) qt[size_t(c) * rows + r] = q[size_t(r) * cols + c];
}

struct CastCase {
  int rows, cols;
  Format f;
};
std::string case_name(const ::testing::TestParamInfo<CastCase>& i) {
  return std::to_string(i.param.rows) + "x" + std::to_string(i.param.cols) + (i.param.f == Format::e4m3 ? "_e4m3" : "_e5m2");
}

class Fp8Cast : public ::testing::TestWithParam<CastCase> {};

TEST_P(Fp8Cast, AmaxScaleAndBothLayoutsAreTheHostsBytes) {
  const auto [rows, cols, f] = GetParam();
  std::mt19937_64 gen(seed());
  const std::vector<float> x = with_outliers(size_t(rows) * cols, gen, 0.02f);
  Dev<bf16> dx(x.size());
  Dev<uint8_t> q(x.size()), qt(x.size());
  Dev<float> amax(1), scale(1), inv(1);
  dx.upload(to_bf16(x));
  // 0x7f is NaN in both formats: a cast of finite values never writes it.
  CUDA_OK(cudaMemset(q.p, 0x7f, x.size()));
  CUDA_OK(cudaMemset(qt.p, 0x7f, x.size()));
  scale.poison(), inv.poison();
  myriad::cuda::amax(amax.p, dx.p, int64_t(x.size()), nullptr);
  myriad::cuda::fp8_scales(scale.p, inv.p, amax.p, 1, f, nullptr);
  myriad::cuda::cast_fp8(q.p, qt.p, dx.p, rows, cols, scale.p, f, nullptr);
  CUDA_OK(cudaDeviceSynchronize());

  const float a = host_amax(x), s = fp8::scale_for(a, f);
  EXPECT_EQ(amax.download()[0], a);
  EXPECT_EQ(scale.download()[0], s);
  EXPECT_EQ(inv.download()[0], 1.0f / s);
  std::vector<uint8_t> want, want_t;
  expected(want, want_t, x, rows, cols, s, f);
  const std::vector<uint8_t> got = q.download(), got_t = qt.download();
  size_t bad = 0, bad_t = 0;
  for (size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i], bad_t += got_t[i] != want_t[i];
  EXPECT_EQ(bad, 0u) << "bytes of " << want.size() << " differ from the host emulation";
  EXPECT_EQ(bad_t, 0u) << "transposed bytes of " << want.size() << " differ";
  // The largest magnitude lands in the format's top binade, short of saturation.
  EXPECT_LE(a * s, fp8::max_finite(f));
  EXPECT_GT(2 * a * s, fp8::max_finite(f));

  // Without the transposed copy, the same bytes.
  CUDA_OK(cudaMemset(q.p, 0x7f, x.size()));
  myriad::cuda::cast_fp8(q.p, nullptr, dx.p, rows, cols, scale.p, f, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(q.download() == want);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Cast,
                         ::testing::Values(CastCase{64, 64, Format::e4m3}, CastCase{200, 72, Format::e4m3},
                                           CastCase{1024, 768, Format::e4m3}, CastCase{8, 4104, Format::e5m2},
                                           CastCase{4096, 2048, Format::e5m2}),
                         case_name);

TEST(Fp8Amax, NanMakesItInfiniteAndTheCastNan) {
  std::vector<float> x(1000, 0.5f);
  x[617] = NAN;
  Dev<bf16> dx(x.size());
  Dev<float> amax(1), scale(1);
  dx.upload(to_bf16(x));
  myriad::cuda::amax(amax.p, dx.p, int64_t(x.size()), nullptr);
  myriad::cuda::fp8_scales(scale.p, nullptr, amax.p, 1, Format::e4m3, nullptr);
  Dev<uint8_t> q(x.size());
  myriad::cuda::cast_fp8(q.p, nullptr, dx.p, 1, int(x.size()), scale.p, Format::e4m3, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(amax.download()[0], INFINITY);
  EXPECT_TRUE(std::isnan(scale.download()[0]));
  for (uint8_t b : q.download()) ASSERT_TRUE(std::isnan(fp8::decode(b, Format::e4m3))) << "every byte NaN";
}

// The scale of a tensor held in shards is the largest of their amaxes.
TEST(Fp8Amax, TheScaleOfShardsIsTheLargestAmaxs) {
  Dev<float> amaxes(4), scale(1), inv(1);
  const std::vector<float> a = {0.25f, 3.5f, 0.0f, 1.0f};
  amaxes.upload(a);
  scale.poison(), inv.poison();
  myriad::cuda::fp8_scales(scale.p, inv.p, amaxes.p, 4, Format::e5m2, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(scale.download()[0], fp8::scale_for(3.5f, Format::e5m2));
  EXPECT_EQ(inv.download()[0], 1.0f / fp8::scale_for(3.5f, Format::e5m2));
}

// The dequantized values of a device cast: decode(q) / scale, as the GEMM sees them.
std::vector<float> dequantized(const std::vector<uint8_t>& q, float scale, Format f) {
  std::vector<float> v(q.size());
  for (size_t i = 0; i < q.size(); ++i) v[i] = fp8::decode(q[i], f) / scale;
  return v;
}

// out (M,N) = a (M,K) . b (N,K)^T in float64.
std::vector<float> product_nt(const std::vector<float>& a, const std::vector<float>& b, int M, int K, int N) {
  std::vector<float> out(size_t(M) * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(a[size_t(i) * K + k]) * b[size_t(j) * K + k];
      out[size_t(i) * N + j] = float(s);
    }
  return out;
}

std::vector<float> transposed(const std::vector<float>& x, int rows, int cols) {
  std::vector<float> t(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[size_t(c) * rows + r] = x[size_t(r) * cols + c];
  return t;
}

// One operand cast on the device: its bytes in both layouts and its scale.
struct Cast {
  Dev<uint8_t> q, qt;
  Dev<float> amax, scale, inv;
  Format f;
  float host_scale;
  Cast(const Dev<bf16>& x, int rows, int cols, Format fmt)
      : q(x.n), qt(x.n), amax(1), scale(1), inv(1), f(fmt) {
    myriad::cuda::amax(amax.p, x.p, int64_t(x.n), nullptr);
    myriad::cuda::fp8_scales(scale.p, inv.p, amax.p, 1, f, nullptr);
    myriad::cuda::cast_fp8(q.p, qt.p, x.p, rows, cols, scale.p, f, nullptr);
    cudaDeviceSynchronize();
    host_scale = scale.download()[0];
  }
  myriad::cuda::Matmul::Fp8Tensor rows() const { return {q.p, inv.p, f}; }
  myriad::cuda::Matmul::Fp8Tensor cols() const { return {qt.p, inv.p, f}; }
  std::vector<float> values() const { return dequantized(q.download(), host_scale, f); }
};

TEST(Fp8Matmul, ProductsOfTheQuantizedOperandsAndBitwiseRepeatable) {
  std::mt19937_64 gen(seed());
  const int N = 256, IC = 512, OC = 384;
  const std::vector<float> x = with_outliers(size_t(N) * IC, gen, 1.0f), w = with_outliers(size_t(OC) * IC, gen, 0.02f),
                           dy = with_outliers(size_t(N) * OC, gen, 1e-3f), bias = round_bf16(randn(OC, gen));
  Dev<bf16> dx(x.size()), dw(w.size()), ddy(dy.size()), db(OC), out(size_t(N) * OC), dinp(x.size());
  Dev<float> dwt(w.size());
  dx.upload(to_bf16(x)), dw.upload(to_bf16(w)), ddy.upload(to_bf16(dy)), db.upload(to_bf16(bias));
  // The forward's operands in e4m3; the gradient in e5m2.
  const Cast cx(dx, N, IC, Format::e4m3), cw(dw, OC, IC, Format::e4m3), cdy(ddy, N, OC, Format::e5m2);
  const std::vector<float> xq = cx.values(), wq = cw.values(), dyq = cdy.values();
  myriad::cuda::Matmul mm;

  for (bool fast : {false, true}) {
    out.poison();
    mm.forward_fp8(out.p, cx.rows(), cw.rows(), db.p, N, IC, OC, fast, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> want = product_nt(xq, wq, N, IC, OC);
    for (size_t i = 0; i < want.size(); ++i) want[i] += bias[i % OC];
    // bf16 output: at most 2^-9 relative per element.
    EXPECT_LT(rel_err(to_float(out.download()), want), 3e-3) << "forward, fast accumulation " << fast;
  }

  // dinp = dy W (given W^T's bytes), written then accumulated.
  dinp.poison();
  mm.backward_input_fp8(dinp.p, cdy.rows(), cw.cols(), N, IC, OC, false, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> dinp_want = product_nt(dyq, transposed(wq, OC, IC), N, OC, IC);
  const std::vector<float> dinp_got = to_float(dinp.download());
  EXPECT_LT(rel_err(dinp_got, dinp_want), 3e-3);
  mm.backward_input_fp8(dinp.p, cdy.rows(), cw.cols(), N, IC, OC, true, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> twice = dinp_want;
  for (float& v : twice) v *= 2;
  EXPECT_LT(rel_err(to_float(dinp.download()), twice), 3e-3);

  // dW += dy^T x (given dy^T's and x^T's bytes), in fp32 onto what was there.
  const std::vector<float> g0 = randn(w.size(), gen, 1e-3f);
  dwt.upload(g0);
  mm.backward_weight_fp8(dwt.p, cdy.cols(), cx.cols(), N, IC, OC, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> dw_want = product_nt(transposed(dyq, N, OC), transposed(xq, N, IC), OC, N, IC);
  for (size_t i = 0; i < dw_want.size(); ++i) dw_want[i] += g0[i];
  const std::vector<float> dw_got = dwt.download();
  // Hopper's FP8 tensor cores accumulate below fp32 between cuBLASLt's promotions to fp32:
  // measured 1.7e-4 here (2026-12-03, H200), where a bf16 GEMM's fp32 accumulation gives 1e-6.
  EXPECT_LT(rel_err(dw_got, dw_want), 1e-3);

  // Bitwise repeatable.
  dwt.upload(g0);
  mm.backward_weight_fp8(dwt.p, cdy.cols(), cx.cols(), N, IC, OC, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(dwt.download() == dw_got);
}

// ---- Block scaling (train.fp8_scaling = "block") ----

// The tiled cast against the host's emulation (fp8::quantize_tiles): both layouts, each output's
// tiles along its own rows (1 x 128) or in 128 x 128 blocks, edge regions cut short, and the
// inverse scales where cuBLASLt reads them (the blocks' padding zero).
class Fp8Tiles : public ::testing::TestWithParam<CastCase> {};

TEST_P(Fp8Tiles, BothLayoutsAreTheHostsTiles) {
  const auto [rows, cols, f] = GetParam();
  std::mt19937_64 gen(seed());
  std::vector<float> x = with_outliers(size_t(rows) * cols, gen, 0.02f);
  x[size_t(rows / 2) * cols + 3] = 3072.0f;  // one tile's (one block's) own outlier, exact in bf16
  Dev<bf16> dx(x.size());
  dx.upload(to_bf16(x));
  const std::vector<float> xt = transposed(x, rows, cols);
  for (bool blocks : {false, true}) {
    SCOPED_TRACE(blocks ? "128 x 128 blocks" : "1 x 128 tiles");
    const int64_t n = fp8::tile_scales(rows, cols, blocks), nt = fp8::tile_scales(cols, rows, blocks);
    Dev<uint8_t> q(x.size()), qt(x.size());
    Dev<float> inv(n), inv_t(nt);
    CUDA_OK(cudaMemset(q.p, 0x7f, x.size()));
    CUDA_OK(cudaMemset(qt.p, 0x7f, x.size()));
    inv.poison(), inv_t.poison();
    myriad::cuda::cast_fp8_tiles(q.p, inv.p, qt.p, inv_t.p, dx.p, rows, cols, blocks, f, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> want(x.size()), want_t(x.size());
    std::vector<float> winv(n), winv_t(nt);
    fp8::quantize_tiles(want.data(), winv.data(), x.data(), rows, cols, blocks, f);
    fp8::quantize_tiles(want_t.data(), winv_t.data(), xt.data(), cols, rows, blocks, f);
    EXPECT_TRUE(q.download() == want) << "row-major bytes";
    EXPECT_TRUE(qt.download() == want_t) << "transposed bytes";
    EXPECT_TRUE(inv.download() == winv) << "row-major scales";
    EXPECT_TRUE(inv_t.download() == winv_t) << "transposed scales";
    // Either output alone: the same bytes and scales.
    CUDA_OK(cudaMemset(qt.p, 0x7f, x.size()));
    inv_t.poison();
    myriad::cuda::cast_fp8_tiles(nullptr, nullptr, qt.p, inv_t.p, dx.p, rows, cols, blocks, f, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_TRUE(qt.download() == want_t && inv_t.download() == winv_t) << "the transposed output alone";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Tiles,
                         ::testing::Values(CastCase{128, 128, Format::e4m3}, CastCase{144, 400, Format::e4m3},
                                           CastCase{512, 272, Format::e5m2}, CastCase{16, 2064, Format::e4m3},
                                           CastCase{2048, 768, Format::e5m2}),
                         case_name);

TEST(Fp8Tiles, ANanMakesItsOwnTileNan) {
  const int rows = 32, cols = 256;
  std::vector<float> x(size_t(rows) * cols, 0.5f);
  x[5 * cols + 200] = NAN;  // row 5, its second tile
  Dev<bf16> dx(x.size());
  dx.upload(to_bf16(x));
  Dev<uint8_t> q(x.size());
  Dev<float> inv(fp8::tile_scales(rows, cols, false));
  myriad::cuda::cast_fp8_tiles(q.p, inv.p, nullptr, nullptr, dx.p, rows, cols, false, Format::e4m3, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = inv.download();
  for (int kb = 0; kb < 2; ++kb)
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(std::isnan(got[size_t(kb) * rows + r]), kb == 1 && r == 5) << "tile " << kb << " of row " << r;
  const std::vector<uint8_t> b = q.download();
  EXPECT_TRUE(std::isnan(fp8::decode(b[5 * cols + 130], Format::e4m3)));
  EXPECT_FALSE(std::isnan(fp8::decode(b[5 * cols + 10], Format::e4m3)));
}

// One operand cast in tiles on the device, and its dequantized values as the GEMM sees them.
struct TiledCast {
  Dev<uint8_t> q, qt;
  Dev<float> inv, inv_t;
  int rows, cols;
  bool blocks;
  Format f;
  TiledCast(const Dev<bf16>& x, int r, int c, bool b, Format fmt)
      : q(x.n), qt(x.n), inv(fp8::tile_scales(r, c, b)), inv_t(fp8::tile_scales(c, r, b)), rows(r), cols(c),
        blocks(b), f(fmt) {
    myriad::cuda::cast_fp8_tiles(q.p, inv.p, qt.p, inv_t.p, x.p, rows, cols, blocks, f, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  myriad::cuda::Matmul::Scales scales() const {
    return blocks ? myriad::cuda::Matmul::Scales::kBlocks : myriad::cuda::Matmul::Scales::kTiles;
  }
  myriad::cuda::Matmul::Fp8Tensor row_major() const { return {q.p, inv.p, f, scales()}; }
  myriad::cuda::Matmul::Fp8Tensor transposed_() const { return {qt.p, inv_t.p, f, scales()}; }
  // decode(q) x its tile's inverse scale, (rows, cols), read back from the row-major cast.
  std::vector<float> values() const {
    const std::vector<uint8_t> b = q.download();
    const std::vector<float> s = inv.download();
    const int64_t row = (int64_t(cols) + 127) / 128, padded = (row + 3) / 4 * 4;
    std::vector<float> v(b.size());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        v[size_t(r) * cols + c] = fp8::decode(b[size_t(r) * cols + c], f) *
                                  (blocks ? s[size_t(r / 128) * padded + c / 128] : s[size_t(c / 128) * rows + r]);
    return v;
  }
};

// cuBLASLt's block-scaled GEMMs compute the product of the tiled operands: the forward (a weight
// in blocks by an activation in tiles, with the bias), the input gradient (the weight's transpose
// in blocks by the gradient in tiles, written and accumulated) and the weight gradient (both in
// tiles along the tokens, accumulated in fp32). And where one row holds a few values 2^20 times
// the rest's scale, the other rows' products come out nearer the exact ones than under per-tensor
// scaling, whose scale pushes every other value into the format's subnormals or to zero: what
// block scaling is for. (At 2^16 the two measured 1.5% against 5.9%, an H100, 2026-12-06.)
TEST(Fp8Tiles, ProductsOfTheTiledOperands) {
  std::mt19937_64 gen(seed());
  const int N = 256, IC = 512, OC = 384;
  std::vector<float> x = round_bf16(randn(size_t(N) * IC, gen, 1.0f)), w = round_bf16(randn(size_t(OC) * IC, gen, 0.02f)),
                     dy = round_bf16(randn(size_t(N) * OC, gen, 1e-3f)), bias = round_bf16(randn(OC, gen));
  for (int j : {7, 100, 300}) x[j] = 1048576.0f;  // row 0's outliers, 2^20: exact in bf16 and in e4m3 at any scale
  // Block (1, 2) of W gets a scale of its own (2^9 against the others' 2^12), which a misplaced
  // block would misapply.
  w[size_t(200) * IC + 300] = 0.5f;
  Dev<bf16> dx(x.size()), dw(w.size()), ddy(dy.size()), db(OC), out(size_t(N) * OC), dinp(x.size());
  Dev<float> dwt(w.size());
  dx.upload(to_bf16(x)), dw.upload(to_bf16(w)), ddy.upload(to_bf16(dy)), db.upload(to_bf16(bias));
  const TiledCast cx(dx, N, IC, false, Format::e4m3), cw(dw, OC, IC, true, Format::e4m3),
      cdy(ddy, N, OC, false, Format::e5m2);
  const std::vector<float> xq = cx.values(), wq = cw.values(), dyq = cdy.values();
  myriad::cuda::Matmul mm;

  out.poison();
  mm.forward_fp8(out.p, cx.row_major(), cw.row_major(), db.p, N, IC, OC, false, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> want = product_nt(xq, wq, N, IC, OC);
  for (size_t i = 0; i < want.size(); ++i) want[i] += bias[i % OC];
  const std::vector<float> got = to_float(out.download());
  // Row 0's few large outputs hold most of the norm, and one bf16 rounding reaches 2^-8 (3.9e-3);
  // rows 1.. below take the usual bound.
  EXPECT_LT(rel_err(got, want), 5e-3) << "forward";
  // Against the exact product of the bf16 operands, beside per-tensor scaling's.
  std::vector<float> exact = product_nt(x, w, N, IC, OC);
  for (size_t i = 0; i < exact.size(); ++i) exact[i] += bias[i % OC];
  const Cast tx(dx, N, IC, Format::e4m3), tw(dw, OC, IC, Format::e4m3);
  out.poison();
  mm.forward_fp8(out.p, tx.rows(), tw.rows(), db.p, N, IC, OC, false, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  auto past_row0 = [&](const std::vector<float>& v) { return std::vector<float>(v.begin() + OC, v.end()); };
  const double err_block = rel_err(past_row0(got), past_row0(exact)),
               err_tensor = rel_err(past_row0(to_float(out.download())), past_row0(exact));
  EXPECT_LT(err_block, err_tensor / 4) << "rows 1..: block scaling " << err_block << ", per-tensor " << err_tensor;
  EXPECT_LT(rel_err(past_row0(got), past_row0(want)), 3e-3) << "forward, rows 1..";

  dinp.poison();
  mm.backward_input_fp8(dinp.p, cdy.row_major(), cw.transposed_(), N, IC, OC, false, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> dinp_want = product_nt(dyq, transposed(wq, OC, IC), N, OC, IC);
  EXPECT_LT(rel_err(to_float(dinp.download()), dinp_want), 3e-3) << "input gradient";
  mm.backward_input_fp8(dinp.p, cdy.row_major(), cw.transposed_(), N, IC, OC, true, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> twice = dinp_want;
  for (float& v : twice) v *= 2;
  EXPECT_LT(rel_err(to_float(dinp.download()), twice), 3e-3) << "input gradient, accumulated";

  // The weight gradient's operands are tiled along the tokens: x^T's and dy^T's own casts.
  const std::vector<float> g0 = randn(w.size(), gen, 1e-3f);
  dwt.upload(g0);
  mm.backward_weight_fp8(dwt.p, cdy.transposed_(), cx.transposed_(), N, IC, OC, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> xtq(x.size()), dytq(dy.size());
  {
    const std::vector<uint8_t> bx = cx.qt.download(), bd = cdy.qt.download();
    const std::vector<float> sx = cx.inv_t.download(), sd = cdy.inv_t.download();
    for (int c = 0; c < IC; ++c)
      for (int n = 0; n < N; ++n) xtq[size_t(c) * N + n] = fp8::decode(bx[size_t(c) * N + n], Format::e4m3) * sx[size_t(n / 128) * IC + c];
    for (int c = 0; c < OC; ++c)
      for (int n = 0; n < N; ++n) dytq[size_t(c) * N + n] = fp8::decode(bd[size_t(c) * N + n], Format::e5m2) * sd[size_t(n / 128) * OC + c];
  }
  std::vector<float> dw_want = product_nt(dytq, xtq, OC, N, IC);
  for (size_t i = 0; i < dw_want.size(); ++i) dw_want[i] += g0[i];
  const std::vector<float> dw_got = dwt.download();
  EXPECT_LT(rel_err(dw_got, dw_want), 1e-3) << "weight gradient";
  dwt.upload(g0);
  mm.backward_weight_fp8(dwt.p, cdy.transposed_(), cx.transposed_(), N, IC, OC, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(dwt.download() == dw_got) << "bitwise repeatable";
}

// The engine in fp8 against itself in bf16 (both on the GPU): the same model, the same batches.
// One step: the losses within 1%, and each tensor's gradient (the first moment after one step,
// unclipped, over 1 - beta1) at cosine >= 0.99 to bf16's. Then six steps with losses within 2%.
// And two fp8 runs alike bit for bit.
class Fp8Engine : public ::testing::TestWithParam<engine_cases::Case> {};

// The amax a producer wrote (device float `produced`) against cuda::amax's of what it wrote
// (`measured`): equal, and positive.
void expect_the_amax_it_wrote(const float* produced, const float* measured, const char* what) {
  float p = 0, m = 0;
  EXPECT_EQ(cudaMemcpy(&p, produced, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(&m, measured, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_GT(p, 0.0f) << what;
  EXPECT_EQ(p, m) << what << ": the amax written against cuda::amax of what was written";
}

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return ab / std::sqrt(std::max(aa * bb, 1e-300));
}

// `fp8`: the sets that make the fp8 run of case c; `min_cosine` the gradients' bound.
void follows_bf16_and_repeats_bitwise(engine_cases::Case c, const std::vector<std::string>& fp8,
                                      double min_cosine = 0.99) {
  using namespace engine_cases;
  c.sets.push_back("optim.grad_clip=0");
  const myriad::Config bcfg = config(c, "cuda");
  const myriad::Config fcfg = config(Case{c.name, with(c.sets, fp8)}, "cuda");
  auto b = myriad::make_engine(bcfg), f = myriad::make_engine(fcfg), f2 = myriad::make_engine(fcfg);
  const int64_t P = b->layout().total();
  const double beta1 = bcfg.optim.beta1;
  for (int step = 1; step <= 6; ++step) {
    const std::vector<int32_t> tokens = batch(bcfg, 500 + step);
    const float lb = b->train_step(tokens.data(), step, 1e-3).loss, lf = f->train_step(tokens.data(), step, 1e-3).loss;
    EXPECT_EQ(lf, f2->train_step(tokens.data(), step, 1e-3).loss) << "two fp8 runs, step " << step;
    EXPECT_NEAR(lf, lb, (step == 1 ? 0.01 : 0.02) * lb) << "step " << step;
    if (step != 1) continue;
    b->state_to_host(), f->state_to_host();
    for (const myriad::ParamSpec& p : b->layout().tensors()) {
      if (p.name.find("attn.qkv.b") != std::string::npos) continue;  // the key bias: no gradient in exact arithmetic
      const double cs = cosine(f->host_state().m + p.offset, b->host_state().m + p.offset, p.numel);
      EXPECT_GE(cs, min_cosine) << p.name << ": the fp8 gradient's cosine to bf16's (first moments / " << 1 - beta1 << ")";
    }
  }
  f->state_to_host(), f2->state_to_host();
  EXPECT_EQ(engine_cases::rel(f->host_state().params, f2->host_state().params, P), 0.0);
  // A prompt of 2 x 37 tokens (not a multiple of 16) samples through bf16 GEMMs: finite logits.
  const std::vector<int32_t> tokens = batch(bcfg, 7);
  const int64_t Vp = bcfg.padded_vocab();
  std::vector<float> logits(2 * Vp);
  f->last_logits(tokens.data(), 2, 37, logits.data());
  EXPECT_TRUE(all_finite(logits));
}

TEST_P(Fp8Engine, FollowsBf16AndRepeatsBitwise) { follows_bf16_and_repeats_bitwise(GetParam(), {"train.precision=fp8"}); }

// train.fp8_lm_head: the LM head's three GEMMs in FP8 too, under the same bounds.
TEST(Fp8Engine, TheLmHeadInFp8FollowsBf16AndRepeatsBitwise) {
  follows_bf16_and_repeats_bitwise(engine_cases::Case{"llama_head", engine_cases::with(engine_cases::kLlama, {"model.seq_len=128"})},
                                   {"train.precision=fp8", "train.fp8_lm_head=true"});
}

// The cast buffers are held memory, as the memory plan counts them (model::fp8_cast_bytes, which
// the planner adds): an fp8 engine holds that many bytes more than the same bf16 one after a
// step, exactly, besides what the plan's slot and buffers hold apart in fp8 (the norms' outputs
// kept as casts, the kept casts' scalars: the engine checks those as it carves them); with the
// LM head in FP8 too, the head's operands counted. Two micro-batches a step: the weights' casts
// for the step (model::weight_cast_bytes) counted too, and an evaluation's forward after the step
// casts into them as well (the cast buffers never take a weight).
TEST(Fp8Memory, TheCastBuffersAreHeldAsPlanned) {
  using namespace engine_cases;
  for (const auto& [head, block] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    SCOPED_TRACE(std::string(head ? "fp8 LM head" : "block linears") + (block ? ", block scaling" : ""));
    const Case c{"llama", with(kLlama, {"model.seq_len=128"})};
    std::vector<std::string> sets = {"train.precision=fp8"};
    if (head) sets.push_back("train.fp8_lm_head=true");
    if (block) sets.push_back("train.fp8_scaling=block");
    const myriad::Config bcfg = config(c, "cuda"), fcfg = config(Case{c.name, with(c.sets, sets)}, "cuda");
    auto held_after_a_step = [](const myriad::Config& cfg) {
      auto e = myriad::make_engine(cfg);
      const std::vector<int32_t> tokens = batch(cfg, 3);
      e->train_step(tokens.data(), 1, 1e-3);
      e->loss(tokens.data(), static_cast<int>(cfg.train.micro_batch));  // an evaluation's forward, outside a step
      return myriad::cuda::CudaOps::held_bytes();
    };
    const int64_t bf16 = held_after_a_step(bcfg), fp8 = held_after_a_step(fcfg);
    myriad::model::GptMemoryShape s =
        myriad::model::memory_shape(fcfg.model, 1, fcfg.train.micro_batch, fcfg.padded_vocab());
    s.act_bytes = 2, s.fp8 = true, s.fp8_head = head, s.fp8_block = block, s.recompute = fcfg.train.recompute;
    s.logits_rows = myriad::model::logits_rows(fcfg.train.logits_mib, s.Vl, 2);
    s.micro_batches = fcfg.train.global_batch / fcfg.train.micro_batch;  // 2: the weights cast once a step
    myriad::model::GptMemoryShape b = s;
    b.fp8 = b.fp8_head = b.fp8_block = false;
    const int64_t L = fcfg.model.layers;
    const int64_t apart = myriad::model::slot_bytes(s, L, true) - myriad::model::slot_bytes(b, L, true) +
                          myriad::model::buffer_bytes(s) - myriad::model::buffer_bytes(b);
    EXPECT_GT(myriad::model::fp8_cast_bytes(s), 0);
    EXPECT_GT(myriad::model::weight_cast_bytes(s, L, 0, true), 0);
    EXPECT_EQ(fp8 - bf16, myriad::model::fp8_cast_bytes(s) + myriad::model::weight_cast_bytes(s, L, 0, true) + apart);
  }
}

INSTANTIATE_TEST_SUITE_P(Blocks, Fp8Engine,
                         ::testing::Values(engine_cases::Case{"gpt2", {}},
                                           engine_cases::Case{"llama_cudnn", engine_cases::with(engine_cases::kLlama,
                                                                                             {"model.seq_len=128"})}),
                         [](const auto& i) { return std::string(i.param.name); });

// Block scaling (train.fp8_scaling = "block"), under the same bounds: Llama's block under recompute
// none (its norms' outputs kept in bf16, no cast kept), GPT-2's under selective recompute (the
// activation recomputed into bf16 before its tiles) with the LM head in FP8 too.
TEST(Fp8Engine, BlockScalingFollowsBf16AndRepeatsBitwise) {
  using namespace engine_cases;
  follows_bf16_and_repeats_bitwise(Case{"llama_block", with(kLlama, {"model.seq_len=128"})},
                                   {"train.precision=fp8", "train.fp8_scaling=block"});
  follows_bf16_and_repeats_bitwise(Case{"gpt2_block", {"train.recompute=selective"}},
                                   {"train.precision=fp8", "train.fp8_scaling=block", "train.fp8_lm_head=true"});
}

// Qwen3's attention in FP8: a head size apart from d_model / heads (128 over 4 heads of d 256)
// and per-head query-key norms after the FP8 QKV GEMM. The losses and bitwise repeats as above;
// the gradients' cosine bound is 0.98: the norms' weights (ln1, ln2, q_norm, k_norm) and the fc
// weight measured 0.9885 to 0.9899 at the first step (an H100, 2026-12-05), where the other
// blocks pass 0.99. Their gradients sum over every row and head what the FP8 GEMMs' rounding
// perturbs, through the norm's backward; a wrong gradient would be far below either bound.
TEST(Fp8Engine, QwenQueryKeyNormsFollowBf16AndRepeatBitwise) {
  follows_bf16_and_repeats_bitwise(
      engine_cases::Case{"qwen3_qk_norm",
                         engine_cases::with(engine_cases::kLlama, {"model.seq_len=128", "model.head_dim=128", "model.qk_norm=head"})},
      {"train.precision=fp8"}, 0.98);
}

// The other recipe: e4m3 gradients, fast accumulation in the forward (train.fp8_gradients,
// train.fp8_fast_accum), under the same bounds.
TEST(Fp8Engine, TheE4m3GradientRecipeFollowsBf16AndRepeatsBitwise) {
  follows_bf16_and_repeats_bitwise(engine_cases::Case{"llama_e4m3", engine_cases::with(engine_cases::kLlama, {"model.seq_len=128"})},
                                   {"train.precision=fp8", "train.fp8_gradients=e4m3", "train.fp8_fast_accum=true"});
}

// Tensor parallelism: two op sets, "ranks" on a thread each, hold the two halves of a weight's rows
// (a column-parallel linear). Their amaxes meet (fp8::AmaxGroup), so each half is cast with the
// whole weight's scale, and the two outputs are the one-GPU output's halves. Rank 1's rows are
// 2^-14 of rank 0's: on one GPU they sit in e4m3's subnormals, coarsely; scaled by their own amax
// they would not. The same ranks without the group show that the check can fail.
TEST(Fp8Group, ShardsScaledAsTheWholeTensorComputeWhatOneGpuComputes) {
  using myriad::cuda::CudaOps;
  const int N = 256, IC = 512, OC = 256, half = OC / 2;
  std::mt19937_64 gen(seed());
  const std::vector<float> x = round_bf16(randn(size_t(N) * IC, gen, 1.0f));
  std::vector<float> w = randn(size_t(OC) * IC, gen, 0.02f);
  for (size_t i = size_t(half) * IC; i < w.size(); ++i) w[i] = std::ldexp(w[i], -14);
  w = round_bf16(w);
  Dev<bf16> dx(x.size()), dw(w.size()), dy(size_t(N) * OC);
  dx.upload(to_bf16(x)), dw.upload(to_bf16(w)), dy.poison();
  {
    CudaOps one;
    one.set_fp8(fp8::Recipe{}, {});
    one.linear_forward(dy.p, dx.p, dw.p, nullptr, N, IC, OC, myriad::Gemm::kFp8);
    CUDA_OK(cudaStreamSynchronize(one.stream()));
  }
  const std::vector<float> y = to_float(dy.download());

  // Rank r's output columns [r half, (r+1) half) against the one GPU's: the rms of the differences
  // over the columns' rms, the larger of the two ranks'.
  auto ranks_part_from_one = [&](bool grouped) {
    Dev<float> board(2);
    std::barrier meet(2);
    std::vector<std::vector<float>> out(2);
    auto rank = [&](int r) {
      CudaOps ops;
      fp8::AmaxGroup group;
      if (grouped)
        // A failed copy is recorded, never returned from: the peer waits at the barrier.
        group = {2, [&, r, s = ops.stream()](const float* local, float* all) {
                   EXPECT_EQ(cudaMemcpyAsync(board.p + r, local, sizeof(float), cudaMemcpyDeviceToDevice, s), cudaSuccess);
                   EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
                   meet.arrive_and_wait();
                   EXPECT_EQ(cudaMemcpyAsync(all, board.p, 2 * sizeof(float), cudaMemcpyDeviceToDevice, s), cudaSuccess);
                   EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
                   meet.arrive_and_wait();  // both have read the board before the next cast writes it
                 }};
      ops.set_fp8(fp8::Recipe{}, std::move(group));
      Dev<bf16> y_r(size_t(N) * half);
      y_r.poison();
      ops.linear_forward(y_r.p, dx.p, dw.p + size_t(r) * half * IC, nullptr, N, IC, half, myriad::Gemm::kFp8);
      CUDA_OK(cudaStreamSynchronize(ops.stream()));
      out[r] = to_float(y_r.download());
    };
    std::thread t1(rank, 1);
    rank(0);
    t1.join();
    double worst = 0;
    for (int r = 0; r < 2; ++r) {
      double rms = 0, diff = 0;
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < half; ++c) {
          const double want = y[size_t(n) * OC + r * half + c];
          const double d = out[r][size_t(n) * half + c] - want;
          rms += want * want, diff += d * d;
        }
      worst = std::max(worst, std::sqrt(diff / rms));
    }
    return worst;
  };
  const double grouped = ranks_part_from_one(true), alone = ranks_part_from_one(false);
  EXPECT_LT(grouped, 0.005) << "the shards' outputs part from one GPU's, with the amaxes met";
  EXPECT_GT(alone, 0.05) << "scaled by their own amaxes, the shards still compute what one GPU computes: the check "
                           "above cannot fail";
}

// What a forward keeps of its input's cast (fp8::Kept) gives the backward the bits a fresh cast
// gives: the transposed bytes themselves (the norms' outputs under recompute none: the input the
// backward is handed is then NaN, and must not be read), or the scale alone (the other inputs,
// cast without a second amax pass; the MLP projection's input, recomputed from fc). The
// reference is the backward without a keep; a scale kept from a tensor 64 times larger shows that
// the comparison can fail.
TEST(Fp8Kept, TheBackwardComputesTheSameBitsFromWhatTheForwardKept) {
  using myriad::Gemm;
  using myriad::Mlp;
  const int N = 256, IC = 512, OC = 384, F = 256;
  std::mt19937_64 gen(seed());
  myriad::cuda::CudaOps ops;
  ops.set_fp8(fp8::Recipe{}, {});
  Dev<bf16> x(size_t(N) * IC), big(size_t(N) * IC), nan(size_t(N) * IC), w(size_t(OC) * IC), dy(size_t(N) * OC),
      y(size_t(N) * OC), dx(size_t(N) * IC);
  const std::vector<float> xs = with_outliers(x.n, gen, 1.0f);
  std::vector<float> xs64 = xs;
  for (float& v : xs64) v *= 64;
  x.upload(to_bf16(xs)), big.upload(to_bf16(xs64)), nan.poison();
  w.upload(to_bf16(round_bf16(randn(w.n, gen, 0.02f)))), dy.upload(to_bf16(round_bf16(randn(dy.n, gen, 0.1f))));
  Dev<float> dw(size_t(OC) * IC), scalars(fp8::kept_floats(1));
  Dev<uint8_t> bytes(size_t(IC) * N);
  struct Grads {
    std::vector<bf16> dx;
    std::vector<float> dw;
  };
  // kind: 0 no keep, 1 the scale kept, 2 the bytes kept, 3 the scale kept from 64 x.
  auto run = [&](int kind) {
    fp8::Kept k{scalars.p, kind == 2 ? bytes.p : nullptr};
    ops.linear_forward(y.p, kind == 3 ? big.p : x.p, w.p, nullptr, N, IC, OC, Gemm::kFp8, kind ? &k : nullptr);
    dw.zero(), dx.poison();
    ops.linear_backward(Mlp::kGelu, dx.p, dw.p, nullptr, dy.p, kind == 2 ? nan.p : x.p, w.p, nullptr, N, IC, OC,
                        /*accumulate=*/false, Gemm::kFp8, kind ? &k : nullptr);
    EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
    return Grads{dx.download(), dw.download()};
  };
  const Grads ref = run(0), scale = run(1), kept = run(2), wrong = run(3);
  auto same = [](const Grads& a, const Grads& b) {
    return std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * sizeof(bf16)) == 0 && a.dw == b.dw;
  };
  EXPECT_TRUE(same(scale, ref)) << "x^T cast at the kept scale";
  EXPECT_TRUE(same(kept, ref)) << "x^T kept as bytes";
  EXPECT_FALSE(same(wrong, ref)) << "a scale kept from another tensor changes nothing: the check cannot fail";

  // The MLP's projection: its input (the activation's output) recomputed from pre in the
  // backward, cast at the forward's kept scale.
  for (const Mlp m : {Mlp::kSwiGlu, Mlp::kGelu}) {
    const int P = F * (m == Mlp::kSwiGlu ? 2 : 1);
    Dev<bf16> w1(size_t(P) * IC), pre(size_t(N) * P), act(size_t(N) * F), w2(size_t(OC) * F), dpre(size_t(N) * P);
    Dev<float> dw2(size_t(OC) * F);
    w1.upload(to_bf16(round_bf16(randn(w1.n, gen, 0.05f)))), w2.upload(to_bf16(round_bf16(randn(w2.n, gen, 0.02f))));
    ops.linear_act_forward(m, act.p, pre.p, x.p, w1.p, nullptr, N, IC, F, Gemm::kFp8);
    auto projection = [&](bool keep) {
      fp8::Kept k{scalars.p, nullptr};
      ops.linear_forward(y.p, act.p, w2.p, nullptr, N, F, OC, Gemm::kFp8, keep ? &k : nullptr);
      dw2.zero(), dpre.poison();
      ops.linear_backward(m, dpre.p, dw2.p, nullptr, dy.p, nullptr, w2.p, pre.p, N, F, OC, /*accumulate=*/false,
                          Gemm::kFp8, keep ? &k : nullptr);
      EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
      return Grads{dpre.download(), dw2.download()};
    };
    EXPECT_TRUE(same(projection(true), projection(false))) << (m == Mlp::kSwiGlu ? "SwiGLU" : "GELU");
  }
}

// A weight cast once for the step (fp8_cast_weight into an fp8::WeightCast) gives the GEMMs the
// bytes and scales that each call's own cast gives: the forward's output and the backward's input
// and weight gradients are the same bits, per tensor and per block, with the weight's bf16 then
// unread (poisoned). The cast of another weight changes them: the check can fail.
TEST(Fp8WeightCast, TheGemmsReadWhatTheirOwnCastsWouldMake) {
  using myriad::Gemm;
  using myriad::Mlp;
  const int N = 256, IC = 512, OC = 384;
  std::mt19937_64 gen(seed());
  Dev<bf16> x(size_t(N) * IC), w(size_t(OC) * IC), other(size_t(OC) * IC), poisoned(size_t(OC) * IC),
      dy(size_t(N) * OC), y(size_t(N) * OC), dx(size_t(N) * IC);
  x.upload(to_bf16(with_outliers(x.n, gen, 1.0f))), dy.upload(to_bf16(round_bf16(randn(dy.n, gen, 0.1f))));
  w.upload(to_bf16(with_outliers(w.n, gen, 0.02f))), other.upload(to_bf16(with_outliers(w.n, gen, 0.02f)));
  poisoned.poison();
  Dev<float> dw(size_t(OC) * IC);
  Dev<uint8_t> bytes(2 * size_t(OC) * IC);
  struct Out {
    std::vector<bf16> y, dx;
    std::vector<float> dw;
    bool operator==(const Out& o) const {
      return std::memcmp(y.data(), o.y.data(), y.size() * sizeof(bf16)) == 0 &&
             std::memcmp(dx.data(), o.dx.data(), dx.size() * sizeof(bf16)) == 0 && dw == o.dw;
    }
  };
  for (const fp8::Scaling sc : {fp8::Scaling::tensor, fp8::Scaling::block}) {
    SCOPED_TRACE(sc == fp8::Scaling::block ? "block scaling" : "per tensor");
    myriad::cuda::CudaOps ops;
    fp8::Recipe r;
    r.scaling = sc;
    ops.set_fp8(r, {});
    Dev<float> scales(fp8::weight_cast_floats(OC, IC, sc, 1));
    const fp8::WeightCast cast{bytes.p, bytes.p + size_t(OC) * IC, scales.p,
                               scales.p + (sc == fp8::Scaling::block ? fp8::weight_cast_t_offset(OC, IC) : 0)};
    auto run = [&](const bf16* weight, const fp8::WeightCast* c) {
      y.poison(), dx.poison(), dw.zero();
      ops.linear_forward(y.p, x.p, weight, nullptr, N, IC, OC, Gemm::kFp8, nullptr, c);
      ops.linear_backward(Mlp::kGelu, dx.p, dw.p, nullptr, dy.p, x.p, weight, nullptr, N, IC, OC,
                          /*accumulate=*/false, Gemm::kFp8, nullptr, nullptr, nullptr, c);
      EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
      return Out{y.download(), dx.download(), dw.download()};
    };
    const Out each_call = run(w.p, nullptr);
    ops.fp8_cast_weight(cast, w.p, OC, IC);
    EXPECT_TRUE(run(poisoned.p, &cast) == each_call) << "the GEMMs from the weight's cast";
    EXPECT_TRUE(run(poisoned.p, &cast) == each_call) << "read again: the cast is not consumed";
    ops.fp8_cast_weight(cast, other.p, OC, IC);
    EXPECT_FALSE(run(poisoned.p, &cast) == each_call) << "another weight's cast";
  }
}

// The model under fix_weights() (the engine's train_step holds it) with two micro-batches a step,
// full recompute and the LM head in FP8 over several row chunks: every weight is cast once a step
// (model::casts_block_weights_once, casts_head_once), and the step computes the losses and
// gradients of the same model without fix_weights(), whose block linears cast per call (its head
// once per call), bit for bit, per tensor and per block. A second step after new weights must
// recast them: a stale cast would differ. A third, the two models given different weights, shows
// that the comparison is not vacuous.
TEST(Fp8WeightCast, AStepThatCastsEachWeightOnceComputesWhatCastingPerCallComputes) {
  using Model = myriad::GptModel<myriad::cuda::CudaOps>;
  for (const char* scaling : {"tensor", "block"}) {
    SCOPED_TRACE(scaling);
    std::vector<std::string> sets = engine_cases::with(engine_cases::kLlama, {"model.seq_len=128"});
    for (const char* kv : {"train.precision=fp8", "train.fp8_lm_head=true", "train.recompute=full",
                           "train.micro_batch=2", "train.global_batch=4", "train.logits_mib=0.1"})
      sets.push_back(kv);
    sets.push_back(std::string("train.fp8_scaling=") + scaling);
    const myriad::Config cfg = myriad::parse_config("", "weight casts", sets);
    Model once(cfg), each(cfg);
    myriad::model::GptMemoryShape ms = myriad::model::memory_shape(cfg.model, 1, 2, cfg.padded_vocab());
    ms.fp8 = ms.fp8_head = true, ms.recompute = "full", ms.micro_batches = 2;
    ms.logits_rows = myriad::model::logits_rows(cfg.train.logits_mib, ms.Vl, 2);
    ASSERT_TRUE(myriad::model::casts_block_weights_once(ms) && myriad::model::casts_head_once(ms));
    ASSERT_GT(myriad::model::head_chunks(ms), 1);
    const int B = 2, T = static_cast<int>(cfg.model.seq_len);
    const int64_t P = once.num_params();
    auto grads = [&](Model& m) {
      cudaDeviceSynchronize();
      std::vector<float> h(P);
      cudaMemcpy(h.data(), m.grads(), P * 4, cudaMemcpyDeviceToHost);
      return h;
    };
    auto step = [&](Model& m, bool fixed, uint64_t seed) {
      std::vector<float> losses;
      auto micro_batches = [&] {
        for (int mb = 0; mb < 2; ++mb) {
          const std::vector<int32_t> tokens = engine_cases::batch(cfg, seed + mb);
          losses.push_back(m.forward_backward(tokens.data(), B, 0.5f));
        }
      };
      m.zero_grads();
      if (fixed) {
        const auto guard = m.fix_weights();
        micro_batches();
      } else {
        micro_batches();
      }
      return std::pair{losses, grads(m)};
    };
    // New weights for both models: this step's gradients, scaled, added to each parameter.
    auto perturb = [&](Model& m, float by) {
      std::vector<bf16> p(P);
      const std::vector<float> g = grads(m);
      cudaMemcpy(p.data(), m.params(), P * sizeof(bf16), cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < P; ++i) p[i] = __float2bfloat16(__bfloat162float(p[i]) - by * g[i]);
      cudaMemcpy(m.params(), p.data(), P * sizeof(bf16), cudaMemcpyHostToDevice);
    };
    EXPECT_TRUE(step(once, true, 11) == step(each, false, 11)) << "step 1";
    perturb(once, 1.0f), perturb(each, 1.0f);
    EXPECT_TRUE(step(once, true, 21) == step(each, false, 21)) << "step 2, new weights";
    perturb(once, 1.0f), perturb(each, 2.0f);
    EXPECT_FALSE(step(once, true, 31) == step(each, false, 31)) << "other weights";
  }
}

// The activation measures the amax of what it writes, exactly as cuda::amax measures it
// afterwards (NaN included): forward its output (the MLP projection's input: a keep with
// producer_amax), backward the input gradient (dfc, the fc GEMM's output gradient). The linears
// that take those amaxes compute the bits of ones that measure them themselves.
// The norms measure the amax of what they write (RMSNorm and LayerNorm, plain and fused with the
// residual add, the vectorized path and the scalar one), exactly cuda::amax of their output, whose
// bits do not change; per-tensor scaling only (block scaling takes no tensor's amax); a NaN makes
// it infinite.
TEST(Fp8Kept, TheNormsMeasureTheAmaxesTheyWrite) {
  using myriad::Norm;
  using myriad::NormKind;
  std::mt19937_64 gen(seed());
  myriad::cuda::CudaOps ops;
  ops.set_fp8(fp8::Recipe{}, {});
  Dev<float> scalars(fp8::kept_floats(1)), measured(1), mean(512), rstd(512);
  for (const int C : {384, 200}) {  // 200: C % 8 != 0, the scalar path
    const int N = 512;
    Dev<bf16> a(size_t(N) * C), b(a.n), resid(a.n), out(a.n), w(C), bias(C);
    a.upload(to_bf16(with_outliers(a.n, gen, 1.0f))), b.upload(to_bf16(randn(b.n, gen, 0.5f)));
    w.upload(to_bf16(round_bf16(randn(C, gen, 1.0f)))), bias.upload(to_bf16(round_bf16(randn(C, gen, 0.1f))));
    for (const NormKind kind : {NormKind::kRMSNorm, NormKind::kLayerNorm})
      for (bool fused : {false, true}) {
        SCOPED_TRACE(std::string(kind == NormKind::kRMSNorm ? "RMSNorm" : "LayerNorm") + (fused ? ", fused" : "") +
                     ", C " + std::to_string(C));
        const Norm n{kind, 1e-5f};
        std::vector<bf16> outs[2];
        for (int produced : {0, 1}) {
          const fp8::Kept k{scalars.p, nullptr, produced == 1};
          out.poison(), scalars.poison();
          if (fused)
            ops.residual_norm_forward(n, resid.p, out.p, mean.p, rstd.p, a.p, b.p, w.p, bias.p, N, C, &k);
          else
            ops.norm_forward(n, out.p, mean.p, rstd.p, a.p, w.p, bias.p, N, C, &k);
          EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
          outs[produced] = out.download();
        }
        myriad::cuda::amax(measured.p, out.p, int64_t(out.n), ops.stream());
        EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
        expect_the_amax_it_wrote(scalars.p, measured.p, "the norm");
        EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(bf16)), 0);
      }
  }
  // Block scaling: no amax is written (the scalars keep what was there).
  fp8::Recipe block;
  block.scaling = fp8::Scaling::block;
  ops.set_fp8(block, {});
  const int N = 64, C = 128;
  Dev<bf16> x(size_t(N) * C), out(x.n), w(C);
  x.upload(to_bf16(randn(x.n, gen, 1.0f))), w.upload(to_bf16(std::vector<float>(C, 1.0f)));
  const std::vector<float> sentinel(scalars.n, -7.0f);
  scalars.upload(sentinel);
  const fp8::Kept k{scalars.p, nullptr, true};
  ops.norm_forward(Norm{NormKind::kRMSNorm, 1e-5f}, out.p, nullptr, rstd.p, x.p, w.p, nullptr, N, C, &k);
  EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
  EXPECT_TRUE(scalars.download() == sentinel);
  // A NaN in the input: the amax is infinite, as cuda::amax makes it.
  ops.set_fp8(fp8::Recipe{}, {});
  std::vector<float> h = round_bf16(randn(x.n, gen, 1.0f));
  h[5 * C + 7] = NAN;
  x.upload(to_bf16(h));
  ops.norm_forward(Norm{NormKind::kRMSNorm, 1e-5f}, out.p, nullptr, rstd.p, x.p, w.p, nullptr, N, C, &k);
  EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
  EXPECT_EQ(scalars.download()[0], INFINITY);
}

TEST(Fp8Kept, TheActivationMeasuresTheAmaxesItWrites) {
  using myriad::Gemm;
  using myriad::Mlp;
  const int N = 256, C = 384, F = 512, OC = 384;
  std::mt19937_64 gen(seed());
  myriad::cuda::CudaOps ops;
  ops.set_fp8(fp8::Recipe{}, {});
  for (const Mlp m : {Mlp::kSwiGlu, Mlp::kGelu}) {
    SCOPED_TRACE(m == Mlp::kSwiGlu ? "SwiGLU" : "GELU");
    const int P = F * (m == Mlp::kSwiGlu ? 2 : 1);
    Dev<bf16> x(size_t(N) * C), w1(size_t(P) * C), pre(size_t(N) * P), act(size_t(N) * F), w2(size_t(OC) * F),
        dy(size_t(N) * OC), y(size_t(N) * OC), dpre(size_t(N) * P), dx(size_t(N) * C);
    Dev<float> dw1(w1.n), dw2(w2.n), scalars(fp8::kept_floats(1)), measured(1);
    x.upload(to_bf16(with_outliers(x.n, gen, 1.0f)));
    w1.upload(to_bf16(round_bf16(randn(w1.n, gen, 0.05f)))), w2.upload(to_bf16(round_bf16(randn(w2.n, gen, 0.02f))));
    dy.upload(to_bf16(with_outliers(dy.n, gen, 0.1f)));
    // Forward: the projection's input's amax from the activation, or measured by the cast.
    std::vector<bf16> ys[2];
    for (int produced : {0, 1}) {
      fp8::Kept k{scalars.p, nullptr, produced == 1};
      y.poison();
      ops.linear_act_forward(m, act.p, pre.p, x.p, w1.p, nullptr, N, C, F, Gemm::kFp8, nullptr, &k);
      if (produced) myriad::cuda::amax(measured.p, act.p, int64_t(act.n), ops.stream());
      ops.linear_forward(y.p, act.p, w2.p, nullptr, N, F, OC, Gemm::kFp8, &k);
      EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
      ys[produced] = y.download();
    }
    {
      expect_the_amax_it_wrote(scalars.p, measured.p, "the activation's forward");
      EXPECT_EQ(std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(bf16)), 0);
    }
    auto backward = [&](bool handed) {
      fp8::Kept k{scalars.p, nullptr};
      dw1.zero(), dw2.zero(), dpre.poison(), dx.poison();
      ops.linear_backward(m, dpre.p, dw2.p, nullptr, dy.p, act.p, w2.p, pre.p, N, F, OC, /*accumulate=*/false,
                          Gemm::kFp8, nullptr, handed ? &k : nullptr);
      if (handed) myriad::cuda::amax(measured.p, dpre.p, int64_t(dpre.n), ops.stream());
      ops.linear_backward(Mlp::kGelu, dx.p, dw1.p, nullptr, dpre.p, x.p, w1.p, nullptr, N, C, P, /*accumulate=*/false,
                          Gemm::kFp8, nullptr, nullptr, handed ? &k : nullptr);
      EXPECT_EQ(cudaStreamSynchronize(ops.stream()), cudaSuccess);
      return std::make_tuple(dx.download(), dw1.download(), dpre.download());
    };
    const auto [dx0, dw0, dpre0] = backward(false);
    const auto [dx1, dw1h, dpre1] = backward(true);
    expect_the_amax_it_wrote(scalars.p, measured.p, "the activation's backward");
    EXPECT_EQ(std::memcmp(dpre0.data(), dpre1.data(), dpre0.size() * sizeof(bf16)), 0);
    EXPECT_EQ(std::memcmp(dx0.data(), dx1.data(), dx0.size() * sizeof(bf16)), 0);
    EXPECT_EQ(dw0, dw1h);
  }
  // A NaN in the gradient makes the produced amax infinite, as cuda::amax's.
  const int n = 4096;
  Dev<bf16> gu(2 * size_t(n)), d(n), dgu(2 * size_t(n));
  std::vector<float> h = round_bf16(randn(d.n, gen, 1.0f));
  h[1234] = NAN;
  d.upload(to_bf16(h)), gu.upload(to_bf16(round_bf16(randn(gu.n, gen, 1.0f))));
  Dev<float> a(1);
  myriad::cuda::swiglu_backward(dgu.p, gu.p, d.p, 1, n, ops.stream(), a.p);
  float got = 0;
  EXPECT_EQ(cudaMemcpy(&got, a.p, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::isinf(got)) << got;
}

TEST(Fp8Engine, RefusesWhatItCannotCompute) {
  using namespace engine_cases;
  // A micro-batch of 2 x 95 tokens: not a multiple of 16. The parallel layout refuses it when
  // the config is checked (core/parallel_layout.h), before any engine is made.
  try {
    const myriad::Config cfg = config(Case{"odd", {"train.precision=fp8", "model.seq_len=95"}}, "cuda");
    myriad::make_engine(cfg);
    ADD_FAILURE() << "an fp8 engine of 190-token micro-batches was built";
  } catch (const myriad::Error& e) {
    EXPECT_EQ(e.cls(), myriad::ErrorClass::kInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
