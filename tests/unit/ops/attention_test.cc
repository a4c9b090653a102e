#include <gtest/gtest.h>

#include "attention_before_gqa.h"
#include "op_test_util.h"
#include "ops/cpu/ops.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;

namespace {

// C = H * D query channels; Hkv key/value heads, 0 meaning H (plain multi-head, as before GQA).
struct Shape {
  int B, T, C, H, window;
  int Hkv = 0;
  std::vector<int32_t> docs = {};  // (B,T) each position's document start; empty: none

  int kv() const { return Hkv > 0 ? Hkv : H; }
  int G() const { return H / kv(); }
  int D() const { return C / H; }
  size_t qkv_size() const { return static_cast<size_t>(B) * T * kv() * (G() + 2) * D(); }
  const int32_t* doc_starts() const { return docs.empty() ? nullptr : docs.data(); }
  // Whether query i of row b sees key j: written out from the definitions, not the kernel's bounds.
  bool visible(int b, int i, int j) const {
    const bool causal = j <= i && (window <= 0 || i - j < window);
    return causal && (docs.empty() || j >= docs[static_cast<size_t>(b) * T + i]);
  }
};

// Random document starts for B rows of T: documents of length 1, several short ones, and one
// that began before the row and runs past it (row 0 when B > 1: all zeros).
std::vector<int32_t> random_docs(uint64_t seed, int B, int T) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> d(static_cast<size_t>(B) * T, 0);
  for (int b = 1; b < B; ++b) {
    int start = 0;
    for (int i = 0; i < T; ++i) {
      // New documents at 1 in 4 positions, and two single-token documents back to back.
      if (i > 0 && (rng() % 4 == 0 || i == T / 2 || i == T / 2 + 1)) start = i;
      d[static_cast<size_t>(b) * T + i] = start;
    }
  }
  return d;
}

struct AttentionCase {
  Shape s;
  Vec qkv, R;

  AttentionCase(uint64_t seed, Shape shape) : s(shape) {
    std::mt19937_64 rng(seed);
    qkv = random_vec(rng, s.qkv_size(), -1.5, 1.5);
    R = random_vec(rng, static_cast<size_t>(s.B) * s.T * s.C);
  }
  size_t probs_size() const { return static_cast<size_t>(s.B) * s.H * s.T * s.T; }
  Vec forward(Vec* probs_out = nullptr) const {
    Vec out(R.size()), probs(probs_size());
    attention_forward(out.data(), probs.data(), qkv.data(), s.B, s.T, s.H, s.kv(), s.D(),
                      s.window, s.doc_starts());
    if (probs_out) *probs_out = probs;
    return out;
  }
  double loss() const { return dot(forward(), R); }
  void backward(Vec& dqkv) const {
    Vec probs;
    forward(&probs);
    attention_backward(dqkv.data(), R.data(), qkv.data(), probs.data(), s.B, s.T, s.H, s.kv(),
                       s.D(), s.window, s.doc_starts());
  }
};

// Straightforward attention in double, laid out as the op: qkv (B,T,Hkv,G+2,D), out (B,T,H,D).
// Query head h is slot h % G of group h / G; the group's key and value are slots G and G+1.
Vec naive_attention(const Vec& qkv, Shape s) {
  const int D = s.D(), G = s.G(), Hkv = s.kv();
  Vec out(static_cast<size_t>(s.B) * s.T * s.C);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.T; ++i) {
        // part 0: query head h; 1: its key; 2: its value.
        auto at = [&](int t, int part, int d) {
          const int slot = part == 0 ? h % G : G + part - 1;
          return qkv[(((static_cast<size_t>(b) * s.T + t) * Hkv + h / G) * (G + 2) + slot) * D + d];
        };
        std::vector<double> w(s.T, 0.0);
        double m = -1e300, sum = 0;
        for (int j = 0; j < s.T; ++j) {
          if (!s.visible(b, i, j)) continue;
          double dotqk = 0;
          for (int d = 0; d < D; ++d) dotqk += at(i, 0, d) * at(j, 1, d);
          w[j] = dotqk / std::sqrt(static_cast<double>(D));
          m = std::max(m, w[j]);
        }
        for (int j = 0; j < s.T; ++j) {
          w[j] = s.visible(b, i, j) ? std::exp(w[j] - m) : 0.0;
          sum += w[j];
        }
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int j = 0; j < s.T; ++j) o += w[j] / sum * at(j, 2, d);
          out[(b * s.T + i) * s.C + h * D + d] = o;
        }
      }
  return out;
}

