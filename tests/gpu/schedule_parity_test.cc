// The one layer schedule on the CUDA op set against the same schedule on the CPU op set (the
// oracle): GptModel<CudaOps> and Gpt from the same (bf16-representable) weights, the same tokens,
// compared loss for loss and gradient for gradient; and chunk by chunk, as a pipeline runs it,
// against the whole model in one pass, bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <cstdio>
#include <random>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "model/cuda/cuda_ops.h"
#include "gpu_test_util.h"
#include "model/gpt.h"
#include "ops/cpu/cpu_ops.h"

using namespace myriad;
using gpu_test::bf16;
using GpuGpt = GptModel<cuda::CudaOps>;

namespace {

Config config(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.layers=2", "model.d_model=256", "model.heads=4", "model.seq_len=96",
                                   "model.vocab_size=300", "train.micro_batch=2", "train.global_batch=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_config("", "schedule parity", sets);
}

// The op set's stream is non-blocking: wait for its work before reading device memory.
std::vector<float> grads_of(GpuGpt& g) {
  cudaDeviceSynchronize();
  std::vector<float> h(g.num_params());
  cudaMemcpy(h.data(), g.grads(), h.size() * 4, cudaMemcpyDeviceToHost);
  return h;
}

double rel(const float* a, const float* b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), r += double(b[i]) * b[i];
  return std::sqrt(d / std::max(r, 1e-30));
}

struct Variant {
  const char* name;
  std::vector<std::string> sets;
};

class ScheduleParity : public ::testing::TestWithParam<Variant> {};

TEST_P(ScheduleParity, CudaOpSetMatchesTheCpuOpSet) {
  const Config cfg = config(GetParam().sets);
  GpuGpt gpu(cfg);
  Gpt cpu(cfg);
  const int64_t P = cpu.num_params();
  ASSERT_EQ(gpu.num_params(), P);
  // The CPU model takes the GPU's bf16 weights, widened: both start from the same values.
  std::vector<__nv_bfloat16> wb(P);
  cudaMemcpy(wb.data(), gpu.params(), P * 2, cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < P; ++i) cpu.params()[i] = __bfloat162float(wb[i]);

  std::mt19937_64 gen(GetParam().sets.size() * 31 + 7);
  const int B = 2, T = static_cast<int>(cfg.model.seq_len);
  std::vector<int32_t> tokens(B * (T + 1));
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % cfg.model.vocab_size);

  cpu.zero_grads();
  gpu.zero_grads();
  const float lc = cpu.forward_backward(tokens.data(), B, 0.5f);
  const float lg = gpu.forward_backward(tokens.data(), B, 0.5f);
  EXPECT_TRUE(std::isfinite(lg));
  EXPECT_NEAR(lg, lc, 0.01 * lc);
  const std::vector<float> gg = grads_of(gpu);
  EXPECT_LT(rel(gg.data(), cpu.grads(), P), 0.05) << "all gradients";
  for (const ParamSpec& p : cpu.layout().tensors())
    EXPECT_LT(rel(gg.data() + p.offset, cpu.grads() + p.offset, p.numel), 0.15) << p.name;
  EXPECT_NEAR(gpu.loss(tokens.data(), B), cpu.loss(tokens.data(), B), 0.01 * lc);

  // Two chunks, run as a pipeline runs them (forward 0, forward 1, backward 1, backward 0),
  // the boundary activation and its gradient in device memory: bitwise the one-pass result.
  ModelPart two{{{0, 1}, {1, 2}}, true, true};
  GpuGpt chunked(cfg, nullptr, &two);
  cudaMemcpy(chunked.params(), gpu.params(), P * 2, cudaMemcpyDeviceToDevice);
  chunked.zero_grads();
  gpu.zero_grads();
  const float whole = gpu.forward_backward(tokens.data(), B, 0.5f);
  chunked.forward_chunk(0, 7, B, tokens.data(), nullptr, 0.5f);
  chunked.forward_chunk(1, 7, B, tokens.data(), chunked.chunk_output(0, 7), 0.5f);
  const float last = static_cast<float>(chunked.take_loss());
  GpuGpt::Buffer<cuda::CudaOps::Act> dboundary;
  dboundary.zeros(chunked.boundary_elems(B));
  chunked.backward_chunk(1, 7, nullptr, dboundary.data(), 0.5f);
  chunked.backward_chunk(0, 7, dboundary.data(), nullptr, 0.5f);
  EXPECT_EQ(last, whole);
  EXPECT_EQ(grads_of(chunked), grads_of(gpu));
}

