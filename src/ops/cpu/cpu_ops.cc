#include "ops/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <omp.h>

#include "core/clock.h"
#include "core/error.h"
#include "ops/cpu/ops.h"
#include "ops/cpu/reduce.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu {
namespace {
constexpr int kColumnBlock = 16;  // channels per thread block in the row-sum loops below
}  // namespace

template <class T>
void CpuOps::zero(T* x, int64_t n) const {
  std::memset(x, 0, static_cast<size_t>(n) * sizeof(T));
}
template <class T>
void CpuOps::copy(T* dst, const T* src, int64_t n) const {
  if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(T));
}
template void CpuOps::zero<float>(float*, int64_t) const;
template void CpuOps::zero<int32_t>(int32_t*, int64_t) const;
template void CpuOps::copy<float>(float*, const float*, int64_t) const;
template void CpuOps::copy<int32_t>(int32_t*, const int32_t*, int64_t) const;
template void CpuOps::copy<double>(double*, const double*, int64_t) const;
template void CpuOps::zero<double>(double*, int64_t) const;

void CpuOps::load_tokens(Tokens& t, const int32_t* host, int B, int T, int64_t stride, int64_t, int64_t) const {
  for (int b = 0; b < B; ++b) copy(t.data() + int64_t(b) * T, host + b * stride, T);
}

void CpuOps::mean_into(double* acc, const float* x, int64_t n, int64_t count) const {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  *acc += static_cast<float>(s / (count > 0 ? count : n));
}

std::string CpuOps::device_name() const {
  return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
}

int CpuOps::mark() const {
  marks_->push_back(now_s());
  return static_cast<int>(marks_->size()) - 1;
}

double CpuOps::seconds(int from, int to) const { return (*marks_)[to] - (*marks_)[from]; }

std::vector<double> CpuOps::sums_of_squares(const float* x,
                                            const std::vector<std::pair<int64_t, int64_t>>& pieces) const {
  std::vector<double> out;
  for (auto [a, b] : pieces) out.push_back(cpu::sum_squares(x + a, b - a));
  return out;
}

