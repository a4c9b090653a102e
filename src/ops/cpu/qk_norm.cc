// The queries' and keys' RMSNorm (cpu_ops.h says what it computes; model.qk_norm). A segment is
// a head's D features (kHead) or a token's whole query or key block (kAll, whose heads are not
// adjacent in qkv's (Hkv, G+2, D) layout: the segment is walked head by head in canonical
// order). Sums in double, in a fixed order.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"

namespace myriad::cpu {

namespace {

// The places of token n's query heads (in canonical order h = g G + j) and key heads in qkv.
struct Heads {
  int Hkv, G, D;
  int64_t row() const { return int64_t(Hkv) * (G + 2) * D; }
  int64_t query(int64_t n, int h) const { return n * row() + (int64_t(h / G) * (G + 2) + h % G) * D; }
  int64_t key(int64_t n, int g) const { return n * row() + (int64_t(g) * (G + 2) + G) * D; }
  int64_t value(int64_t n, int g) const { return key(n, g) + D; }
};

}  // namespace

void CpuOps::qk_norm_forward(QkNorm n, Act* qkv, float* rstd, const Act* raw, const Param* wq, const Param* wk, int N,
                             int Hkv, int G, int D) const {
  MYRIAD_CHECK(n.kind != QkNormKind::kNone, "qk_norm_forward without a norm");
  const Heads at{Hkv, G, D};
  const int H = Hkv * G;
  // One segment: the heads `places` (each D features) normalized together with weights w.
  auto segment = [&](const int64_t* places, int heads, const Param* w, float* r) {
    double ss = 0;
    for (int i = 0; i < heads; ++i)
      for (int d = 0; d < D; ++d) ss += double(raw[places[i] + d]) * raw[places[i] + d];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / (double(heads) * D) + n.eps));
    *r = inv;
    for (int i = 0; i < heads; ++i)
      for (int d = 0; d < D; ++d) qkv[places[i] + d] = raw[places[i] + d] * inv * w[int64_t(i) * D + d];
  };
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    std::vector<int64_t> q(static_cast<size_t>(H)), k(static_cast<size_t>(Hkv));
    for (int h = 0; h < H; ++h) q[h] = at.query(t, h);
    for (int g = 0; g < Hkv; ++g) k[g] = at.key(t, g);
    if (n.kind == QkNormKind::kHead) {
      float* r = rstd + int64_t(t) * (H + Hkv);
      for (int h = 0; h < H; ++h) segment(&q[h], 1, wq, r + h);
      for (int g = 0; g < Hkv; ++g) segment(&k[g], 1, wk, r + H + g);
    } else {
      segment(q.data(), H, wq, rstd + int64_t(t) * 2);
      segment(k.data(), Hkv, wk, rstd + int64_t(t) * 2 + 1);
    }
    for (int g = 0; g < Hkv; ++g) std::memcpy(qkv + at.value(t, g), raw + at.value(t, g), sizeof(Act) * D);
  }
}

void CpuOps::qk_norm_backward(QkNorm n, Act* dqkv, float* dwq, float* dwk, const Act* raw, const Param* wq,
                              const Param* wk, const float* rstd, int N, int Hkv, int G, int D) const {
  const Heads at{Hkv, G, D};
  const int H = Hkv * G;
  // dx = r (g - x^ mean(x^ g)), g = w dy, x^ = x r; dw += dy x^. The weights' gradients are
  // summed over tokens in order (one thread), the inputs' in parallel.
  auto segment = [&](const int64_t* places, int heads, const Param* w, float r, float* dw) {
    double dot = 0;
    for (int i = 0; i < heads; ++i)
      for (int d = 0; d < D; ++d) {
        const int64_t e = places[i] + d;
        dot += double(raw[e]) * r * w[int64_t(i) * D + d] * dqkv[e];
      }
    const double mean = dot / (double(heads) * D);
    for (int i = 0; i < heads; ++i)
      for (int d = 0; d < D; ++d) {
        const int64_t e = places[i] + d;
        const double xh = double(raw[e]) * r, gw = double(w[int64_t(i) * D + d]) * dqkv[e];
        if (dw) dw[int64_t(i) * D + d] += static_cast<float>(dqkv[e] * xh);
        dqkv[e] = static_cast<Act>(r * (gw - xh * mean));
      }
  };
  std::vector<int64_t> q(static_cast<size_t>(H)), k(static_cast<size_t>(Hkv));
  for (int t = 0; t < N; ++t) {
    for (int h = 0; h < H; ++h) q[h] = at.query(t, h);
    for (int g = 0; g < Hkv; ++g) k[g] = at.key(t, g);
    if (n.kind == QkNormKind::kHead) {
      const float* r = rstd + int64_t(t) * (H + Hkv);
      for (int h = 0; h < H; ++h) segment(&q[h], 1, wq, r[h], dwq);
      for (int g = 0; g < Hkv; ++g) segment(&k[g], 1, wk, r[H + g], dwk);
    } else {
      segment(q.data(), H, wq, rstd[int64_t(t) * 2], dwq);
      segment(k.data(), Hkv, wk, rstd[int64_t(t) * 2 + 1], dwk);
    }
  }
}

}  // namespace myriad::cpu