void check_probs(const Vec& probs, Shape s) {
  for (int bh = 0; bh < s.B * s.H; ++bh)
    for (int i = 0; i < s.T; ++i) {
      double sum = 0;
      for (int j = 0; j < s.T; ++j) {
        const double p = probs[(static_cast<size_t>(bh) * s.T + i) * s.T + j];
        if (s.visible(bh / s.H, i, j)) {
          ASSERT_GT(p, 0.0);
          sum += p;
        } else {
          ASSERT_EQ(p, 0.0) << "masked prob at i=" << i << " j=" << j;
        }
      }
      ASSERT_NEAR(sum, 1.0, 1e-12);
    }
}

void check_case(uint64_t seed, Shape s) {
  SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
               " C=" + std::to_string(s.C) + " H=" + std::to_string(s.H) +
               " Hkv=" + std::to_string(s.kv()) + " window=" + std::to_string(s.window) +
               (s.docs.empty() ? "" : " documents"));
  AttentionCase c(seed, s);
  Vec probs;
  const Vec out = c.forward(&probs);
  check_probs(probs, s);
  expect_close("out vs naive", out, naive_attention(c.qkv, s), 1e-12);
  Vec dqkv(c.qkv.size());
  c.backward(dqkv);
  check_gradient("dqkv", c.qkv, dqkv, [&] { return c.loss(); });
}

}  // namespace

TEST(Attention, GradientsMatchFiniteDifferences) {
  check_case(1, {2, 5, 12, 3, 0});
  check_case(2, {2, 5, 12, 3, 2});
  check_case(3, {2, 5, 12, 3, 1});  // each query sees only itself
  check_case(4, {1, 5, 12, 3, 9});  // window wider than T = full causal
}

TEST(Attention, DocumentsSeeOnlyThemselves) {
  // Each query attends to the earlier keys of its own document, alone and with a window, with
  // grouped-query heads, within one row block and across several.
  for (int window : {0, 5})
    for (int Hkv : {0, 2}) {
      check_case(11, {3, 12, 16, 4, window, Hkv, random_docs(3, 3, 12)});
      check_case(12, {2, 70, 8, 2, window, Hkv > 0 ? 1 : 0, random_docs(4, 2, 70)});
    }
}

TEST(Attention, OneDocumentPerRowIsPlainCausal) {
  // Starts all 0 (every row one document) give the bits of no documents at all.
  const Shape plain{2, 40, 16, 4, 7};
  Shape zeros = plain;
  zeros.docs.assign(2 * 40, 0);
  AttentionCase a(5, plain), b(5, zeros);
  EXPECT_EQ(a.forward(), b.forward());
  Vec da(a.qkv.size()), db(b.qkv.size());
  a.backward(da), b.backward(db);
  EXPECT_EQ(da, db);
}

TEST(Attention, SeveralRowBlocks) {
  // T past several of the kernel's row blocks, windows that cross block boundaries.
  check_case(5, {1, 70, 4, 2, 0});
  check_case(6, {1, 70, 4, 2, 20});
  check_case(7, {1, 130, 2, 1, 65});
}

TEST(Attention, BackwardAccumulates) {
  AttentionCase c(8, {2, 5, 12, 3, 2});
  Vec d1(c.qkv.size());
  c.backward(d1);
  Vec d2 = d1;
  c.backward(d2);
  for (auto& x : d1) x *= 2;
  expect_close("dqkv", d2, d1, 1e-14);
}

namespace {

// Float forward + backward; out, probs and dqkv concatenated.
VecF run_float(const Vec& qkv, const Vec& dout, Shape s) {
  const VecF fqkv = to_float(qkv), fdout = to_float(dout);
  VecF out(fdout.size()), probs(static_cast<size_t>(s.B) * s.H * s.T * s.T), dqkv(fqkv.size());
  attention_forward(out.data(), probs.data(), fqkv.data(), s.B, s.T, s.H, s.kv(), s.D(), s.window);
  attention_backward(dqkv.data(), fdout.data(), fqkv.data(), probs.data(), s.B, s.T, s.H, s.kv(),
                     s.D(), s.window);
  out.insert(out.end(), probs.begin(), probs.end());
  out.insert(out.end(), dqkv.begin(), dqkv.end());
  return out;
}

}  // namespace

