// Flash attention on the GPU against the CPU oracle (ops/cpu attention, fp32 on the same
// bf16-rounded inputs), with log-sum-exp checked against a double computation; every tile
// configuration the kernels offer is run; backward is checked for bitwise determinism. Both
// Myriad's kernel and cuDNN's run multi-head (G = 1), grouped-query (G = 4) and multi-query
// (G = H) shapes.
// AttentionBench.* time the kernels (TFLOP/s, median of 20) and assert only finite output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/attention_detail.cuh"
#include "ops/cuda/cudnn_attention.h"
#include "ops/cuda/ops.cuh"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;
using cu::attn_detail::Config;
using cu::attn_detail::KernelCfg;

std::string str(const KernelCfg& k) {
  return std::to_string(k.warps) + "x" + std::to_string(k.mt) + "/" + std::to_string(k.tile);
}
std::string str(const Config& c) { return str(c.fwd) + " " + str(c.dkdv) + " " + str(c.dq); }

// The default config first, then configs that together run every compiled tiling of each kernel.
std::vector<Config> all_configs(int D) {
  namespace ad = cu::attn_detail;
  const auto f = ad::fwd_variants(D), k = ad::dkdv_variants(D), q = ad::dq_variants(D);
  std::vector<Config> r = {ad::default_config(D)};
  const size_t n = std::max({f.size(), k.size(), q.size()});
  for (size_t i = 0; i < n; ++i) r.push_back(Config{f[i % f.size()], k[i % k.size()], q[i % q.size()]});
  return r;
}

struct Case {
  int B, T, H, D, window;
  int Hkv = 0;  // 0 = H
  std::vector<int32_t> docs = {};  // (B,T) each position's document start (data.document_mask); empty: none
  const int32_t* doc_starts() const { return docs.empty() ? nullptr : docs.data(); }
  int kv() const { return Hkv > 0 ? Hkv : H; }
  int G() const { return H / kv(); }
  size_t qkv_per_token() const { return size_t(H + 2 * kv()) * D; }
};

// ||a - b|| / max(||b||, floor): the floor keeps a part whose exact gradient is 0 (dq with
// window 1) from dividing rounding noise by 0.
double part_err(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    r += double(b[i]) * b[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(r), floor);
}

// Part p (0 the query heads, 1 the keys, 2 the values) of a (B,T,Hkv,G+2,D) tensor.
std::vector<float> qkv_part(const std::vector<float>& x, int p, const Case& c) {
  const int D = c.D, G = c.G();
  const size_t group = size_t(G + 2) * D;
  std::vector<float> y;
  for (size_t i = 0; i < x.size(); i += group) {
    const size_t from = p == 0 ? 0 : size_t(G + p - 1) * D, n = p == 0 ? size_t(G) * D : D;
    y.insert(y.end(), x.begin() + i + from, x.begin() + i + from + n);
  }
  return y;
}

double norm(const std::vector<float>& x) {
  double r = 0;
  for (float v : x) r += double(v) * v;
  return std::sqrt(r);
}

// Fresh bf16-rounded inputs and what the CPU oracle makes of them.
struct Oracle {
  std::vector<float> qkv, dout, out_ref, dq_ref, dk_ref, dv_ref;
  std::vector<double> lse_ref;  // natural log
  double floor;
};

