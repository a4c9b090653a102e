// Context parallelism's key/value exchange on the device: the packing around GptModel's
// all-gather of the keys and values and the reduce-scatter of their gradients over the cp group
// (the contracts and the CPU loops, their oracle, are CpuOps's: ops/cpu/cpu_ops.h). Pure copies
// (the gradients widened to fp32 for the reduce-scatter, narrowed after), one thread per element:
// the exchange moves 2 Hkv D elements per token, a few hundred microseconds a layer at 32K tokens
// against milliseconds of attention.
#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

// Rank q's row i (of T = 2 Tc) sits at position q Tc + i in its first chunk, (2 cp - 1 - q) Tc +
// i - Tc in its second (core/parallel_layout.cc's context_rows).
__device__ __forceinline__ int64_t position(int64_t i, int64_t T, int cp, int q) {
  const int64_t Tc = T / 2;
  return i < Tc ? q * Tc + i : (2 * cp - 1 - q) * Tc + (i - Tc);
}
// The inverse: which rank holds position p, and its row there.
__device__ __forceinline__ void owner(int64_t p, int64_t T, int cp, int* q, int64_t* i) {
  const int64_t Tc = T / 2, c = p / Tc;
  *q = c < cp ? int(c) : int(2 * cp - 1 - c);
  *i = (c < cp ? 0 : Tc) + p % Tc;
}

__global__ void pack_kv_kernel(bf16* __restrict__ pack, const bf16* __restrict__ qkv, int64_t n, int Hkv, int G,
                               int D) {
  const int64_t KV = int64_t(Hkv) * 2 * D, Ql = int64_t(Hkv) * (G + 2) * D;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / KV, r = idx % KV, g = r / (2 * D), e = r % (2 * D);
    pack[idx] = qkv[row * Ql + (g * (G + 2) + G) * D + e];
  }
}

// One thread per element of whole (B,Tw,Ql).
__global__ void unpack_kv_kernel(bf16* __restrict__ whole, const bf16* __restrict__ packs,
                                 const bf16* __restrict__ local, int64_t n, int T, int cp, int rank, int Hkv, int G,
                                 int D) {
  const int64_t Ql = int64_t(Hkv) * (G + 2) * D, Tw = int64_t(T) * cp, block = int64_t(n / cp / Ql) * Hkv * 2 * D;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bp = idx / Ql, e = idx % Ql, b = bp / Tw, p = bp % Tw;
    int q;
    int64_t i;
    owner(p, T, cp, &q, &i);
    const int64_t row = b * T + i;
    if (q == rank) {
      whole[idx] = local[row * Ql + e];
    } else {
      const int64_t g = e / ((G + 2) * D), j = e % ((G + 2) * D) - int64_t(G) * D;
      if (j >= 0) whole[idx] = packs[q * block + (row * Hkv + g) * 2 * D + j];
    }
  }
}

// One thread per element of packs (cp,B,T,Hkv,2,D).
__global__ void pack_kv_grad_kernel(float* __restrict__ packs, const bf16* __restrict__ dwhole, int64_t n, int T,
                                    int cp, int Hkv, int G, int D) {
  const int64_t KV = int64_t(Hkv) * 2 * D, Ql = int64_t(Hkv) * (G + 2) * D, Tw = int64_t(T) * cp;
  const int64_t block = n / cp;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int q = int(idx / block);
    const int64_t r = idx % block, row = r / KV, k = r % KV, g = k / (2 * D), e = k % (2 * D);
    const int64_t b = row / T, i = row % T;
    packs[idx] = __bfloat162float(dwhole[(b * Tw + position(i, T, cp, q)) * Ql + (g * (G + 2) + G) * D + e]);
  }
}

// One thread per element of dlocal (B,T,Ql).
__global__ void unpack_kv_grad_kernel(bf16* __restrict__ dlocal, const float* __restrict__ mine,
                                      const bf16* __restrict__ dwhole, int64_t n, int T, int cp, int rank, int Hkv,
                                      int G, int D) {
  const int64_t Ql = int64_t(Hkv) * (G + 2) * D, Tw = int64_t(T) * cp;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / Ql, e = idx % Ql, b = row / T, i = row % T;
    const int64_t g = e / ((G + 2) * D), j = e % ((G + 2) * D) - int64_t(G) * D;
    dlocal[idx] = j >= 0 ? __float2bfloat16(mine[(row * Hkv + g) * 2 * D + j])
                         : dwhole[(b * Tw + position(i, T, cp, rank)) * Ql + e];
  }
}

int grid(int64_t n) { return int(std::min<int64_t>(ceil_div(n, kThreads), 132 * 32)); }

}  // namespace

void cp_pack_kv(bf16* pack, const bf16* qkv, int64_t N, int Hkv, int G, int D, cudaStream_t stream) {
  const int64_t n = N * Hkv * 2 * D;
  if (n <= 0) return;
  pack_kv_kernel<<<grid(n), kThreads, 0, stream>>>(pack, qkv, n, Hkv, G, D);
  check_launch("cp_pack_kv");
}

void cp_unpack_kv(bf16* whole, const bf16* packs, const bf16* local, int B, int T, int cp, int rank, int Hkv, int G,
                  int D, cudaStream_t stream) {
  MYRIAD_CHECK(T % 2 == 0 && rank >= 0 && rank < cp, "cp_unpack_kv: T ", T, " rank ", rank, " of ", cp);
  const int64_t n = int64_t(B) * T * cp * Hkv * (G + 2) * D;
  if (n <= 0) return;
  unpack_kv_kernel<<<grid(n), kThreads, 0, stream>>>(whole, packs, local, n, T, cp, rank, Hkv, G, D);
  check_launch("cp_unpack_kv");
}

void cp_pack_kv_grad(float* packs, const bf16* dwhole, int B, int T, int cp, int Hkv, int G, int D,
                     cudaStream_t stream) {
  MYRIAD_CHECK(T % 2 == 0, "cp_pack_kv_grad: T ", T);
  const int64_t n = int64_t(cp) * B * T * Hkv * 2 * D;
  if (n <= 0) return;
  pack_kv_grad_kernel<<<grid(n), kThreads, 0, stream>>>(packs, dwhole, n, T, cp, Hkv, G, D);
  check_launch("cp_pack_kv_grad");
}

void cp_unpack_kv_grad(bf16* dlocal, const float* mine, const bf16* dwhole, int B, int T, int cp, int rank, int Hkv,
                       int G, int D, cudaStream_t stream) {
  MYRIAD_CHECK(T % 2 == 0 && rank >= 0 && rank < cp, "cp_unpack_kv_grad: T ", T, " rank ", rank, " of ", cp);
  const int64_t n = int64_t(B) * T * Hkv * (G + 2) * D;
  if (n <= 0) return;
  unpack_kv_grad_kernel<<<grid(n), kThreads, 0, stream>>>(dlocal, mine, dwhole, n, T, cp, rank, Hkv, G, D);
  check_launch("cp_unpack_kv_grad");
}

}  // namespace myriad::cuda
