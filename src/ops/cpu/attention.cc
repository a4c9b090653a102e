// Causal self-attention on the CPU, with grouped-query attention (G = H / Hkv query heads share
// a key/value head). The forward runs one (batch, query head) pair per OpenMP iteration: pairs
// only read the shared keys and values and write disjoint parts of out and probs. The backward
// runs one (batch, key/value head) pair per iteration, its G query heads one after the other:
// they all add into the group's dk and dv, so they stay on one thread, in head order, which keeps
// the bits independent of the thread count. With G = 1 both are exactly the plain multi-head
// loops (same iterations, same calls, same bits as before GQA).
//
// All products go through cblas. q, k, v, dout and the gradients are read and written in
// place with their row strides (Hkv*(G+2)*D or H*D): OpenBLAS packs its operands anyway, so
// gathering them into contiguous (T,D) copies measured no faster, and this needs no per-thread
// q/k/v scratch.
// The GEMMs also write straight into probs, out and dqkv (beta = 1 for the gradients, which is
// exactly the += contract). Inside the parallel region OpenBLAS runs on the calling thread, so
// the pairs run side by side.
//
// Under context parallelism a rank takes the queries of its rows only (ContextRows: two ranges of
// the sequence) against every key of the sequence: out, dout and probs then hold those rows, in
// order, while qkv and dqkv stay whole (the other rows' k and v gathered from the rank's peers; its
// dk and dv contributions to them go back and are summed there).
//
// Rows of queries go in blocks of kRowBlock: a block only multiplies against the keys some of
// its rows can see (up to its last row, and from the first key its first row sees when a window
// or documents are set), which skips most of the masked upper triangle. The only scratch is the dS
// block of the backward, one per thread. The softmax loops are also compiled for AVX2
// (MYRIAD_AVX2_CLONE: elementwise work and fixed-order lane sums, so the same bits either way).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/ops.h"
#include "ops/cpu/vecmath.h"