Oracle oracle(const Case& c) {
  const int B = c.B, T = c.T, H = c.H, D = c.D, C = H * D, W = c.window, Hkv = c.kv(), G = c.G();
  std::mt19937_64 gen(seed() + 1000003ull * T + 101ull * D + W + 7919ull * Hkv);
  const size_t ts = c.qkv_per_token();
  const size_t nqkv = size_t(B) * T * ts, nout = size_t(B) * T * C, nlse = size_t(B) * H * T;
  const std::vector<float> qkv = round_bf16(randn(nqkv, gen));
  const std::vector<float> dout = round_bf16(randn(nout, gen));

  // Oracle.
  std::vector<float> out_ref(nout), probs(size_t(B) * H * T * T), dqkv_ref(nqkv, 0.f);
  myriad::cpu::attention_forward<float>(out_ref.data(), probs.data(), qkv.data(), B, T, H, Hkv, D, W,
                                        c.doc_starts());
  myriad::cpu::attention_backward<float>(dqkv_ref.data(), dout.data(), qkv.data(), probs.data(),
                                         B, T, H, Hkv, D, W, c.doc_starts());
  std::vector<double> lse_ref(nlse);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const size_t group = size_t(h / G) * (G + 2) * D;
        const float* q = &qkv[(size_t(b) * T + i) * ts + group + size_t(h % G) * D];
        int lo = W > 0 ? std::max(0, i - W + 1) : 0;
        if (!c.docs.empty()) lo = std::max(lo, int(c.docs[size_t(b) * T + i]));
        std::vector<double> s;
        for (int j = lo; j <= i; ++j) {
          const float* k = &qkv[(size_t(b) * T + j) * ts + group + size_t(G) * D];
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += double(q[d]) * k[d];
          s.push_back(acc / std::sqrt(double(D)));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        lse_ref[(size_t(b) * H + h) * T + i] = m + std::log(sum);
      }
  const std::vector<float> dq_ref = qkv_part(dqkv_ref, 0, c), dk_ref = qkv_part(dqkv_ref, 1, c),
                           dv_ref = qkv_part(dqkv_ref, 2, c);
  const double floor = 1e-2 * norm(dqkv_ref);
  return {qkv, dout, out_ref, dq_ref, dk_ref, dv_ref, lse_ref, floor};
}

void run_case(const Case& c) {
  const std::vector<Config> configs = all_configs(c.D);
  const int B = c.B, T = c.T, H = c.H, D = c.D, C = H * D, W = c.window, Hkv = c.kv();
  const size_t nqkv = size_t(B) * T * c.qkv_per_token(), nout = size_t(B) * T * C, nlse = size_t(B) * H * T;
  const Oracle o = oracle(c);
  const auto &qkv = o.qkv, &dout = o.dout, &out_ref = o.out_ref, &dq_ref = o.dq_ref, &dk_ref = o.dk_ref,
             &dv_ref = o.dv_ref;
  const auto& lse_ref = o.lse_ref;
  const double floor = o.floor;

  Dev<bf16> d_qkv(nqkv), d_out(nout), d_dout(nout), d_dqkv(nqkv);
  Dev<float> d_lse(nlse), d_scr(cu::attention_scratch_floats(B, T, H, D));
  Dev<int32_t> d_docs(c.docs.size());
  d_qkv.upload(to_bf16(qkv));
  d_dout.upload(to_bf16(dout));
  d_docs.upload(c.docs);
  const int32_t* docs = c.docs.empty() ? nullptr : d_docs.p;

  for (const Config& cfg : configs) {
    SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " H=" << H << " Hkv=" << Hkv << " D=" << D
                                      << " window=" << W << (docs ? " documents" : "") << " tilings "
                                      << str(cfg));
    d_out.poison();
    d_lse.poison();
    cu::attn_detail::forward(cfg, d_out.p, d_lse.p, d_qkv.p, B, T, H, Hkv, D, W, 0, docs);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> out = to_float(d_out.download());
    const std::vector<float> lse = d_lse.download();
    const double e_out = rel_err(out, out_ref);
    double e_lse = 0;
    for (size_t i = 0; i < nlse; ++i)
      e_lse = std::max(e_lse, std::isfinite(lse[i]) ? std::fabs(lse[i] - lse_ref[i]) : INFINITY);
    EXPECT_LT(e_out, 1e-2);
    EXPECT_LT(e_lse, 1e-3);

    d_dqkv.poison();
    d_scr.poison();
    cu::attn_detail::backward(cfg, d_dqkv.p, d_scr.p, d_dout.p, d_out.p, d_qkv.p, d_lse.p, B, T,
                              H, Hkv, D, W, 0, docs);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<bf16> g1 = d_dqkv.download();
    d_dqkv.poison();
    d_scr.poison();
    cu::attn_detail::backward(cfg, d_dqkv.p, d_scr.p, d_dout.p, d_out.p, d_qkv.p, d_lse.p, B, T,
                              H, Hkv, D, W, 0, docs);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<bf16> g2 = d_dqkv.download();
    EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(bf16)), 0)
        << "backward is not deterministic";
    const std::vector<float> dqkv = to_float(g1);
    const double e_dq = part_err(qkv_part(dqkv, 0, c), dq_ref, floor);
    const double e_dk = part_err(qkv_part(dqkv, 1, c), dk_ref, floor);
    const double e_dv = part_err(qkv_part(dqkv, 2, c), dv_ref, floor);
    EXPECT_LT(e_dq, 1e-2);
    EXPECT_LT(e_dk, 1e-2);
    EXPECT_LT(e_dv, 1e-2);
    if (::testing::Test::HasFailure() || T >= 257)
      std::printf("  B=%d T=%d H=%d Hkv=%d D=%d w=%d [%s]: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                  B, T, H, Hkv, D, W, str(cfg).c_str(), e_out, e_lse, e_dq, e_dk, e_dv);
  }
}

class AttentionTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(AttentionTest, MatchesCpuOracle) {
  const auto [D, T, window] = GetParam();
  run_case(Case{2, T, 3, D, window});
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Combine(::testing::Values(64, 80, 128),
                                            ::testing::Values(1, 7, 64, 100, 257),
                                            ::testing::Values(0, 1, 5, 64)));

// Grouped-query and multi-query attention: 4 query heads per key/value head, and all of them.
class AttentionGqa : public ::testing::TestWithParam<std::tuple<int, int, int, std::pair<int, int>>> {};

TEST_P(AttentionGqa, MatchesCpuOracle) {
  const auto [D, T, window, heads] = GetParam();
  run_case(Case{2, T, heads.first, D, window, heads.second});
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGqa,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(7, 100, 257),
                                            ::testing::Values(0, 5),
                                            ::testing::Values(std::make_pair(8, 2), std::make_pair(4, 1))));

// Packed documents (data.document_mask) against the CPU oracle, every tiling: alone, with a
// window, with grouped-query heads; short documents inside one tile and long ones across many.
class AttentionDocuments : public ::testing::TestWithParam<std::tuple<int, int, int, int>> {};

TEST_P(AttentionDocuments, MatchesCpuOracle) {
  const auto [D, T, window, mean_len] = GetParam();
  run_case(Case{3, T, 4, D, window, 0, random_docs(3, T, mean_len, 17 * T + D)});
  run_case(Case{3, T, 4, D, window, 1, random_docs(3, T, mean_len, 19 * T + D)});
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionDocuments,
                         ::testing::Combine(::testing::Values(64, 80, 128), ::testing::Values(7, 100, 257),
                                            ::testing::Values(0, 5, 64), ::testing::Values(3, 40)));

TEST(AttentionDocumentsLarge, MatchesCpuOracle) {
  run_case(Case{2, 1000, 2, 128, 0, 0, random_docs(2, 1000, 300, 1)});
  run_case(Case{2, 2048, 2, 64, 0, 1, random_docs(2, 2048, 500, 2)});
  run_case(Case{2, 777, 2, 80, 129, 0, random_docs(2, 777, 60, 3)});
}

TEST(AttentionLarge, MatchesCpuOracle) {
  run_case(Case{1, 1000, 2, 128, 0});
  run_case(Case{1, 1000, 2, 128, 300});
  run_case(Case{1, 2048, 1, 64, 0});
  run_case(Case{1, 777, 2, 80, 129});
}