void CpuOps::accumulate(float* dst, const float* src, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void CpuOps::embedding_forward(Act* out, const int32_t* tokens, const Param* wte, const Param* wpe, int B, int T,
                               int C, const ContextRows* rows) const {
  cpu::embedding_forward(out, tokens, wte, wpe, B, T, C, rows);
}
void CpuOps::embedding_backward(float* dwte, float* dwpe, const Act* dout, const Tokens& tokens, int B, int T,
                                int C, const ContextRows* rows) const {
  cpu::embedding_backward(dwte, dwpe, dout, tokens.data(), B, T, C, rows);
}
void CpuOps::norm_forward(Norm n, Act* out, float* mean, float* rstd, const Act* inp, const Param* w, const Param* b,
                          int N, int C, const fp8::Kept*) const {
  if (n.kind == NormKind::kRMSNorm)
    cpu::rmsnorm_forward(out, rstd, inp, w, N, C, n.eps);
  else
    cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}
void CpuOps::residual_norm_forward(Norm n, Act* resid, Act* out, float* mean, float* rstd, const Act* a, const Act* b,
                                   const Param* w, const Param* bias, int N, int C, const fp8::Kept*) const {
  add(resid, a, b, int64_t(N) * C);
  norm_forward(n, out, mean, rstd, resid, w, bias, N, C);
}
void CpuOps::norm_backward(Norm n, Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w,
                           const float* mean, const float* rstd, int N, int C) const {
  if (n.kind == NormKind::kRMSNorm)
    cpu::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  else
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
void CpuOps::fp8_cast_weight(const fp8::WeightCast&, const Param*, int, int) const {
  MYRIAD_CHECK(false, "the CPU op set has no FP8 casts");
}

void CpuOps::linear_forward(Act* out, const Act* inp, const Param* w, const Param* b, int N, int IC, int OC,
                            Gemm g, const fp8::Kept* keep, const fp8::WeightCast* wcast) const {
  MYRIAD_CHECK(g == Gemm::kBf16 && !keep && !wcast, "the CPU op set computes its linears in fp32");
  cpu::linear_forward(out, inp, w, b, N, IC, OC);
}
void CpuOps::linear_act_forward(Mlp m, Act* out, Act* pre, const Act* inp, const Param* w, const Param* b, int N,
                                int IC, int F, Gemm g, const fp8::Kept* keep, const fp8::Kept* out_keep,
                                const fp8::WeightCast* wcast) const {
  MYRIAD_CHECK(g == Gemm::kBf16 && !keep && !out_keep && !wcast, "the CPU op set computes its linears in fp32");
  cpu::linear_forward(pre, inp, w, b, N, IC, F * pre_width(m));
  if (m == Mlp::kSwiGlu)
    cpu::swiglu_forward(out, pre, N, F);
  else
    cpu::gelu_forward(out, pre, int64_t(N) * F);
}
void CpuOps::linear_backward(Mlp m, Act* dinp, float* dw, float* db, const Act* dout, const Act* inp, const Param* w,
                             const Act* pre, int N, int IC, int OC, bool accumulate, Gemm g,
                             const fp8::Kept* kept, const fp8::Kept* dinp_amax, const fp8::Kept* dout_amax,
                             const fp8::WeightCast* wcast) const {
  MYRIAD_CHECK(g == Gemm::kBf16 && !kept && !dinp_amax && !dout_amax && !wcast,
               "the CPU op set computes its linears in fp32");
  MYRIAD_CHECK(!(pre && accumulate), "linear_backward: a gradient through the activation is written, not added");
  // The input gradient into dinp, or into a scratch of the activation's output gradient (N,F).
  const int64_t n = int64_t(N) * IC;
  std::vector<float>& dact = *scratch_;
  if (pre) dact.assign(static_cast<size_t>(n), 0.0f);
  float* dx = pre ? dact.data() : dinp;
  if (!pre && !accumulate) zero(dinp, n);
  cpu::linear_backward(dx, static_cast<float*>(nullptr), static_cast<float*>(nullptr), dout,
                       static_cast<const float*>(nullptr), w, N, IC, OC);
  if (pre) {
    zero(dinp, n * pre_width(m));
    if (m == Mlp::kSwiGlu)
      cpu::swiglu_backward(dinp, pre, dx, N, IC);
    else
      cpu::gelu_backward(dinp, pre, dx, n);
  }
  if (!inp) {  // the activation's output, recomputed from pre as the forward computed it
    MYRIAD_CHECK(pre, "linear_backward: no input, and no pre-activation to recompute it from");
    std::vector<float>& act = *act_scratch_;
    act.resize(static_cast<size_t>(n));
    if (m == Mlp::kSwiGlu)
      cpu::swiglu_forward(act.data(), pre, N, IC);
    else
      cpu::gelu_forward(act.data(), pre, n);
    inp = act.data();
  }
  cpu::linear_backward(static_cast<float*>(nullptr), dw, static_cast<float*>(nullptr), dout, inp,
                       static_cast<const float*>(nullptr), N, IC, OC);
  if (db) bias_backward(db, dout, N, OC);
}
void CpuOps::add(Act* out, const Act* a, const Act* b, int64_t n) const { cpu::residual_forward(out, a, b, n); }
void CpuOps::attention_forward(Act* out, float* saved, const Act* qkv, int B, int T, int H, int Hkv, int D,
                               int window, const int32_t* docs, const ContextRows* rows) const {
  cpu::attention_forward(out, saved, qkv, B, T, H, Hkv, D, window, docs, rows);
}
void CpuOps::attention_backward(Act* dqkv, const Act* dout, const Act*, const Act* qkv, const float* saved, int B,
                                int T, int H, int Hkv, int D, int window, const int32_t* docs,
                                const ContextRows* rows) const {
  zero(dqkv, int64_t(B) * T * (H + 2 * Hkv) * D);
  cpu::attention_backward(dqkv, dout, qkv, saved, B, T, H, Hkv, D, window, docs, rows);
}
void CpuOps::rope_forward(Act* qkv, int B, int T, int Hkv, int G, int D, const ContextRows* rows) const {
  cpu::rope_forward(qkv, freqs_->data(), B, T, Hkv, G, D, 0, rows);
}
void CpuOps::rope_backward(Act* dqkv, int B, int T, int Hkv, int G, int D, const ContextRows* rows) const {
  cpu::rope_backward(dqkv, freqs_->data(), B, T, Hkv, G, D, 0, rows);
}
void CpuOps::crossentropy_forward(float* losses, const Act* logits, const int32_t* targets, int N, int V,
                                  int Vp) const {
  cpu::crossentropy_forward(losses, logits, targets, N, V, Vp);
}
void CpuOps::crossentropy_forward_backward(float* losses, Act* logits, const int32_t* targets, float dloss, int N,
                                           int V, int Vp) const {
  cpu::crossentropy_forward(losses, logits, targets, N, V, Vp);
  const std::vector<float> dlosses(static_cast<size_t>(N), dloss);
  cpu::crossentropy_backward(logits, logits, targets, dlosses.data(), N, V, Vp);
}

// Columns in blocks across threads, rows in order.
void CpuOps::bias_backward(float* db, const Act* dout, int rows, int OC) const {
  const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(OC, c0 + kColumnBlock);
    float acc[kColumnBlock] = {};
    for (int n = 0; n < rows; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * OC + c0;
#pragma omp simd
      for (int c = 0; c < c1 - c0; ++c) acc[c] += d[c];
    }
    for (int c = c0; c < c1; ++c) db[c] += acc[c - c0];
  }
}

void CpuOps::add_bias(Act* out, const Param* bias, int rows, int C) const {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < rows; ++n) {
    float* o = out + static_cast<int64_t>(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] += bias[c];
  }
}

