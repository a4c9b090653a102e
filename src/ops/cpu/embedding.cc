// Token + position embedding. The backward scatters rows of dout into dwte rows chosen by the
// tokens, and several tokens may share a row; instead of atomics (whose order depends on thread
// timing) the channels are split into blocks across threads and each thread walks all (b,t) in
// order for its own block, so every element is summed in the same order whatever the thread count.
#include <algorithm>
#include <cstdint>

#include "ops/cpu/ops.h"

namespace myriad::cpu {

namespace {
constexpr int kChannelBlock = 16;  // one 64-byte cache line of floats per row and block
}

template <class Real>
void embedding_forward(Real* out, const int32_t* tokens, const Real* wte, const Real* wpe, int B,
                       int T, int C, const ContextRows* rows) {
  const int64_t tokens_n = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < tokens_n; ++bt) {
    const int64_t t = bt % T;
    const Real* w = wte + static_cast<int64_t>(tokens[bt]) * C;
    const Real* p = wpe + (rows ? rows->position(t) : t) * C;
    Real* o = out + bt * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = w[c] + p[c];
  }
}

template <class Real>
void embedding_backward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* tokens, int B,
                        int T, int C, const ContextRows* rows) {
  const int blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kChannelBlock;
    const int c1 = std::min(C, c0 + kChannelBlock);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const int64_t bt = static_cast<int64_t>(b) * T + t;
        const Real* d = dout + bt * C;
        Real* w = dwte + static_cast<int64_t>(tokens[bt]) * C;
        Real* p = dwpe + (rows ? rows->position(t) : t) * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) {
          w[c] += d[c];
          p[c] += d[c];
        }
      }
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, const float*, int, int, int,
                                       const ContextRows*);
template void embedding_forward<double>(double*, const int32_t*, const double*, const double*, int,
                                        int, int, const ContextRows*);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, int, int, int,
                                        const ContextRows*);
template void embedding_backward<double>(double*, double*, const double*, const int32_t*, int, int, int,
                                         const ContextRows*);

}  // namespace myriad::cpu