namespace myriad::cpu {

namespace {

constexpr int kRowBlock = 32;

// The first key that query i sees: its window's and its document's (docs: the row's starts or
// null). Both only grow with i, so a block's first row bounds the whole block.
inline int first_key(int i, int window, const int32_t* docs) {
  const int lo = window > 0 ? std::max(0, i - window + 1) : 0;
  return docs ? std::max(lo, static_cast<int>(docs[i])) : lo;
}

// Softmax of query rows i0..i1-1 in place over the keys each row sees, zeros elsewhere: P holds
// row i0 first, each row T keys long.
template <class Real>
MYRIAD_ALWAYS_INLINE void softmax_rows(Real* P, int T, int i0, int i1, int window, const int32_t* docs) {
  for (int i = i0; i < i1; ++i) {
    Real* row = P + static_cast<int64_t>(i - i0) * T;
    const int lo = first_key(i, window, docs);
    const int n = i - lo + 1;
    Real* x = row + lo;
    const Real m = detail::max_of(x, n);
#pragma omp simd
    for (int j = 0; j < n; ++j) x[j] = detail::exp_real(x[j] - m);
    const Real inv = Real(1) / detail::lane_sum<Real>(n, [x](int64_t j) { return x[j]; });
#pragma omp simd
    for (int j = 0; j < n; ++j) x[j] *= inv;
    std::fill(row, row + lo, Real(0));
    std::fill(row + i + 1, row + T, Real(0));
  }
}

// dS = P * (dP - rowsum(dP * P)) in place over dS (rows, keys); P rows have stride T.
template <class Real>
MYRIAD_ALWAYS_INLINE void softmax_backward_rows(Real* dS, const Real* P, int rows, int keys,
                                                int T) {
  for (int r = 0; r < rows; ++r) {
    const Real* p = P + static_cast<int64_t>(r) * T;
    Real* d = dS + static_cast<int64_t>(r) * keys;
    const Real dot = detail::lane_sum<Real>(keys, [p, d](int64_t j) { return d[j] * p[j]; });
#pragma omp simd
    for (int j = 0; j < keys; ++j) d[j] = p[j] * (d[j] - dot);
  }
}

// float: also compiled for AVX2; double (tests only): baseline.
MYRIAD_AVX2_CLONE void softmax_rows_kernel(float* P, int T, int i0, int i1, int window, const int32_t* docs) {
  softmax_rows(P, T, i0, i1, window, docs);
}
void softmax_rows_kernel(double* P, int T, int i0, int i1, int window, const int32_t* docs) {
  softmax_rows(P, T, i0, i1, window, docs);
}
MYRIAD_AVX2_CLONE void softmax_backward_kernel(float* dS, const float* P, int rows, int keys,
                                               int T) {
  softmax_backward_rows(dS, P, rows, keys, T);
}
void softmax_backward_kernel(double* dS, const double* P, int rows, int keys, int T) {
  softmax_backward_rows(dS, P, rows, keys, T);
}

// Offset of query head h's D values in a token's (Hkv, G+2, D) row.
inline int64_t q_offset(int h, int G, int D) {
  return (static_cast<int64_t>(h / G) * (G + 2) + h % G) * D;
}
// Offset of key/value group g's key head in that row; its value head follows at + D.
inline int64_t k_offset(int g, int G, int D) { return (static_cast<int64_t>(g) * (G + 2) + G) * D; }

// Calls block(i0, i1, r0) for each block of at most kRowBlock query rows, in order: global rows
// [i0, i1) of the ranges `rows` names (all T rows when null), r0 the block's first row among the
// rows taken (its row of out, dout and probs).
template <class F>
void for_row_blocks(int T, const ContextRows* rows, F&& block) {
  const ContextRows all = context_rows(T, 1, 0);
  const ContextRows& q = rows ? *rows : all;
  int r0 = 0;
  for (int c = 0; c < q.n; ++c)
    for (int i0 = static_cast<int>(q.begin[c]); i0 < q.end[c]; i0 += kRowBlock) {
      const int i1 = std::min(static_cast<int>(q.end[c]), i0 + kRowBlock);
      block(i0, i1, r0);
      r0 += i1 - i0;
    }
}

}  // namespace

template <class Real>
void attention_forward(Real* out, Real* probs, const Real* qkv, int B, int T, int H, int Hkv,
                       int D, int window, const int32_t* docs, const ContextRows* rows) {
  if (Hkv <= 0 || H % Hkv != 0)
    throw std::invalid_argument("attention: query heads must be a multiple of key/value heads");
  const int G = H / Hkv;
  const int C = H * D;
  const int RS = Hkv * (G + 2) * D;  // qkv row stride (3C when G = 1)
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(D));
  const int64_t Tq = rows ? rows->count() : T;
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < B * H; ++bh) {
    const int b = bh / H;
    const int h = bh % H;
    const Real* row0 = qkv + static_cast<int64_t>(b) * T * RS;
    const Real* q = row0 + q_offset(h, G, D);  // (T,D), stride RS
    const Real* k = row0 + k_offset(h / G, G, D);
    const Real* v = k + D;
    Real* P = probs + static_cast<int64_t>(bh) * Tq * T;       // (Tq,T)
    Real* o = out + static_cast<int64_t>(b) * Tq * C + h * D;  // (Tq,D), stride C
    const int32_t* row_docs = docs ? docs + static_cast<int64_t>(b) * T : nullptr;
    for_row_blocks(T, rows, [&](int i0, int i1, int r0) {
      const int j0 = first_key(i0, window, row_docs);
      const int n = i1 - i0;
      const int keys = i1 - j0;
      Real* Pr = P + static_cast<int64_t>(r0) * T;  // the block's first row
      Real* Pb = Pr + j0;                          // (n, keys), stride T
      // S = q k^T / sqrt(D) for the keys this block may see, straight into probs.
      detail::gemm(false, true, n, keys, D, scale, q + static_cast<int64_t>(i0) * RS, RS,
                   k + static_cast<int64_t>(j0) * RS, RS, Real(0), Pb, T);
      softmax_rows_kernel(Pr, T, i0, i1, window, row_docs);
      // out = P v
      detail::gemm(false, false, n, D, keys, Real(1), Pb, T, v + static_cast<int64_t>(j0) * RS,
                   RS, Real(0), o + static_cast<int64_t>(r0) * C, C);
    });
  }
}

