#include <gtest/gtest.h>

#include "op_test_util.h"
#include "ops/cpu/ops.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;

namespace {

constexpr int B = 2, T = 5, C = 12, Vp = 16, maxT = 8;

struct EmbeddingCase {
  std::vector<int32_t> tokens;
  Vec wte, wpe, R;

  explicit EmbeddingCase(uint64_t seed) {
    std::mt19937_64 rng(seed);
    tokens = random_ints(rng, B * T, 11);
    tokens[3] = tokens[0];  // shared rows, within a sequence and across the batch
    tokens[7] = tokens[0];
    tokens[9] = tokens[4];
    wte = random_vec(rng, Vp * C);
    wpe = random_vec(rng, maxT * C);
    R = random_vec(rng, B * T * C);
  }
  double loss() const {
    Vec out(B * T * C);
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, R);
  }
};

}  // namespace

TEST(Embedding, Forward) {
  EmbeddingCase c(1);
  Vec out(B * T * C);
  embedding_forward(out.data(), c.tokens.data(), c.wte.data(), c.wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < C; ++i)
        ASSERT_EQ(out[(b * T + t) * C + i], c.wte[c.tokens[b * T + t] * C + i] + c.wpe[t * C + i]);
}

TEST(Embedding, GradientsMatchFiniteDifferencesAndAccumulate) {
  EmbeddingCase c(2);
  Vec dwte(Vp * C), dwpe(maxT * C);
  embedding_backward(dwte.data(), dwpe.data(), c.R.data(), c.tokens.data(), B, T, C);
  auto loss = [&] { return c.loss(); };
  check_gradient("dwte", c.wte, dwte, loss);
  check_gradient("dwpe", c.wpe, dwpe, loss);
  for (int i = T * C; i < maxT * C; ++i) ASSERT_EQ(dwpe[i], 0.0) << "rows past T are untouched";

  Vec dwte2 = dwte, dwpe2 = dwpe;
  embedding_backward(dwte2.data(), dwpe2.data(), c.R.data(), c.tokens.data(), B, T, C);
  for (Vec* v : {&dwte, &dwpe})
    for (auto& x : *v) x *= 2;
  expect_close("dwte", dwte2, dwte, 1e-14);
  expect_close("dwpe", dwpe2, dwpe, 1e-14);
}

TEST(Embedding, FloatMatchesDoubleAndIsDeterministic) {
  const int b = 4, t = 33, c = 40, vp = 24;
  std::mt19937_64 rng(3);
  const std::vector<int32_t> tokens = random_ints(rng, b * t, 5);  // many repeats
  Vec wte = random_vec(rng, vp * c), wpe = random_vec(rng, t * c),
      dout = random_vec(rng, b * t * c);
  round_to_float({&wte, &wpe, &dout});
  Vec out(b * t * c), dwte(vp * c), dwpe(t * c);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), b, t, c);
  auto run_float = [&] {
    VecF fwte = to_float(wte), fwpe = to_float(wpe), fdout = to_float(dout);
    VecF fout(b * t * c), fdwte(vp * c), fdwpe(t * c);
    embedding_forward(fout.data(), tokens.data(), fwte.data(), fwpe.data(), b, t, c);
    embedding_backward(fdwte.data(), fdwpe.data(), fdout.data(), tokens.data(), b, t, c);
    fout.insert(fout.end(), fdwte.begin(), fdwte.end());
    fout.insert(fout.end(), fdwpe.begin(), fdwpe.end());
    return fout;
  };
  const VecF first = run_float();
  Vec want = out;
  want.insert(want.end(), dwte.begin(), dwte.end());
  want.insert(want.end(), dwpe.begin(), dwpe.end());
  expect_close("float vs double", first, want, 1e-5);
  for (int threads : {1, 3}) {
    with_threads(threads, [&] { EXPECT_TRUE(bitwise_equal(first, run_float())) << threads; });
  }
}

// A context-parallel rank's rows take the position rows of their places in the sequence (chunks r
// and 2cp-1-r), and the ranks' position gradients sum to the sequence's.
TEST(Embedding, AContextParallelRanksRowsTakeTheirPositions) {
  const int cp = 2, Tw = 8;
  std::mt19937_64 rng(9);
  const std::vector<int32_t> tokens = random_ints(rng, B * Tw, 11);
  const Vec wte = random_vec(rng, Vp * C), wpe = random_vec(rng, maxT * C), dout = random_vec(rng, B * Tw * C);
  Vec out(B * Tw * C), dwte(Vp * C, 0.0), dwpe(maxT * C, 0.0);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, Tw, C);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, Tw, C);
  Vec dwte_sum(Vp * C, 0.0), dwpe_sum(maxT * C, 0.0);
  for (int r = 0; r < cp; ++r) {
    const myriad::ContextRows rows = myriad::context_rows(Tw, cp, r);
    const int Tq = static_cast<int>(rows.count());
    std::vector<int32_t> mine;
    Vec my_dout, want;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < Tq; ++i) {
        const int64_t at = int64_t(b) * Tw + rows.position(i);
        mine.push_back(tokens[at]);
        my_dout.insert(my_dout.end(), dout.begin() + at * C, dout.begin() + (at + 1) * C);
        want.insert(want.end(), out.begin() + at * C, out.begin() + (at + 1) * C);
      }
    Vec got(B * Tq * C);
    embedding_forward(got.data(), mine.data(), wte.data(), wpe.data(), B, Tq, C, &rows);
    EXPECT_TRUE(bitwise_equal(got, want)) << "rank " << r;
    embedding_backward(dwte_sum.data(), dwpe_sum.data(), my_dout.data(), mine.data(), B, Tq, C, &rows);
  }
  expect_close("dwte", dwte_sum, dwte, 1e-12);
  expect_close("dwpe", dwpe_sum, dwpe, 1e-12);
}