// cuDNN's fused attention on the same oracle: output, natural-log statistics, gradients; the
// deterministic backward (the default) repeats bitwise. Outputs are poisoned before each call.
void run_cudnn_case(const Case& c, bool deterministic) {
  const int B = c.B, T = c.T, H = c.H, D = c.D, C = H * D, W = c.window, Hkv = c.kv();
  SCOPED_TRACE(::testing::Message() << "cuDNN B=" << B << " T=" << T << " H=" << H << " Hkv=" << Hkv << " D=" << D
                                    << " window=" << W << (deterministic ? " deterministic" : " atomic dQ")
                                    << (c.docs.empty() ? "" : " documents"));
  cu::cudnn::set_deterministic(deterministic);
  std::string why;
  ASSERT_TRUE(cu::cudnn::supports(B, T, H, Hkv, D, W, &why, nullptr, !c.docs.empty())) << why;
  Dev<int32_t> d_docs(c.docs.size());
  d_docs.upload(c.docs);
  const int32_t* docs = c.docs.empty() ? nullptr : d_docs.p;
  const size_t nqkv = size_t(B) * T * c.qkv_per_token(), nout = size_t(B) * T * C, nlse = size_t(B) * H * T;
  const Oracle o = oracle(c);
  Dev<bf16> d_qkv(nqkv), d_out(nout), d_dout(nout), d_dqkv(nqkv);
  Dev<float> d_lse(nlse);
  d_qkv.upload(to_bf16(o.qkv));
  d_dout.upload(to_bf16(o.dout));
  d_out.poison();
  d_lse.poison();
  cu::cudnn::attention_forward(d_out.p, d_lse.p, d_qkv.p, B, T, H, Hkv, D, W, 0, nullptr, docs);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> out = to_float(d_out.download()), lse = d_lse.download();
  double e_lse = 0;
  for (size_t i = 0; i < nlse; ++i)
    e_lse = std::max(e_lse, std::isfinite(lse[i]) ? std::fabs(lse[i] - o.lse_ref[i]) : INFINITY);
  EXPECT_LT(rel_err(out, o.out_ref), 1e-2);
  EXPECT_LT(e_lse, 1e-3);
  std::vector<bf16> g[2];
  for (auto& gi : g) {
    d_dqkv.poison();
    cu::cudnn::attention_backward(d_dqkv.p, d_dout.p, d_out.p, d_qkv.p, d_lse.p, B, T, H, Hkv, D, W, 0, nullptr, docs);
    CUDA_OK(cudaDeviceSynchronize());
    gi = d_dqkv.download();
  }
  if (deterministic)
    EXPECT_EQ(std::memcmp(g[0].data(), g[1].data(), g[0].size() * sizeof(bf16)), 0) << "backward is not deterministic";
  const std::vector<float> dqkv = to_float(g[0]);
  const double e_dq = part_err(qkv_part(dqkv, 0, c), o.dq_ref, o.floor);
  const double e_dk = part_err(qkv_part(dqkv, 1, c), o.dk_ref, o.floor);
  const double e_dv = part_err(qkv_part(dqkv, 2, c), o.dv_ref, o.floor);
  EXPECT_LT(e_dq, 1e-2);
  EXPECT_LT(e_dk, 1e-2);
  EXPECT_LT(e_dv, 1e-2);
  if (::testing::Test::HasFailure() || T >= 257)
    std::printf("  cuDNN B=%d T=%d H=%d Hkv=%d D=%d w=%d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", B, T, H,
                Hkv, D, W, rel_err(out, o.out_ref), e_lse, e_dq, e_dk, e_dv);
  cu::cudnn::set_deterministic(true);
}

class CudnnAttention : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(CudnnAttention, MatchesCpuOracle) {
  const auto [D, T, window] = GetParam();
  run_cudnn_case(Case{2, T, 3, D, window}, true);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttention,
                         ::testing::Combine(::testing::Values(64, 80, 128), ::testing::Values(128, 256, 384),
                                            ::testing::Values(0, 1, 5, 64)));