TEST(Attention, FloatMatchesDoubleAndIsDeterministic) {
  for (int window : {0, 24}) {
    const Shape s{3, 80, 32, 4, window};
    AttentionCase c(9, s);
    round_to_float({&c.qkv, &c.R});
    Vec probs, dqkv(c.qkv.size());
    Vec want = c.forward(&probs);
    c.backward(dqkv);
    want.insert(want.end(), probs.begin(), probs.end());
    want.insert(want.end(), dqkv.begin(), dqkv.end());
    const VecF first = run_float(c.qkv, c.R, s);
    expect_close("float vs double", first, want, 1e-5);
    EXPECT_TRUE(bitwise_equal(first, run_float(c.qkv, c.R, s)));
    for (int threads : {1, 3}) {
      with_threads(threads,
                   [&] { EXPECT_TRUE(bitwise_equal(first, run_float(c.qkv, c.R, s))) << threads; });
    }
  }
}

TEST(Attention, GroupedQueryGradientsMatchFiniteDifferences) {
  // G = 2 (two query heads per key/value head) and G = H (multi-query), causal and windowed.
  check_case(11, {2, 5, 16, 4, 0, 2});
  check_case(12, {2, 5, 16, 4, 2, 2});
  check_case(13, {2, 5, 12, 3, 0, 1});
  check_case(14, {2, 5, 12, 3, 3, 1});
  check_case(15, {1, 6, 8, 1, 0, 1});  // one head: G = 1 = H
}

TEST(Attention, GroupedQuerySeveralRowBlocks) {
  // Past the kernel's first row block (32), a window across its boundary; small heads, since the
  // finite differences rerun the forward for every input.
  check_case(16, {1, 40, 4, 2, 0, 1});
  check_case(17, {1, 40, 8, 4, 20, 2});
}

TEST(Attention, GroupedQueryBackwardAccumulates) {
  AttentionCase c(18, {2, 5, 16, 4, 2, 2});
  Vec d1(c.qkv.size());
  c.backward(d1);
  Vec d2 = d1;
  c.backward(d2);
  for (auto& x : d1) x *= 2;
  expect_close("dqkv", d2, d1, 1e-14);
}

TEST(Attention, GroupedQueryFloatMatchesDoubleAndIsDeterministic) {
  // The key/value gradients sum over a group's query heads: the bits must not depend on threads.
  for (int Hkv : {2, 1}) {
    for (int window : {0, 24}) {
      const Shape s{3, 80, 32, 4, window, Hkv};
      AttentionCase c(19, s);
      round_to_float({&c.qkv, &c.R});
      Vec probs, dqkv(c.qkv.size());
      Vec want = c.forward(&probs);
      c.backward(dqkv);
      want.insert(want.end(), probs.begin(), probs.end());
      want.insert(want.end(), dqkv.begin(), dqkv.end());
      const VecF first = run_float(c.qkv, c.R, s);
      expect_close("float vs double", first, want, 1e-5);
      for (int threads : {1, 2, 3}) {
        with_threads(threads, [&] {
          EXPECT_TRUE(bitwise_equal(first, run_float(c.qkv, c.R, s))) << Hkv << " " << threads;
        });
      }
    }
  }
}

namespace {

// Forward + backward of the current kernel (Hkv = H) or of the one before GQA
// (attention_before_gqa.h) on the same inputs, in Real; out, probs and dqkv concatenated.
template <class Real>
std::vector<Real> run_mha(const Vec& qkv, const Vec& dout, Shape s, bool before_gqa) {
  const std::vector<Real> q(qkv.begin(), qkv.end()), d(dout.begin(), dout.end());
  std::vector<Real> out(d.size()), probs(static_cast<size_t>(s.B) * s.H * s.T * s.T),
      dqkv(q.size());
  if (before_gqa) {
    frozen_mha::attention_forward(out.data(), probs.data(), q.data(), s.B, s.T, s.C, s.H,
                                  s.window);
    frozen_mha::attention_backward(dqkv.data(), d.data(), q.data(), probs.data(), s.B, s.T, s.C,
                                   s.H, s.window);
  } else {
    attention_forward(out.data(), probs.data(), q.data(), s.B, s.T, s.H, s.H, s.D(), s.window);
    attention_backward(dqkv.data(), d.data(), q.data(), probs.data(), s.B, s.T, s.H, s.H, s.D(),
                       s.window);
  }
  out.insert(out.end(), probs.begin(), probs.end());
  out.insert(out.end(), dqkv.begin(), dqkv.end());
  return out;
}

}  // namespace