void CpuOps::vocab_rows_forward(Act* out, const int32_t* tokens, const Param* wte, int64_t v0, int64_t Vl, int N,
                                int C) const {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t v = int64_t(tokens[n]) - v0;
    float* o = out + n * C;
    if (v >= 0 && v < Vl)
      std::memcpy(o, wte + v * C, C * sizeof(float));
    else
      std::memset(o, 0, C * sizeof(float));
  }
}

// Channel blocks across threads, tokens in order (deterministic).
void CpuOps::vocab_rows_backward(float* dwte, const Act* dfull, const Tokens& tokens, int64_t v0, int64_t Vl, int N,
                                 int C) const {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    for (int n = 0; n < N; ++n) {
      const int64_t v = int64_t(tokens.data()[n]) - v0;
      if (v < 0 || v >= Vl) continue;
      const float* d = dfull + int64_t(n) * C;
      float* w = dwte + v * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) w[c] += d[c];
    }
  }
}

// ---- context parallelism's key/value exchange ----
// In each the index arithmetic is the CUDA kernels' (ops/cuda/context_parallel.cu): rows n of a
// block, heads g, and the k, v pair's 2D elements after a group's G query heads.

void CpuOps::cp_pack_kv(Act* pack, const Act* qkv, int64_t N, int Hkv, int G, int D) const {
  const int64_t Ql = int64_t(Hkv) * (G + 2) * D;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int g = 0; g < Hkv; ++g)
      std::copy_n(qkv + n * Ql + (int64_t(g) * (G + 2) + G) * D, 2 * D, pack + (n * Hkv + g) * 2 * D);
}

void CpuOps::cp_unpack_kv(Act* whole, const Act* packs, const Act* local, int B, int T, const ContextRows* ranks,
                          int cp, int rank, int Hkv, int G, int D) const {
  const int64_t Ql = int64_t(Hkv) * (G + 2) * D, block = int64_t(B) * T * Hkv * 2 * D, Tw = int64_t(T) * cp;
  for (int q = 0; q < cp; ++q) {
    const ContextRows& r = ranks[q];
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) {  // rank q's row i of batch row b
        const int64_t n = int64_t(b) * T + i;
        Act* to = whole + (int64_t(b) * Tw + r.position(i)) * Ql;
        if (q == rank) {
          std::copy_n(local + n * Ql, Ql, to);
        } else {
          for (int g = 0; g < Hkv; ++g)
            std::copy_n(packs + q * block + (n * Hkv + g) * 2 * D, 2 * D, to + (int64_t(g) * (G + 2) + G) * D);
        }
      }
  }
}