// Documents packed in the rows (data.document_mask): the documents' starts as a mask of cuDNN's
// graph; one-token documents and documents across the whole row among them (random_docs), with
// windows and grouped queries.
TEST(CudnnAttention, DocumentsMatchTheCpuOracle) {
  for (const int D : {64, 128})
    for (const int T : {128, 384})
      for (const int window : {0, 40}) {
        run_cudnn_case(Case{3, T, 4, D, window, 0, random_docs(3, T, T / 6, 23 * T + D + window)}, true);
        run_cudnn_case(Case{3, T, 4, D, window, 2, random_docs(3, T, T / 6, 29 * T + D + window)}, false);
      }
}

class CudnnAttentionGqa : public ::testing::TestWithParam<std::tuple<int, int, int, std::pair<int, int>>> {};

TEST_P(CudnnAttentionGqa, MatchesCpuOracle) {
  const auto [D, T, window, heads] = GetParam();
  run_cudnn_case(Case{2, T, heads.first, D, window, heads.second}, true);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionGqa,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(128, 256),
                                            ::testing::Values(0, 64),
                                            ::testing::Values(std::make_pair(8, 2), std::make_pair(4, 1))));

// Before 9.16, cuDNN's backward needs T % 128 == 0 (without a padding mask): such a shape is
// refused, and train.attention = auto runs it on Myriad's kernel.
TEST(CudnnAttention, RefusesWhatItCannotTake) {
  std::string why;
  if (cu::cudnn::version() > 0 && cu::cudnn::version() < 91600) {
    EXPECT_FALSE(cu::cudnn::supports(2, 100, 3, 3, 64, 0, &why));
    EXPECT_NE(why.find("multiple of 128"), std::string::npos) << why;
  }
  EXPECT_FALSE(cu::cudnn::supports(2, 128, 3, 3, 12, 0, &why));
  EXPECT_NE(why.find("head size 12"), std::string::npos) << why;
}

TEST(CudnnAttentionLarge, MatchesCpuOracleBothBackwards) {
  run_cudnn_case(Case{1, 1024, 2, 128, 0}, true);
  run_cudnn_case(Case{1, 1024, 2, 128, 0}, false);
  run_cudnn_case(Case{1, 768, 2, 80, 129}, true);
  run_cudnn_case(Case{1, 512, 2, 64, 100}, false);
}

// ---------------------------------------------------------------------------------------------
// Benchmarks
// ---------------------------------------------------------------------------------------------
__global__ void fill_random(bf16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    // Uniform on [-sqrt(3), sqrt(3)]: unit variance.
    x[i] = __float2bfloat16((float(h) * (1.f / 4294967296.f) * 2.f - 1.f) * 1.7320508f);
  }
}

template <class F>
float median_ms(F&& f, int reps = 20) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The forward's FLOPs over the visible (query, key) pairs; causal without a window counts T^2/2
// as is customary. The backward is 2.5 times as much.
double forward_flop(const Case& c) {
  double pairs = 0.5 * double(c.T) * c.T * c.B;
  if (c.window > 0 || !c.docs.empty()) {
    pairs = 0;
    for (int b = 0; b < c.B; ++b)
      for (int i = 0; i < c.T; ++i) {
        int lo = c.window > 0 ? std::max(0, i - c.window + 1) : 0;
        if (!c.docs.empty()) lo = std::max(lo, int(c.docs[size_t(b) * c.T + i]));
        pairs += i - lo + 1;
      }
  }
  return 4.0 * c.H * c.D * pairs;
}

