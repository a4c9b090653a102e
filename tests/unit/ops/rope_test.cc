#include <gtest/gtest.h>

#include <complex>
#include <numbers>
#include <stdexcept>

#include "op_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/rope.h"

using namespace myriad::cpu;
using namespace myriad::cpu::testing;
using myriad::rope_frequencies;
using myriad::RopeScaling;

namespace {

// B batch rows of T tokens, each (Hkv, G+2, D): G query heads, a key head, a value head per group.
struct Shape {
  int B, T, Hkv, G, D, pos0;
  size_t size() const { return static_cast<size_t>(B) * T * Hkv * (G + 2) * D; }
};

// Position-dependent frequencies that are not all tiny, so that every pair turns noticeably.
std::vector<double> test_freqs(int D) { return rope_frequencies(100.0, D, RopeScaling{}); }

// Reference: each rotated head as D/2 complex numbers (first half real, second half imaginary)
// multiplied by exp(i p f); value heads copied.
Vec naive_rope(const Vec& qkv, const std::vector<double>& freqs, Shape s) {
  Vec out = qkv;
  const int half = s.D / 2;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int g = 0; g < s.Hkv; ++g)
        for (int slot = 0; slot < s.G + 1; ++slot) {  // the G queries and the key; not slot G+1
          const size_t base =
              ((((static_cast<size_t>(b) * s.T + t) * s.Hkv + g) * (s.G + 2)) + slot) * s.D;
          for (int i = 0; i < half; ++i) {
            const std::complex<double> z(qkv[base + i], qkv[base + half + i]);
            const std::complex<double> r = z * std::polar(1.0, (s.pos0 + t) * freqs[i]);
            out[base + i] = r.real();
            out[base + half + i] = r.imag();
          }
        }
  return out;
}

Vec run_forward(Vec qkv, const std::vector<double>& freqs, Shape s) {
  rope_forward(qkv.data(), freqs.data(), s.B, s.T, s.Hkv, s.G, s.D, s.pos0);
  return qkv;
}

bool is_value_slot(size_t index, Shape s) {
  return (index / s.D) % (s.G + 2) == static_cast<size_t>(s.G + 1);
}

const Shape kShapes[] = {
    {2, 5, 3, 1, 8, 0},   // plain multi-head: (H, 3, D)
    {2, 5, 2, 2, 6, 3},   // two query heads per group, odd D/2, offset positions
    {1, 7, 1, 4, 4, 11},  // multi-query
};

}  // namespace

TEST(Rope, ForwardMatchesComplexRotation) {
  for (const Shape& s : kShapes) {
    std::mt19937_64 rng(1);
    const Vec qkv = random_vec(rng, s.size());
    const auto freqs = test_freqs(s.D);
    expect_close("rope", run_forward(qkv, freqs, s), naive_rope(qkv, freqs, s), 1e-14);
  }
}

TEST(Rope, GradientsMatchFiniteDifferences) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("G=" + std::to_string(s.G));
    std::mt19937_64 rng(2);
    Vec qkv = random_vec(rng, s.size());
    const Vec R = random_vec(rng, s.size());
    const auto freqs = test_freqs(s.D);
    Vec grad = R;  // dL/d(rotated) = R, turned in place into dL/d(qkv)
    rope_backward(grad.data(), freqs.data(), s.B, s.T, s.Hkv, s.G, s.D, s.pos0);
    check_gradient("dqkv", qkv, grad, [&] { return dot(run_forward(qkv, freqs, s), R); });
  }
}

TEST(Rope, BackwardInvertsForwardAndLeavesValuesAlone) {
  for (const Shape& s : kShapes) {
    std::mt19937_64 rng(3);
    const Vec qkv = random_vec(rng, s.size(), -3, 3);
    // Long-context positions too: the inverse must hold at large angles.
    for (int pos0 : {s.pos0, 100000}) {
      Shape sp = s;
      sp.pos0 = pos0;
      const auto freqs = test_freqs(s.D);
      Vec x = run_forward(qkv, freqs, sp);
      for (size_t i = 0; i < x.size(); ++i) {
        if (is_value_slot(i, sp)) {
          ASSERT_EQ(x[i], qkv[i]) << "value moved by forward at " << i;
        }
      }
      rope_backward(x.data(), freqs.data(), sp.B, sp.T, sp.Hkv, sp.G, sp.D, sp.pos0);
      for (size_t i = 0; i < x.size(); ++i) {
        if (is_value_slot(i, sp)) {
          ASSERT_EQ(x[i], qkv[i]) << "value moved by backward at " << i;
        }
      }
      expect_close("backward(forward(x))", x, qkv, 1e-12);
    }
  }
}

