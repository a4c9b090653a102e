// Embedding forward/backward against the CPU oracle. The backward gets the positions grouped by
// token as the host builds them; the tokens are skewed (token 7 fills about 60% of the batch,
// token 3 15%) so that groups take both the one-warp path and the sliced path (> 64 positions). Outputs poisoned / gradients pre-filled; two runs bitwise.
//
// Tolerances: the forward is one fp32 add and one rounding: bit for bit. dwte/dwpe are fp32
// sums of the same bf16 values as the oracle's in another order: 1e-5; rows of dwte that no
// token touches must keep their bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/ops.cuh"

namespace {

using namespace gpu_test;
namespace cu = myriad::cuda;

struct Case {
  int B, T, C;
};

class Embedding : public ::testing::TestWithParam<Case> {};

TEST_P(Embedding, ForwardBackward) {
  const auto [B, T, C] = GetParam();
  const int V = 300, Vp = 384, P = T + 5;
  std::mt19937_64 gen(seed() + B * T + C);
  std::vector<int32_t> tokens(size_t(B) * T);
  for (auto& t : tokens) {
    const int r = static_cast<int>(gen() % 20);
    t = r < 12 ? 7 : r < 15 ? 3 : static_cast<int32_t>(gen() % V);
  }
  const auto wte = round_bf16(randn(size_t(Vp) * C, gen, 1.0f));
  const auto wpe = round_bf16(randn(size_t(P) * C, gen, 1.0f));
  const auto dout = round_bf16(randn(size_t(B) * T * C, gen, 1.0f));
  const auto dwte0 = randn(size_t(Vp) * C, gen, 1.0f), dwpe0 = randn(size_t(P) * C, gen, 1.0f);

  std::vector<float> rout(size_t(B) * T * C), rdwte = dwte0, rdwpe = dwpe0;
  myriad::cpu::embedding_forward<float>(rout.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  myriad::cpu::embedding_backward<float>(rdwte.data(), rdwpe.data(), dout.data(), tokens.data(), B, T, C);

  // Groups: positions by token, ascending within a token.
  std::map<int32_t, std::vector<int32_t>> by_token;
  for (int i = 0; i < B * T; ++i) by_token[tokens[i]].push_back(i);
  std::vector<int32_t> positions, starts{0}, ids;
  for (auto& [tok, pos] : by_token) {
    positions.insert(positions.end(), pos.begin(), pos.end());
    starts.push_back(static_cast<int32_t>(positions.size()));
    ids.push_back(tok);
  }
  const int groups = static_cast<int>(ids.size());

  Dev<int32_t> dtok(tokens.size()), dpos(positions.size()), dstarts(starts.size()), dids(ids.size());
  dtok.upload(tokens), dpos.upload(positions), dstarts.upload(starts), dids.upload(ids);
  Dev<bf16> dwte(wte.size()), dwpe(wpe.size()), dout_d(dout.size()), out(rout.size());
  dwte.upload(to_bf16(wte)), dwpe.upload(to_bf16(wpe)), dout_d.upload(to_bf16(dout));
  Dev<float> gwte(dwte0.size()), gwpe(dwpe0.size());

  out.poison();
  cu::embedding_forward(out.p, dtok.p, dwte.p, dwpe.p, B, T, C, 0);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(to_float(out.download()), round_bf16(rout));

  std::vector<float> first_wte, first_wpe;
  for (int run = 0; run < 2; ++run) {
    gwte.upload(dwte0), gwpe.upload(dwpe0);
    cu::embedding_backward(gwte.p, gwpe.p, dout_d.p, dpos.p, dstarts.p, dids.p, groups, B, T, C, 0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto a = gwte.download(), b = gwpe.download();
    if (run == 0) {
      const double ea = rel_err(a, rdwte), eb = rel_err(b, rdwpe);
      std::printf("  embedding B=%d T=%d C=%d groups=%d (longest %zu): dwte %.2e dwpe %.2e\n", B, T,
                  C, groups, by_token[7].size(), ea, eb);
      EXPECT_LT(ea, 1e-5);
      EXPECT_LT(eb, 1e-5);
      int64_t untouched_bad = 0;
      for (int v = 0; v < Vp; ++v)
        if (!by_token.count(v))
          for (int c = 0; c < C; ++c) untouched_bad += a[size_t(v) * C + c] != dwte0[size_t(v) * C + c];
      EXPECT_EQ(untouched_bad, 0);
      first_wte = a, first_wpe = b;
    } else {
      EXPECT_EQ(a, first_wte);
      EXPECT_EQ(b, first_wpe);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Embedding,
                         ::testing::Values(Case{4, 83, 768}, Case{3, 111, 136}, Case{2, 64, 2048},
                                           Case{4, 83, 100}, Case{1, 1, 8}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "B" + std::to_string(i.param.B) + "_T" + std::to_string(i.param.T) +
                                  "_C" + std::to_string(i.param.C);
                         });

}  // namespace