// Times forward and backward for each config; returns finite-ness of the last outputs.
void bench(const Case& c, const std::vector<Config>& configs) {
  const int B = c.B, T = c.T, H = c.H, D = c.D, W = c.window, Hkv = c.kv();
  const size_t nqkv = size_t(B) * T * c.qkv_per_token(), nout = size_t(B) * T * H * D;
  Dev<bf16> qkv(nqkv), out(nout), dout(nout), dqkv(nqkv);
  Dev<float> lse(size_t(B) * H * T), scr(cu::attention_scratch_floats(B, T, H, D));
  Dev<int32_t> d_docs(c.docs.size());
  d_docs.upload(c.docs);
  const int32_t* docs = c.docs.empty() ? nullptr : d_docs.p;
  fill_random<<<1024, 256>>>(qkv.p, nqkv, 1u);
  fill_random<<<1024, 256>>>(dout.p, nout, 2u);
  const double fwd_flop = forward_flop(c), bwd_flop = 2.5 * fwd_flop;
  for (const Config& cfg : configs) {
    const float tf = median_ms([&] {
      cu::attn_detail::forward(cfg, out.p, lse.p, qkv.p, B, T, H, Hkv, D, W, 0, docs);
    });
    const float tb = median_ms([&] {
      cu::attn_detail::backward(cfg, dqkv.p, scr.p, dout.p, out.p, qkv.p, lse.p, B, T, H, Hkv, D, W,
                                0, docs);
    });
    CUDA_OK(cudaDeviceSynchronize());
    std::printf(
        "BENCH B=%d H=%d Hkv=%d T=%d D=%d window=%d%s [%s]: fwd %.3f ms %.1f TFLOP/s | bwd %.3f ms "
        "%.1f TFLOP/s | fwd+bwd %.1f TFLOP/s\n",
        B, H, Hkv, T, D, W, c.docs.empty() ? "" : " documents", str(cfg).c_str(), tf, fwd_flop / tf * 1e-9, tb,
        bwd_flop / tb * 1e-9, (fwd_flop + bwd_flop) / (tf + tb) * 1e-9);
  }
  const std::vector<float> o = to_float(out.download()), g = to_float(dqkv.download());
  EXPECT_TRUE(all_finite(o));
  EXPECT_TRUE(all_finite(g));
}

// The default config, then each kernel's other tilings one at a time.
std::vector<Config> sweep_configs(int D) {
  namespace ad = cu::attn_detail;
  const Config d = ad::default_config(D);
  std::vector<Config> r = {d};
  for (const KernelCfg& k : ad::fwd_variants(D))
    if (str(k) != str(d.fwd)) r.push_back(Config{k, d.dkdv, d.dq});
  for (const KernelCfg& k : ad::dkdv_variants(D))
    if (str(k) != str(d.dkdv)) r.push_back(Config{d.fwd, k, d.dq});
  for (const KernelCfg& k : ad::dq_variants(D))
    if (str(k) != str(d.dq)) r.push_back(Config{d.fwd, d.dkdv, k});
  return r;
}

// cuDNN's fused attention on the same shapes, deterministic backward and atomic dQ.
void bench_cudnn(const Case& c) {
  const int B = c.B, T = c.T, H = c.H, D = c.D, W = c.window, Hkv = c.kv();
  std::string why;
  ASSERT_TRUE(cu::cudnn::supports(B, T, H, Hkv, D, W, &why, nullptr, !c.docs.empty())) << why;
  Dev<int32_t> d_docs(c.docs.size());
  d_docs.upload(c.docs);
  const int32_t* docs = c.docs.empty() ? nullptr : d_docs.p;
  const size_t nqkv = size_t(B) * T * c.qkv_per_token(), nout = size_t(B) * T * H * D;
  Dev<bf16> qkv(nqkv), out(nout), dout(nout), dqkv(nqkv);
  Dev<float> lse(size_t(B) * H * T);
  fill_random<<<1024, 256>>>(qkv.p, nqkv, 3u);
  fill_random<<<1024, 256>>>(dout.p, nout, 4u);
  const double fwd_flop = forward_flop(c), bwd_flop = 2.5 * fwd_flop;
  for (bool det : {true, false}) {
    cu::cudnn::set_deterministic(det);
    const float tf =
        median_ms([&] { cu::cudnn::attention_forward(out.p, lse.p, qkv.p, B, T, H, Hkv, D, W, 0, nullptr, docs); });
    const float tb = median_ms([&] {
      cu::cudnn::attention_backward(dqkv.p, dout.p, out.p, qkv.p, lse.p, B, T, H, Hkv, D, W, 0, nullptr, docs);
    });
    CUDA_OK(cudaDeviceSynchronize());
    std::printf("BENCH cuDNN %d B=%d H=%d Hkv=%d T=%d D=%d window=%d%s [%s]: fwd %.3f ms %.1f TFLOP/s | bwd %.3f ms "
                "%.1f TFLOP/s | fwd+bwd %.1f TFLOP/s\n",
                cu::cudnn::version(), B, H, Hkv, T, D, W, docs ? " documents" : "", det ? "deterministic" : "atomic dQ", tf,
                fwd_flop / tf * 1e-9, tb,
                bwd_flop / tb * 1e-9, (fwd_flop + bwd_flop) / (tf + tb) * 1e-9);
  }
  cu::cudnn::set_deterministic(true);
  EXPECT_TRUE(all_finite(to_float(out.download())));
  EXPECT_TRUE(all_finite(to_float(dqkv.download())));
}