TEST(Rope, RowsAtAnOffsetAreTheSameRowsOfALongerSequence) {
  // pos0 shifts positions only: T = 3 at pos0 = 4 is rows 4..6 of T = 7 from 0, bit for bit.
  const Shape longer{1, 7, 2, 2, 8, 0}, tail{1, 3, 2, 2, 8, 4};
  std::mt19937_64 rng(4);
  const Vec qkv = random_vec(rng, longer.size());
  const auto freqs = test_freqs(8);
  const Vec all = run_forward(qkv, freqs, longer);
  const size_t row = longer.size() / longer.T;
  const Vec part(qkv.begin() + 4 * row, qkv.end());
  const Vec got = run_forward(part, freqs, tail);
  EXPECT_TRUE(bitwise_equal(got, Vec(all.begin() + 4 * row, all.end())));
}

// A context-parallel rank's rows (chunks r and 2cp-1-r of the sequence, one after the other in
// each of B rows) rotate by their positions in the sequence: they are the sequence's rows, bit for
// bit, forward and backward.
TEST(Rope, AContextParallelRanksRowsAreTheSequencesRows) {
  const int cp = 2, T = 8;
  const Shape whole{2, T, 2, 2, 8, 0};
  std::mt19937_64 rng(5);
  const Vec qkv = random_vec(rng, whole.size());
  const auto freqs = test_freqs(8);
  const Vec all = run_forward(qkv, freqs, whole);
  Vec back_all = qkv;
  rope_backward(back_all.data(), freqs.data(), whole.B, T, whole.Hkv, whole.G, whole.D, 0);
  const size_t row = whole.size() / (whole.B * T);
  for (int r = 0; r < cp; ++r) {
    const myriad::ContextRows rows = myriad::context_rows(T, cp, r);
    const int Tq = static_cast<int>(rows.count());
    Vec mine, want, want_back;
    for (int b = 0; b < whole.B; ++b)
      for (int i = 0; i < Tq; ++i) {
        const size_t at = (static_cast<size_t>(b) * T + rows.position(i)) * row;
        mine.insert(mine.end(), qkv.begin() + at, qkv.begin() + at + row);
        want.insert(want.end(), all.begin() + at, all.begin() + at + row);
        want_back.insert(want_back.end(), back_all.begin() + at, back_all.begin() + at + row);
      }
    Vec back = mine;
    rope_forward(mine.data(), freqs.data(), whole.B, Tq, whole.Hkv, whole.G, whole.D, 0, &rows);
    rope_backward(back.data(), freqs.data(), whole.B, Tq, whole.Hkv, whole.G, whole.D, 0, &rows);
    EXPECT_TRUE(bitwise_equal(mine, want)) << "rank " << r;
    EXPECT_TRUE(bitwise_equal(back, want_back)) << "rank " << r;
  }
}

