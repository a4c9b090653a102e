// cuBLASLt GEMMs of the linear layers against a float64 CPU product, and their determinism.
#include "model/cuda/matmul.h"

#include <gtest/gtest.h>

#include "gpu_test_util.h"

using namespace gpu_test;

namespace {

void reference(std::vector<double>& out, const std::vector<float>& a, const std::vector<float>& b,
               int M, int K, int N, bool bt) {  // out (M,N) = a (M,K) . (bt ? b (N,K)^T : b (K,N))
  out.assign(size_t(M) * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k)
      for (int j = 0; j < N; ++j) out[size_t(i) * N + j] += double(a[size_t(i) * K + k]) * (bt ? b[size_t(j) * K + k] : b[size_t(k) * N + j]);
}

TEST(Matmul, ForwardBackwardMatchFloat64AndRepeatBitwise) {
  std::mt19937_64 gen(seed());
  const int N = 200, IC = 96, OC = 136;
  std::vector<float> x = round_bf16(randn(N * IC, gen)), w = round_bf16(randn(OC * IC, gen, 0.1f)),
                     bias = round_bf16(randn(OC, gen)), dy = round_bf16(randn(N * OC, gen));
  Dev<bf16> dx(N * IC), dw(OC * IC), db(OC), ddy(N * OC), out(N * OC), dinp(N * IC);
  Dev<float> dwt(OC * IC);
  dx.upload(to_bf16(x)), dw.upload(to_bf16(w)), db.upload(to_bf16(bias)), ddy.upload(to_bf16(dy));
  myriad::cuda::Matmul mm;
  out.poison(), dinp.poison();
  std::vector<float> g0 = randn(OC * IC, gen);
  dwt.upload(g0);
  mm.forward(out.p, dx.p, dw.p, db.p, N, IC, OC, nullptr);
  mm.backward_input(dinp.p, ddy.p, dw.p, N, IC, OC, false, nullptr);
  mm.backward_weight(dwt.p, ddy.p, dx.p, N, IC, OC, nullptr);
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<double> ref;
  reference(ref, x, w, N, IC, OC, true);
  std::vector<float> r(ref.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = float(ref[i] + bias[i % OC]);
  EXPECT_LT(rel_err(to_float(out.download()), r), 1e-2);
  reference(ref, dy, w, N, OC, IC, false);
  r.assign(ref.begin(), ref.end());
  EXPECT_LT(rel_err(to_float(dinp.download()), r), 1e-2);
  // dW (OC,IC) += dy^T x
  std::vector<float> dyt(size_t(OC) * N);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < OC; ++j) dyt[size_t(j) * N + i] = dy[size_t(i) * OC + j];
  reference(ref, dyt, x, OC, N, IC, false);
  for (size_t i = 0; i < r.size(); ++i) r[i] = float(ref[i] + g0[i]);
  std::vector<float> got = dwt.download();
  EXPECT_LT(rel_err(got, r), 1e-4);

  // Bitwise repeatable, as the resume and determinism guarantees need.
  dwt.upload(g0);
  mm.backward_weight(dwt.p, ddy.p, dx.p, N, IC, OC, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(dwt.download() == got);
}

}  // namespace

#include "ops/cpu/ops.h"

namespace {

TEST(Matmul, GeluEpiloguesMatchTheCpuGelu) {
  std::mt19937_64 gen(gpu_test::seed() + 1);
  const int N = 128, IC = 64, OC = 256;
  std::vector<float> x = round_bf16(randn(N * IC, gen)), w = round_bf16(randn(OC * IC, gen, 0.2f)),
                     bias = round_bf16(randn(OC, gen));
  Dev<bf16> dx(N * IC), dw(OC * IC), db(OC), out(N * OC), pre(N * OC);
  dx.upload(to_bf16(x)), dw.upload(to_bf16(w)), db.upload(to_bf16(bias));
  out.poison(), pre.poison();
  myriad::cuda::Matmul mm;
  mm.forward_gelu(out.p, pre.p, dx.p, dw.p, db.p, N, IC, OC, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> p = to_float(pre.download()), ref_out(N * OC);
  myriad::cpu::gelu_forward(ref_out.data(), p.data(), int64_t(N) * OC);
  EXPECT_LT(rel_err(to_float(out.download()), ref_out), 1e-2);
  std::vector<double> ref;
  reference(ref, x, w, N, IC, OC, true);
  std::vector<float> r(ref.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = float(ref[i] + bias[i % OC]);
  EXPECT_LT(rel_err(p, r), 1e-2);

  // Backward through the second MLP GEMM (here: W2 (IC2=OC, OC2=IC)) with gelu' fused.
  std::vector<float> dy = round_bf16(randn(N * IC, gen)), w2 = round_bf16(randn(IC * OC, gen, 0.2f));
  Dev<bf16> ddy(N * IC), dw2(IC * OC), dpre(N * OC);
  ddy.upload(to_bf16(dy)), dw2.upload(to_bf16(w2));
  dpre.poison();
  mm.backward_input_dgelu(dpre.p, ddy.p, dw2.p, pre.p, N, OC, IC, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  reference(ref, dy, w2, N, IC, OC, false);  // dgelu (N,OC) = dy (N,IC) . W2 (IC,OC)
  std::vector<float> dg(ref.begin(), ref.end()), want(N * OC, 0.0f);
  myriad::cpu::gelu_backward(want.data(), p.data(), dg.data(), int64_t(N) * OC);
  EXPECT_LT(rel_err(to_float(dpre.download()), want), 2e-2);
}

}  // namespace

#include "model/cuda/device.h"

namespace {

// The node self-check's GPU part (myriad self-check): the exact GEMM and the memory round trip
// pass on a sound GPU, and the GEMM runs at GPU speed (a node whose GPU fell back to something
// slower would not pass unnoticed in the report).
TEST(SelfCheck, TheGpuComputesExactlyAndAtSpeed) {
  const double tflops = myriad::cuda_self_check(0);
  std::printf("  self-check GEMM 2048^3 (fp32 out): %.0f TFLOP/s\n", tflops);
  EXPECT_GT(tflops, 20.0);
}

}  // namespace