TEST(AttentionBench, D128T2048Causal) { bench(Case{8, 2048, 16, 128, 0}, sweep_configs(128)); }
// Packed documents of 512 tokens on average: TFLOP/s over the pairs each query sees.
TEST(AttentionBench, D128T2048Documents) {
  bench(Case{8, 2048, 16, 128, 0, 0, random_docs(8, 2048, 512, 5)}, {cu::attn_detail::default_config(128)});
}
TEST(AttentionBench, CudnnD128T2048Causal) { bench_cudnn(Case{8, 2048, 16, 128, 0}); }
TEST(AttentionBench, CudnnD64T1024Causal) { bench_cudnn(Case{8, 1024, 16, 64, 0}); }
// Documents on cuDNN (its causal tiles skipped, the documents' masked): of 2,048 tokens (one a
// row: the work of full causal, the mask's cost alone) and of 512 on average; TFLOP/s over the
// pairs each query sees, so the second's is lower by the tiles cuDNN computes and masks.
TEST(AttentionBench, CudnnD128T2048Documents2048) {
  bench_cudnn(Case{8, 2048, 16, 128, 0, 0, std::vector<int32_t>(8 * 2048, 0)});
}
TEST(AttentionBench, CudnnD128T2048Documents512) { bench_cudnn(Case{8, 2048, 16, 128, 0, 0, random_docs(8, 2048, 512, 5)}); }
TEST(AttentionBench, CudnnD80T2048Causal) { bench_cudnn(Case{8, 2048, 16, 80, 0}); }
TEST(AttentionBench, CudnnD128T4096Window1024) { bench_cudnn(Case{8, 4096, 16, 128, 1024}); }
// Llama 3.2 1B's attention (32 query heads over 8 key/value heads, D 64) and 3B's (24 over 8, D 128).
TEST(AttentionBench, CudnnLlama1bGqa) { bench_cudnn(Case{8, 2048, 32, 64, 0, 8}); }
TEST(AttentionBench, CudnnLlama1bAsMha) { bench_cudnn(Case{8, 2048, 32, 64, 0}); }
TEST(AttentionBench, CudnnLlama3bGqa) { bench_cudnn(Case{4, 2048, 24, 128, 0, 8}); }
TEST(AttentionBench, Llama1bGqa) { bench(Case{8, 2048, 32, 64, 0, 8}, {cu::attn_detail::default_config(64)}); }
TEST(AttentionBench, D64T1024Causal) { bench(Case{8, 1024, 16, 64, 0}, sweep_configs(64)); }
TEST(AttentionBench, D80T2048Causal) { bench(Case{8, 2048, 16, 80, 0}, sweep_configs(80)); }
TEST(AttentionBench, D128T4096Window1024) {
  bench(Case{8, 4096, 16, 128, 1024}, {cu::attn_detail::default_config(128)});
}

}  // namespace