void CpuOps::cp_pack_kv_grad(float* packs, const Act* dwhole, int B, int T, const ContextRows* ranks, int cp, int Hkv,
                             int G, int D) const {
  const int64_t Ql = int64_t(Hkv) * (G + 2) * D, block = int64_t(B) * T * Hkv * 2 * D, Tw = int64_t(T) * cp;
  for (int q = 0; q < cp; ++q) {
    const ContextRows& r = ranks[q];
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
      for (int64_t i = 0; i < T; ++i) {
        const Act* from = dwhole + (int64_t(b) * Tw + r.position(i)) * Ql;
        for (int g = 0; g < Hkv; ++g)
          std::copy_n(from + (int64_t(g) * (G + 2) + G) * D, 2 * D,
                      packs + q * block + ((int64_t(b) * T + i) * Hkv + g) * 2 * D);
      }
  }
}

void CpuOps::cp_unpack_kv_grad(Act* dlocal, const float* mine, const Act* dwhole, int B, int T,
                               const ContextRows* ranks, int cp, int rank, int Hkv, int G, int D) const {
  const int64_t Ql = int64_t(Hkv) * (G + 2) * D, Tw = int64_t(T) * cp;
  const ContextRows& r = ranks[rank];
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t n = int64_t(b) * T + i;
      Act* to = dlocal + n * Ql;
      std::copy_n(dwhole + (int64_t(b) * Tw + r.position(i)) * Ql, Ql, to);  // the queries' gradient, own rows
      for (int g = 0; g < Hkv; ++g)
        std::copy_n(mine + (n * Hkv + g) * 2 * D, 2 * D, to + (int64_t(g) * (G + 2) + G) * D);
    }
}

void CpuOps::add_positions(Act* out, const Param* wpe, int r0, int rows, int T, int C, const ContextRows* cr) const {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < rows; ++i) {
    const int64_t t = (r0 + i) % T;
    const float* pe = wpe + (cr ? cr->position(t) : t) * C;
    float* o = out + int64_t(i) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] += pe[c];
  }
}

void CpuOps::positions_backward(float* dwpe, const Act* dout, int r0, int rows, int T, int C,
                                const ContextRows* cr) const {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    for (int i = 0; i < rows; ++i) {
      const float* d = dout + int64_t(i) * C;
      const int64_t t = (r0 + i) % T;
      float* p = dwpe + (cr ? cr->position(t) : t) * C;
#pragma omp simd
      for (int c = c0; c < c1; ++c) p[c] += d[c];
    }
  }
}

void CpuOps::ce_row_max(float* mx, const Act* logits, int N, int64_t Vl, int live) const {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) mx[n] = live > 0 ? detail::max_of(logits + n * Vl, live) : -INFINITY;
}

void CpuOps::ce_partials(float* parts, const Act* logits, const float* mx, const int32_t* targets, int64_t v0, int N,
                         int64_t Vl, int live) const {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = logits + n * Vl;
    const float m = mx[n];
    const float sum = detail::exp_sum(x, live, m);
    const int64_t t = int64_t(targets[n]) - v0;
    parts[2 * n] = sum;
    parts[2 * n + 1] = t >= 0 && t < live ? x[t] - m : 0.0f;
  }
}

void CpuOps::ce_losses(float* losses, float* sums, const float* parts, const int32_t* targets, int N) const {
  for (int n = 0; n < N; ++n) {
    sums[n] = parts[2 * n];
    losses[n] = targets[n] < 0 ? 0.0f : std::log(parts[2 * n]) - parts[2 * n + 1];
  }
}

void CpuOps::ce_tp_backward(Act* dlogits, const float* mx, const float* sums, float dloss, const int32_t* targets,
                            int64_t v0, int N, int64_t Vl, int live) const {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* d = dlogits + n * Vl;
    if (targets[n] < 0) {
      std::fill(d, d + Vl, 0.0f);
      continue;
    }
    const float m = mx[n], inv = 1.0f / sums[n], dl = dloss;
    const int64_t t = int64_t(targets[n]) - v0;
    const bool owned = t >= 0 && t < live;
    const float xt = owned ? d[t] : 0.0f;
    const float scale = inv * dl;
#pragma omp simd
    for (int j = 0; j < live; ++j) d[j] = detail::exp_real(d[j] - m) * scale;
    if (owned) d[t] = (detail::exp_real(xt - m) * inv - 1.0f) * dl;
    std::fill(d + live, d + Vl, 0.0f);
  }
}

}  // namespace myriad::cpu