TEST(Attention, MultiHeadBitwiseAsBeforeGroupedQuery) {
  // Hkv = H must keep every bit of the multi-head kernel: out, probs and dqkv, in float (what
  // training uses) and double, at several thread counts, on shapes past several row blocks.
  const Shape shapes[] = {{2, 5, 12, 3, 0}, {2, 5, 12, 3, 2}, {3, 80, 32, 4, 0},
                          {3, 80, 32, 4, 24}, {1, 130, 64, 2, 65}, {2, 40, 48, 1, 0}};
  for (const Shape& s : shapes) {
    AttentionCase c(20, s);
    for (int threads : {1, 2, 3}) {
      with_threads(threads, [&] {
        EXPECT_TRUE(bitwise_equal(run_mha<float>(c.qkv, c.R, s, false),
                                  run_mha<float>(c.qkv, c.R, s, true)))
            << "float T=" << s.T << " window=" << s.window << " threads=" << threads;
        EXPECT_TRUE(bitwise_equal(run_mha<double>(c.qkv, c.R, s, false),
                                  run_mha<double>(c.qkv, c.R, s, true)))
            << "double T=" << s.T << " window=" << s.window << " threads=" << threads;
      });
    }
  }
}

// Context parallelism on the CPU kernel: each of cp ranks takes the queries of its rows
// (context_rows: chunks r and 2cp-1-r) against the whole sequence's keys. Its outputs and saved
// probabilities are the whole sequence's rows, and the whole sequence's gradient is the sum of
// the ranks' (each holds its queries' dq and its share of every key's dk and dv, which the
// reduce-scatter sums). Documents crossing chunk and rank boundaries, one-token documents, a
// document spanning every rank (row 0), a window smaller than a chunk.
TEST(Attention, ContextParallelRanksMakeTheWholeSequence) {
  for (const int cp : {2, 4})
    for (const int window : {0, 3})
      for (const int Hkv : {0, 1}) {
        const int T = 16 * cp;  // chunks of 8 rows (kRowBlock is 32: blocks cut at chunk edges)
        const Shape s{3, T, 16, 4, window, Hkv, random_docs(7 + cp, 3, T)};
        SCOPED_TRACE(::testing::Message() << "cp " << cp << " window " << window << " Hkv " << s.kv());
        const AttentionCase c(21 + cp, s);
        Vec probs;
        const Vec out = c.forward(&probs);
        Vec dqkv(c.qkv.size(), 0.0);
        c.backward(dqkv);
        Vec summed(c.qkv.size(), 0.0);
        int64_t rows_seen = 0;
        for (int r = 0; r < cp; ++r) {
          const myriad::ContextRows rows = myriad::context_rows(T, cp, r);
          const int Tq = static_cast<int>(rows.count());
          rows_seen += Tq;
          // This rank's rows of R (the output's gradient) and where each sits in the sequence.
          std::vector<int> at;
          for (int k = 0; k < rows.n; ++k)
            for (int64_t i = rows.begin[k]; i < rows.end[k]; ++i) at.push_back(static_cast<int>(i));
          ASSERT_EQ(static_cast<int>(at.size()), Tq);
          Vec dout(static_cast<size_t>(s.B) * Tq * s.C), o(dout.size()), p(static_cast<size_t>(s.B) * s.H * Tq * T);
          for (int b = 0; b < s.B; ++b)
            for (int q = 0; q < Tq; ++q)
              for (int e = 0; e < s.C; ++e)
                dout[(static_cast<size_t>(b) * Tq + q) * s.C + e] = c.R[(static_cast<size_t>(b) * T + at[q]) * s.C + e];
          attention_forward(o.data(), p.data(), c.qkv.data(), s.B, T, s.H, s.kv(), s.D(), window, s.doc_starts(), &rows);
          for (int b = 0; b < s.B; ++b)
            for (int q = 0; q < Tq; ++q) {
              for (int e = 0; e < s.C; ++e)
                ASSERT_NEAR(o[(static_cast<size_t>(b) * Tq + q) * s.C + e], out[(static_cast<size_t>(b) * T + at[q]) * s.C + e],
                            1e-12);
              for (int h = 0; h < s.H; ++h)
                for (int j = 0; j < T; ++j)
                  ASSERT_NEAR(p[((static_cast<size_t>(b) * s.H + h) * Tq + q) * T + j],
                              probs[((static_cast<size_t>(b) * s.H + h) * T + at[q]) * T + j], 1e-12);
            }
          Vec mine(c.qkv.size(), 0.0);
          attention_backward(mine.data(), dout.data(), c.qkv.data(), p.data(), s.B, T, s.H, s.kv(), s.D(), window,
                             s.doc_starts(), &rows);
          for (size_t i = 0; i < mine.size(); ++i) summed[i] += mine[i];
        }
        EXPECT_EQ(rows_seen, T);
        for (size_t i = 0; i < dqkv.size(); ++i) ASSERT_NEAR(summed[i], dqkv[i], 1e-11) << "element " << i;
      }
}