template <class Real>
void attention_backward(Real* dqkv, const Real* dout, const Real* qkv, const Real* probs, int B,
                        int T, int H, int Hkv, int D, int window, const int32_t* docs,
                        const ContextRows* rows) {
  if (Hkv <= 0 || H % Hkv != 0)
    throw std::invalid_argument("attention: query heads must be a multiple of key/value heads");
  const int G = H / Hkv;
  const int C = H * D;
  const int RS = Hkv * (G + 2) * D;  // qkv row stride (3C when G = 1)
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(D));
  const int64_t Tq = rows ? rows->count() : T;
#pragma omp parallel
  {
    std::vector<Real> dS_buf(static_cast<size_t>(std::min(T, kRowBlock)) * T);
    Real* dS = dS_buf.data();
#pragma omp for schedule(static)
    for (int bg = 0; bg < B * Hkv; ++bg) {
      const int b = bg / Hkv;
      const int g = bg % Hkv;
      const int64_t row0 = static_cast<int64_t>(b) * T * RS;
      const Real* k = qkv + row0 + k_offset(g, G, D);  // (T,D), stride RS, and so on
      const Real* v = k + D;
      Real* dk = dqkv + row0 + k_offset(g, G, D);
      Real* dv = dk + D;
      const int32_t* row_docs = docs ? docs + static_cast<int64_t>(b) * T : nullptr;
      // The group's query heads in order: each adds its share into dk and dv.
      for (int h = g * G; h < (g + 1) * G; ++h) {
        const int bh = b * H + h;
        const Real* q = qkv + row0 + q_offset(h, G, D);
        Real* dq = dqkv + row0 + q_offset(h, G, D);
        const Real* dO = dout + static_cast<int64_t>(b) * Tq * C + h * D;  // (Tq,D), stride C
        const Real* P = probs + static_cast<int64_t>(bh) * Tq * T;
        for_row_blocks(T, rows, [&](int i0, int i1, int r0) {
          const int j0 = first_key(i0, window, row_docs);
          const int n = i1 - i0;
          const int keys = i1 - j0;
          const Real* Pb = P + static_cast<int64_t>(r0) * T + j0;  // (n, keys), stride T
          const Real* dOb = dO + static_cast<int64_t>(r0) * C;
          // dv += P^T dout
          detail::gemm(true, false, keys, D, n, Real(1), Pb, T, dOb, C, Real(1),
                       dv + static_cast<int64_t>(j0) * RS, RS);
          // dP = dout v^T, into the scratch (n, keys)
          detail::gemm(false, true, n, keys, D, Real(1), dOb, C,
                       v + static_cast<int64_t>(j0) * RS, RS, Real(0), dS, keys);
          // dS = P * (dP - rowsum(dP * P)); masked entries have P = 0, hence dS = 0.
          softmax_backward_kernel(dS, Pb, n, keys, T);
          // dq += dS k / sqrt(D);  dk += dS^T q / sqrt(D)
          detail::gemm(false, false, n, D, keys, scale, dS, keys,
                       k + static_cast<int64_t>(j0) * RS, RS, Real(1),
                       dq + static_cast<int64_t>(i0) * RS, RS);
          detail::gemm(true, false, keys, D, n, scale, dS, keys,
                       q + static_cast<int64_t>(i0) * RS, RS, Real(1),
                       dk + static_cast<int64_t>(j0) * RS, RS);
        });
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, int, int,
                                       const int32_t*, const ContextRows*);
template void attention_forward<double>(double*, double*, const double*, int, int, int, int, int, int,
                                        const int32_t*, const ContextRows*);
template void attention_backward<float>(float*, const float*, const float*, const float*, int, int,
                                        int, int, int, int, const int32_t*, const ContextRows*);
template void attention_backward<double>(double*, const double*, const double*, const double*, int,
                                         int, int, int, int, int, const int32_t*, const ContextRows*);

}  // namespace myriad::cpu
