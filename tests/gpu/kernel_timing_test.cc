// Timings of the memory-bound kernels at training sizes (GPT-2 XL-like: N = 16384 tokens,
// C = 2048, Vp = 50304), with CUDA events: mean of 20 runs after 3 warm-up runs, in
// microseconds, with the bandwidth the bytes each kernel must move imply. Asserts only that
// nothing failed; the numbers are for reading.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <type_traits>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "ops/cuda/ops.cuh"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;

// Random values: a 1M-element random block copied over the buffer (fast to make).
template <class T>
void fill(Dev<T>& d, std::mt19937_64& gen, float std = 1.0f) {
  const size_t block = std::min<size_t>(d.n, size_t(1) << 20);
  std::vector<T> h(block);
  const auto r = randn(block, gen, std);
  for (size_t i = 0; i < block; ++i) {
    if constexpr (std::is_same_v<T, bf16>) h[i] = __float2bfloat16(r[i]);
    else h[i] = static_cast<T>(r[i]);
  }
  cudaMemcpy(d.p, h.data(), block * sizeof(T), cudaMemcpyHostToDevice);
  for (size_t off = block; off < d.n; off += block)
    cudaMemcpy(d.p + off, d.p, std::min(block, d.n - off) * sizeof(T), cudaMemcpyDeviceToDevice);
}