TEST(Rope, FloatMatchesDoubleAndIsDeterministic) {
  const Shape s{4, 33, 2, 3, 16, 7};
  std::mt19937_64 rng(5);
  Vec qkv = random_vec(rng, s.size());
  round_to_float({&qkv});
  const auto freqs = rope_frequencies(10000.0, s.D, RopeScaling{});
  const Vec want = run_forward(qkv, freqs, s);
  auto run_float = [&] {
    VecF x = to_float(qkv);
    rope_forward(x.data(), freqs.data(), s.B, s.T, s.Hkv, s.G, s.D, s.pos0);
    VecF y = x;
    rope_backward(y.data(), freqs.data(), s.B, s.T, s.Hkv, s.G, s.D, s.pos0);
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  const VecF first = run_float();
  expect_close("float vs double", VecF(first.begin(), first.begin() + s.size()), want, 1e-6);
  expect_close("float round trip", VecF(first.begin() + s.size(), first.end()), qkv, 1e-6);
  for (int threads : {1, 2, 3})
    with_threads(threads, [&] { EXPECT_TRUE(bitwise_equal(first, run_float())) << threads; });
}

TEST(RopeFrequencies, UnscaledArePowersOfTheta) {
  for (double theta : {10000.0, 500000.0}) {
    const int D = 64;
    const auto f = rope_frequencies(theta, D, RopeScaling{});
    ASSERT_EQ(f.size(), 32u);
    EXPECT_EQ(f[0], 1.0);
    for (int i = 0; i < D / 2; ++i)
      EXPECT_NEAR(f[i], 1.0 / std::pow(theta, 2.0 * i / D), 1e-15 * f[i]) << i;
    // theta^(-2/D) between neighbours.
    for (int i = 1; i < D / 2; ++i)
      EXPECT_NEAR(f[i] / f[i - 1], std::pow(theta, -2.0 / D), 1e-14) << i;
  }
}

TEST(RopeFrequencies, Llama3ScalingAtLlama31Parameters) {
  // Llama 3.1: theta 500000, factor 8, low 1, high 4, original context 8192, head size 128.
  // Wavelength 2 pi / f against 8192 / 4 = 2048 and 8192 / 1: pairs 0..28 are fast (kept),
  // 29..34 in between (blended), 35..63 slow (divided by 8). The numbers below were worked out
  // by hand from the formula: a = (8192 / wavelength - 1) / 3, f' = (1 - a) f / 8 + a f.
  RopeScaling s;
  s.type = "llama3";
  const auto f = rope_frequencies(500000.0, 128, s);
  const auto plain = rope_frequencies(500000.0, 128, RopeScaling{});
  ASSERT_EQ(f.size(), 64u);
  struct Want {
    int i;
    double f;
  };
  const Want want[] = {
      {0, 1.0},                       // wavelength 6.3: kept
      {20, 0.016560440080994446},     // 379: kept
      {28, 0.003211445994752591},     // 1956: kept (just under 2048)
      {29, 0.002166570763503359},     // 2402: a = 0.8036
      {30, 0.0013718935677611381},    // 2948: a = 0.5928
      {32, 0.0005248461609929547},    // 4443: f = theta^-1/2, a = 0.2813
      {34, 0.0001785078127679964},    // 6695: a = 0.0745
      {35, 9.556212353964683e-05},    // 8219: just over 8192, divided by 8
      {40, 3.428102195952591e-05},    // divided by 8
      {63, 3.068925988914511e-07},    // divided by 8
  };
  for (const Want& w : want) EXPECT_NEAR(f[w.i], w.f, 1e-13 * w.f) << "pair " << w.i;
  for (int i = 0; i <= 28; ++i) EXPECT_EQ(f[i], plain[i]) << i;
  for (int i = 35; i < 64; ++i) EXPECT_EQ(f[i], plain[i] / 8) << i;
  // Smooth in between: the scale f' / f falls monotonically from 1 to 1/8, and f' decreases.
  for (int i = 1; i < 64; ++i) {
    EXPECT_LT(f[i], f[i - 1]) << i;
    EXPECT_LE(f[i] / plain[i], f[i - 1] / plain[i - 1] + 1e-15) << i;
    EXPECT_GE(f[i] / plain[i], 1.0 / 8 - 1e-15) << i;
  }
}

TEST(RopeFrequencies, Llama3BlendIsContinuousAtBothEnds) {
  // The blend meets "kept" at wavelength L / high and "divided" at L / low: pick theta and D
  // so that a pair lands near each edge and check the scale is close to 1 and 1 / factor there.
  RopeScaling s;
  s.type = "llama3";
  s.factor = 4;
  s.low_freq_factor = 2;
  s.high_freq_factor = 8;
  s.original_max_positions = 1 << 12;
  const int D = 4096;  // dense pairs: neighbouring wavelengths differ by under 1%
  const auto f = rope_frequencies(1e6, D, s);
  const auto plain = rope_frequencies(1e6, D, RopeScaling{});
  const double L = 4096, hi_wave = L / 8, lo_wave = L / 2;
  int near_hi = 0, near_lo = 0;
  for (int i = 0; i < D / 2; ++i) {
    const double wave = 2 * std::numbers::pi / plain[i];
    const double scale = f[i] / plain[i];
    if (std::abs(wave / hi_wave - 1) < 0.01) {
      EXPECT_NEAR(scale, 1.0, 0.02) << i;
      ++near_hi;
    }
    if (std::abs(wave / lo_wave - 1) < 0.01) {
      EXPECT_NEAR(scale, 0.25, 0.02) << i;
      ++near_lo;
    }
  }
  EXPECT_GT(near_hi, 0);
  EXPECT_GT(near_lo, 0);
}

TEST(RopeFrequencies, RefusesBadInput) {
  EXPECT_THROW(rope_frequencies(0.0, 64, RopeScaling{}), std::invalid_argument);
  EXPECT_THROW(rope_frequencies(-1.0, 64, RopeScaling{}), std::invalid_argument);
  EXPECT_THROW(rope_frequencies(10000.0, 63, RopeScaling{}), std::invalid_argument);
  EXPECT_THROW(rope_frequencies(10000.0, 0, RopeScaling{}), std::invalid_argument);
  RopeScaling yarn;
  yarn.type = "yarn";
  EXPECT_THROW(rope_frequencies(10000.0, 64, yarn), std::invalid_argument);
  RopeScaling inverted;
  inverted.type = "llama3";
  inverted.low_freq_factor = 4;
  inverted.high_freq_factor = 1;
  EXPECT_THROW(rope_frequencies(10000.0, 64, inverted), std::invalid_argument);
}
