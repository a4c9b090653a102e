// Bitwise determinism of the engine's building blocks across fresh handles and buffers whose
// previous contents differ: what the engine's same-seed-same-losses guarantee rests on.
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "model/cuda/matmul.h"
#include "ops/cuda/ops.cuh"

using namespace gpu_test;
namespace mc = myriad::cuda;

namespace {

// Runs `body` twice, each time on fresh buffers prefilled with a different garbage byte, and
// returns both outputs.
template <class F>
std::pair<std::vector<float>, std::vector<float>> twice(F body) {
  return {body(0x00), body(0x7F)};
}

TEST(Determinism, LmHeadGemmsAcrossHandles) {
  const int N = 192, C = 256, Vp = 384;
  std::mt19937_64 gen(seed());
  auto dl = to_bf16(randn(N * Vp, gen, 0.01f)), w = to_bf16(randn(Vp * C, gen, 0.02f)), x = to_bf16(randn(N * C, gen));
  auto [a, b] = twice([&](int fill) {
    Dev<bf16> ddl(N * Vp), dw(Vp * C), dx(N * C), din(N * C);
    Dev<float> dg(Vp * C);
    cudaMemset(din.p, fill, N * C * 2);
    cudaMemset(dg.p, 0, Vp * C * 4);
    ddl.upload(dl), dw.upload(w), dx.upload(x);
    mc::Matmul mm;
    mm.backward_input(din.p, ddl.p, dw.p, N, C, Vp, false, nullptr);
    mm.backward_weight(dg.p, ddl.p, dx.p, N, C, Vp, nullptr);
    cudaDeviceSynchronize();
    std::vector<float> out = to_float(din.download()), g = dg.download();
    out.insert(out.end(), g.begin(), g.end());
    return out;
  });
  EXPECT_TRUE(a == b);
}

TEST(Determinism, SumOfSquaresOfAllGradients) {
  const int64_t n = 3'400'000;
  std::mt19937_64 gen(seed());
  auto x = randn(n, gen, 1e-3f);
  auto [a, b] = twice([&](int fill) {
    Dev<float> dx(n), out(1), scratch(mc::sumsq_scratch_floats(n, 150));
    Dev<int64_t> seg(2);
    dx.upload(x);
    seg.upload({0, n});
    cudaMemset(scratch.p, fill, scratch.n * 4);
    mc::segment_sum_squares(out.p, scratch.p, dx.p, seg.p, 1, n, nullptr);
    cudaDeviceSynchronize();
    return out.download();
  });
  EXPECT_EQ(a[0], b[0]);
}

TEST(Determinism, LayerNormBackwardAndCrossEntropy) {
  const int N = 192, C = 256, V = 300, Vp = 384;
  std::mt19937_64 gen(seed());
  auto inp = to_bf16(randn(N * C, gen)), dout = to_bf16(randn(N * C, gen)), w = to_bf16(randn(C, gen, 0.1f, 1.0f));
  auto logits = to_bf16(randn(N * Vp, gen));
  std::vector<int32_t> targets(N);
  for (auto& t : targets) t = gen() % V;
  auto [a, b] = twice([&](int fill) {
    Dev<bf16> di(N * C), dd(N * C), dw(C), out(N * C), din(N * C), lg(N * Vp);
    Dev<float> mean(N), rstd(N), gw(C), gb(C), scratch(mc::layernorm_scratch_floats(N, C)), losses(N);
    Dev<int32_t> tg(N);
    di.upload(inp), dd.upload(dout), dw.upload(w), lg.upload(logits), tg.upload(targets);
    cudaMemset(scratch.p, fill, scratch.n * 4);
    din.zero(), gw.zero(), gb.zero();
    mc::layernorm_forward(out.p, mean.p, rstd.p, di.p, dw.p, nullptr, N, C, nullptr);
    mc::layernorm_backward(din.p, gw.p, gb.p, scratch.p, dd.p, di.p, dw.p, mean.p, rstd.p, N, C, nullptr);
    mc::crossentropy(losses.p, lg.p, tg.p, 1.0f / N, N, V, Vp, nullptr);
    cudaDeviceSynchronize();
    std::vector<float> r = to_float(din.download()), g = gw.download(), bb = gb.download(), l = to_float(lg.download());
    r.insert(r.end(), g.begin(), g.end());
    r.insert(r.end(), bb.begin(), bb.end());
    r.insert(r.end(), l.begin(), l.end());
    return r;
  });
  EXPECT_TRUE(a == b);
}

}  // namespace

namespace {

TEST(Determinism, AttentionBackwardWithWindow) {
  const int B = 2, T = 96, H = 4, D = 64, W = 33;
  std::mt19937_64 gen(seed());
  auto qkv = to_bf16(randn(size_t(B) * T * H * 3 * D, gen)), dout = to_bf16(randn(size_t(B) * T * H * D, gen));
  auto [a, b] = twice([&](int fill) {
    Dev<bf16> dq(qkv.size()), dd(dout.size()), out(dout.size()), dqkv(qkv.size());
    Dev<float> lse(size_t(B) * H * T), scratch(mc::attention_scratch_floats(B, T, H, D));
    dq.upload(qkv), dd.upload(dout);
    cudaMemset(scratch.p, fill, scratch.n * 4);
    cudaMemset(dqkv.p, fill, dqkv.n * 2);
    mc::attention_forward(out.p, lse.p, dq.p, B, T, H, H, D, W, nullptr);
    mc::attention_backward(dqkv.p, scratch.p, dd.p, out.p, dq.p, lse.p, B, T, H, H, D, W, nullptr);
    cudaDeviceSynchronize();
    return to_float(dqkv.download());
  });
  EXPECT_TRUE(a == b);
}

}  // namespace