template <class F>
double time_us(F&& f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  cudaEventRecord(a);
  const int iters = 20;
  for (int i = 0; i < iters; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return 1000.0 * ms / iters;
}

void report(const char* what, double us, double bytes) {
  std::printf("  [timing] %-48s %9.1f us  %7.0f GB/s\n", what, us, bytes / us * 1e-3);
}

TEST(KernelTiming, TrainingSizes) {
  std::mt19937_64 gen(seed());
  const int N = 16384, C = 2048, V = 50257, Vp = 50304, B = 16, T = 1024;
  const size_t NC = size_t(N) * C;
  {
    Dev<bf16> x(NC), y(NC), out(NC), resid(NC), dout(NC), dinp(NC), w(C), b(C);
    Dev<float> mean(N), rstd(N), dw(C), db(C), scratch(cu::layernorm_scratch_floats(N, C));
    fill(x, gen), fill(y, gen), fill(dout, gen), fill(dinp, gen), fill(w, gen), fill(b, gen);
    dw.zero(), db.zero();
    report("layernorm_forward N=16384 C=2048",
           time_us([&] { cu::layernorm_forward(out.p, mean.p, rstd.p, x.p, w.p, b.p, N, C, 0); }),
           4.0 * NC);
    report("residual_layernorm_forward N=16384 C=2048", time_us([&] {
             cu::residual_layernorm_forward(resid.p, out.p, mean.p, rstd.p, x.p, y.p, w.p, b.p, N, C, 0);
           }),
           8.0 * NC);
    report("layernorm_backward N=16384 C=2048", time_us([&] {
             cu::layernorm_backward(dinp.p, dw.p, db.p, scratch.p, dout.p, x.p, w.p, mean.p, rstd.p, N, C, 0);
           }),
           8.0 * NC);
    report("add N*C", time_us([&] { cu::add(out.p, x.p, y.p, NC, 0); }), 6.0 * NC);
  }
  {
    Dev<bf16> logits(size_t(N) * Vp);
    Dev<float> losses(N);
    Dev<int32_t> targets(N);
    std::vector<int32_t> t(N);
    for (auto& v : t) v = static_cast<int32_t>(gen() % V);
    targets.upload(t);
    fill(logits, gen, 3.0f);
    const double bytes = 2.0 * N * Vp;
    report("crossentropy fwd only N=16384 Vp=50304",
           time_us([&] { cu::crossentropy(losses.p, logits.p, targets.p, 0.0f, N, V, Vp, 0); }), bytes);
    report("crossentropy fwd+dlogits N=16384 Vp=50304",
           time_us([&] { cu::crossentropy(losses.p, logits.p, targets.p, 1.0f / N, N, V, Vp, 0); }),
           2 * bytes);
  }
  {
    const size_t n = NC * 4;
    Dev<bf16> x(n), y(n), d(n);
    fill(x, gen), fill(d, gen);
    report("gelu_forward N*4C", time_us([&] { cu::gelu_forward(y.p, x.p, n, 0); }), 4.0 * n);
    report("gelu_backward N*4C (in place)", time_us([&] { cu::gelu_backward(d.p, x.p, d.p, n, 0); }), 6.0 * n);
    Dev<float> dbias(4 * C), scratch(cu::bias_scratch_floats(N, 4 * C));
    dbias.zero();
    report("bias_backward N=16384 OC=8192",
           time_us([&] { cu::bias_backward(dbias.p, scratch.p, x.p, N, 4 * C, 0); }), 2.0 * n);
  }
  {
    // Zipf-like tokens: a few very frequent ones, as in text (the top one about 3%).
    std::vector<int32_t> tokens(size_t(B) * T);
    std::vector<double> wts(V);
    for (int v = 0; v < V; ++v) wts[v] = 1.0 / (v + 3);  // the top token ~3% of the text
    std::discrete_distribution<int> zipf(wts.begin(), wts.end());
    for (auto& tk : tokens) tk = zipf(gen);
    std::vector<std::vector<int32_t>> pos(V);
    for (int i = 0; i < B * T; ++i) pos[tokens[i]].push_back(i);
    std::vector<int32_t> positions, starts{0}, ids;
    size_t longest = 0;
    for (int v = 0; v < V; ++v) {
      if (pos[v].empty()) continue;
      positions.insert(positions.end(), pos[v].begin(), pos[v].end());
      starts.push_back(static_cast<int32_t>(positions.size()));
      ids.push_back(v);
      longest = std::max(longest, pos[v].size());
    }
    Dev<int32_t> dtok(tokens.size()), dpos(positions.size()), dst(starts.size()), dids(ids.size());
    dtok.upload(tokens), dpos.upload(positions), dst.upload(starts), dids.upload(ids);
    Dev<bf16> wte(size_t(Vp) * C), wpe(size_t(T) * C), out(NC), dout(NC);
    Dev<float> dwte(size_t(Vp) * C), dwpe(size_t(T) * C);
    fill(wte, gen), fill(wpe, gen), fill(dout, gen);
    dwte.zero(), dwpe.zero();
    report("embedding_forward B=16 T=1024 C=2048",
           time_us([&] { cu::embedding_forward(out.p, dtok.p, wte.p, wpe.p, B, T, C, 0); }), 6.0 * NC);
    char what[96];
    std::snprintf(what, sizeof what, "embedding_backward (%zu groups, longest %zu)", ids.size(), longest);
    report(what, time_us([&] {
             cu::embedding_backward(dwte.p, dwpe.p, dout.p, dpos.p, dst.p, dids.p,
                                    static_cast<int>(ids.size()), B, T, C, 0);
           }),
           2.0 * NC + 8.0 * ids.size() * C + 8.0 * T * C);
  }
  {
    const int64_t P = 124000000;  // GPT-2 small
    std::vector<int64_t> seg{0};
    std::vector<uint8_t> decay;
    for (int i = 0; i < 148; ++i) {  // 12 layers x 12 tensors + 4, of mixed sizes
      const int64_t s = i % 3 == 0 ? 768 : (P - 200000) / 99;
      seg.push_back(std::min<int64_t>(P, seg.back() + s));
      decay.push_back(i % 3 != 0);
    }
    seg.back() = P;
    const int count = static_cast<int>(decay.size());
    Dev<float> w(P), m(P), v(P), g(P), u(P), scratch(cu::lamb_scratch_floats(P, count)), out(count);
    Dev<bf16> wb(P);
    Dev<int64_t> dseg(seg.size());
    Dev<uint8_t> ddec(decay.size());
    dseg.upload(seg), ddec.upload(decay);
    fill(w, gen, 0.02f), fill(g, gen, 0.01f), m.zero(), v.zero();
    const cu::AdamParams p{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 0.5f};
    report("adamw_step 124M params",
           time_us([&] { cu::adamw_step(w.p, wb.p, m.p, v.p, g.p, dseg.p, ddec.p, count, P, p, 0); }),
           30.0 * P);
    report("lamb_step 124M params", time_us([&] {
             cu::lamb_step(w.p, wb.p, m.p, v.p, g.p, u.p, scratch.p, dseg.p, ddec.p, count, P, p, 0);
           }),
           46.0 * P);
    report("segment_sum_squares 124M",
           time_us([&] { cu::segment_sum_squares(out.p, scratch.p, g.p, dseg.p, count, P, 0); }), 4.0 * P);
    Dev<float> one(1);
    one.upload({1.0f});
    report("scale_inplace 124M", time_us([&] { cu::scale_inplace(g.p, one.p, P, 0); }), 8.0 * P);
    report("cast_to_bf16 124M", time_us([&] { cu::cast_to_bf16(wb.p, w.p, P, 0); }), 6.0 * P);
  }
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
}

}  // namespace