INSTANTIATE_TEST_SUITE_P(Blocks, ScheduleParity,
                         ::testing::Values(Variant{"sequential", {}},
                                           Variant{"parallel_window", {"model.parallel_block=true", "model.window=40"}},
                                           Variant{"nobias_d128", {"model.bias=false", "model.heads=2"}}),
                         [](const auto& info) { return std::string(info.param.name); });

// Two micro-batches accumulated (the second reuses every buffer of the first), one of them a
// run of one repeated token (a spike-like batch: peaked attention, large gradients), with
// weights drawn at init_std 0.02 and 0.1.
TEST(ScheduleParityAccumulate, TwoMicroBatchesOneRepeated) {
  for (const char* std_ : {"model.init_std=0.02", "model.init_std=0.1"}) {
    const Config cfg = config({std_});
    GpuGpt gpu(cfg);
    Gpt cpu(cfg);
    const int64_t P = cpu.num_params();
    std::vector<__nv_bfloat16> wb(P);
    cudaMemcpy(wb.data(), gpu.params(), P * 2, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < P; ++i) cpu.params()[i] = __bfloat162float(wb[i]);
    const int B = 2, T = static_cast<int>(cfg.model.seq_len);
    std::mt19937_64 gen(11);
    std::vector<int32_t> a(B * (T + 1)), r(B * (T + 1), 45);
    for (auto& t : a) t = static_cast<int32_t>(gen() % cfg.model.vocab_size);
    for (int i = 0; i < T + 1; i += 7) r[i] = 124;  // "|----|" rows
    cpu.zero_grads(), gpu.zero_grads();
    for (const auto* toks : {&a, &r}) {
      const float lc = cpu.forward_backward(toks->data(), B, 0.5f);
      const float lg = gpu.forward_backward(toks->data(), B, 0.5f);
      EXPECT_NEAR(lg, lc, 0.01 * lc) << std_ << (toks == &a ? " random" : " repeated");
    }
    const std::vector<float> gg = grads_of(gpu);
    const double all = rel(gg.data(), cpu.grads(), P);
    EXPECT_LT(all, 0.05) << std_;
    std::string worst;
    for (const ParamSpec& p : cpu.layout().tensors()) {
      const double e = rel(gg.data() + p.offset, cpu.grads() + p.offset, p.numel);
      if (e > 0.05) worst += cat(" ", p.name, "=", e);
    }
    std::printf("  %s: gradients within %.4f overall;%s\n", std_, all, worst.empty() ? " every tensor within 5%" : worst.c_str());
  }
}

