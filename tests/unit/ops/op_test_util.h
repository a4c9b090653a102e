// Shared helpers of the CPU op tests: seeded random buffers, the finite-difference gradient
// check (double precision), and float/double conversions for the precision tests.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace myriad::cpu::testing {

using Vec = std::vector<double>;
using VecF = std::vector<float>;

inline Vec random_vec(std::mt19937_64& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<int32_t> random_ints(std::mt19937_64& rng, size_t n, int32_t bound) {
  std::uniform_int_distribution<int32_t> dist(0, bound - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline VecF to_float(const Vec& v) { return VecF(v.begin(), v.end()); }

// Rounds each buffer to float values, so that the float and double paths see the same inputs.
inline void round_to_float(std::initializer_list<Vec*> bufs) {
  for (Vec* v : bufs)
    for (auto& x : *v) x = static_cast<float>(x);
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic[i] against the central difference (L(x+h) - L(x-h)) / 2h of loss() for every
// element of x (loss() reads x; x is restored afterwards). h is relative to the value's scale.
template <class Loss>
void check_gradient(const std::string& name, Vec& x, const Vec& analytic, Loss loss,
                    double tol = 1e-6, double rel_h = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  int failures = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    const double h = rel_h * std::max(1.0, std::abs(saved));
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    const double numeric = (lp - lm) / (2 * h);
    const double err = std::abs(numeric - analytic[i]);
    if (err > tol * std::max(1.0, std::abs(numeric)) && ++failures <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric;
    }
  }
  EXPECT_EQ(failures, 0) << name << ": " << failures << " of " << x.size() << " elements off";
}

// Every element of got within tol of want (relative to max(1, |want|)).
template <class A, class B>
void expect_close(const std::string& name, const A& got, const B& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << name;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    const double w = want[i];
    if (!(std::abs(g - w) <= tol * std::max(1.0, std::abs(w))) && ++failures <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: got " << g << ", want " << w;
    }
  }
  EXPECT_EQ(failures, 0) << name << ": " << failures << " of " << got.size() << " elements off";
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Runs fn with n OpenMP threads, then restores the previous setting.
template <class F>
void with_threads(int n, F fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(saved);
}

}  // namespace myriad::cpu::testing
