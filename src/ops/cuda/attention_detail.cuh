// Internal to the attention kernels (attention.cu) and their test: the tile configurations the
// launchers can pick, so that the tests can run each and the benchmark can compare them.
// Callers use ops.cuh.
#pragma once

#include <vector>

#include "ops/cuda/ops.cuh"

namespace myriad::cuda::attn_detail {

// One kernel's tiling: `warps` warps per block, each owning 16*mt rows (queries for the forward
// and dQ kernels, keys for dK/dV), streaming the other side in tiles of `tile` rows.
struct KernelCfg {
  int warps, mt, tile;
};
struct Config {
  KernelCfg fwd, dkdv, dq;
};

// What attention_forward/backward use for head size D.
Config default_config(int D);
// The tilings compiled for head size D.
std::vector<KernelCfg> fwd_variants(int D);
std::vector<KernelCfg> dkdv_variants(int D);
std::vector<KernelCfg> dq_variants(int D);

void forward(const Config& cfg, bf16* out, float* lse, const bf16* qkv, int B, int T, int H,
             int Hkv, int D, int window, cudaStream_t stream, const int32_t* docs = nullptr,
             QueryRows rows = {});
void backward(const Config& cfg, bf16* dqkv, float* scratch, const bf16* dout, const bf16* out,
              const bf16* qkv, const float* lse, int B, int T, int H, int Hkv, int D, int window,
              cudaStream_t stream, const int32_t* docs = nullptr, QueryRows rows = {});

}  // namespace myriad::cuda::attn_detail