// The tensor-parallel row ops of the CUDA op set against the CPU op set's, on the same
// (bf16-representable) inputs: this rank holding vocabulary rows [v0, v0 + Vl), the last block
// partly padding; positions from an offset that is not a multiple of T (sequence parallelism).
TEST(TensorParallelRowOps, MatchTheCpuOpSet) {
  using gpu_test::Dev;
  using gpu_test::round_bf16;
  using gpu_test::to_bf16;
  using gpu_test::to_float;
  std::mt19937_64 gen(gpu_test::seed());
  const int N = 96, C = 64, T = 40, r0 = 13, V = 300, v0 = 256, Vl = 64, live = V - v0;
  cpu::CpuOps c;
  cuda::CudaOps g;
  auto dev = [](const std::vector<float>& h) {
    auto d = std::make_unique<Dev<bf16>>(h.size());
    d->upload(to_bf16(h));
    return d;
  };
  auto f32 = [](const std::vector<float>& h) {
    auto d = std::make_unique<Dev<float>>(h.size());
    d->upload(h);
    return d;
  };
  std::vector<int32_t> tokens(N);
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % V);
  tokens[3] = tokens[7] = tokens[50] = v0 + 5;  // a repeated held token
  Dev<int32_t> dtok(N);
  dtok.upload(tokens);
  auto sync = [&] { cudaStreamSynchronize(g.stream()); };
  auto back = [&](const Dev<bf16>& d) { sync(); return to_float(d.download()); };
  auto backf = [&](const Dev<float>& d) { sync(); return d.download(); };

  // add_bias, add_positions
  auto out = round_bf16(gpu_test::randn(N * C, gen)), bias = round_bf16(gpu_test::randn(C, gen)),
       wpe = round_bf16(gpu_test::randn(T * C, gen));
  auto dout = dev(out), dbias = dev(bias), dwpe_p = dev(wpe);
  c.add_bias(out.data(), bias.data(), N, C), g.add_bias(dout->p, dbias->p, N, C);
  EXPECT_LT(gpu_test::rel_err(back(*dout), out), 1e-2) << "add_bias";
  c.add_positions(out.data(), wpe.data(), r0, N, T, C), g.add_positions(dout->p, dwpe_p->p, r0, N, T, C);
  EXPECT_LT(gpu_test::rel_err(back(*dout), out), 1e-2) << "add_positions";
  // vocab_rows_forward / backward, positions_backward
  auto wte = round_bf16(gpu_test::randn(Vl * C, gen));
  auto dwte_p = dev(wte);
  std::vector<float> rows(N * C);
  Dev<bf16> drows(N * C);
  drows.poison();
  c.vocab_rows_forward(rows.data(), tokens.data(), wte.data(), v0, Vl, N, C);
  g.vocab_rows_forward(drows.p, dtok.p, dwte_p->p, v0, Vl, N, C);
  EXPECT_EQ(gpu_test::rel_err(back(drows), rows), 0.0) << "vocab_rows_forward";
  auto grad = round_bf16(gpu_test::randn(N * C, gen));
  auto dgrad = dev(grad);
  std::vector<float> dwte = gpu_test::randn(Vl * C, gen), dpos = gpu_test::randn(T * C, gen);
  auto ddwte = f32(dwte), ddpos = f32(dpos);
  cpu::CpuOps::Tokens ctok;
  ctok.zeros(N);
  c.load_tokens(ctok, tokens.data(), 1, N, N, v0, Vl);
  cuda::CudaOps::Tokens gtok;
  gtok.zeros(N);
  g.load_tokens(gtok, tokens.data(), 1, N, N, v0, Vl);
  c.vocab_rows_backward(dwte.data(), grad.data(), ctok, v0, Vl, N, C);
  g.vocab_rows_backward(ddwte->p, dgrad->p, gtok, v0, Vl, N, C);
  EXPECT_LT(gpu_test::rel_err(backf(*ddwte), dwte), 1e-6) << "vocab_rows_backward";
  c.positions_backward(dpos.data(), grad.data(), r0, N, T, C);
  g.positions_backward(ddpos->p, dgrad->p, r0, N, T, C);
  EXPECT_LT(gpu_test::rel_err(backf(*ddpos), dpos), 1e-6) << "positions_backward";
  // The cross-entropy's pieces over this rank's columns (the sums as the ranks' all-reduce
  // would leave them: here one rank's).
  std::vector<int32_t> targets(N);
  for (auto& t : targets) t = static_cast<int32_t>(v0 + gen() % (V - v0 + 40)) - 20;
  targets[0] = targets[3] = -1;  // left out of the loss (data.document_end_loss)
  Dev<int32_t> dtgt(N);
  dtgt.upload(targets);
  auto logits = round_bf16(gpu_test::randn(N * Vl, gen, 2.0f));
  auto dlog = dev(logits);
  std::vector<float> mx(N), parts(2 * N), losses(N), sums(N);
  Dev<float> dmx(N), dparts(2 * N), dlosses(N), dsums(N);
  c.ce_row_max(mx.data(), logits.data(), N, Vl, live), g.ce_row_max(dmx.p, dlog->p, N, Vl, live);
  EXPECT_EQ(gpu_test::rel_err(backf(dmx), mx), 0.0) << "ce_row_max";
  c.ce_partials(parts.data(), logits.data(), mx.data(), targets.data(), v0, N, Vl, live);
  g.ce_partials(dparts.p, dlog->p, dmx.p, dtgt.p, v0, N, Vl, live);
  EXPECT_LT(gpu_test::rel_err(backf(dparts), parts), 1e-4) << "ce_partials";
  c.ce_losses(losses.data(), sums.data(), parts.data(), targets.data(), N);
  g.ce_losses(dlosses.p, dsums.p, dparts.p, dtgt.p, N);
  EXPECT_EQ(losses[0], 0.0f);
  EXPECT_LT(gpu_test::rel_err(backf(dlosses), losses), 1e-4) << "ce_losses";
  c.ce_tp_backward(logits.data(), mx.data(), sums.data(), 0.01f, targets.data(), v0, N, Vl, live);
  g.ce_tp_backward(dlog->p, dmx.p, dsums.p, 0.01f, dtgt.p, v0, N, Vl, live);
  EXPECT_LT(gpu_test::rel_err(back(*dlog), logits), 1e-2) << "ce_tp_backward";
}

}  // namespace
