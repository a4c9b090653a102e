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

// Each kernel below handles one rank's rows (B,T) of the whole sequence's (B,Tw): row i of batch
// row b sits at position pos(i) (the rank's core/parallel_layout.cc context_rows, which CudaOps
// turns into a RowPositions), the chunk assignment spelled once, there.

__global__ void pack_kv_kernel(bf16* __restrict__ pack, const bf16* __restrict__ qkv, int64_t n, int Hkv, int G,
                               int D) {
  const int64_t KV = int64_t(Hkv) * 2 * D, Ql = int64_t(Hkv) * (G + 2) * D;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / KV, r = idx % KV, g = r / (2 * D), e = r % (2 * D);
    pack[idx] = qkv[row * Ql + (g * (G + 2) + G) * D + e];
  }
}

// One thread per element of the rank's (B,T,Ql) rows of whole: from local's whole rows (the
// rank's own) or from a pack's key/value pairs (another rank's; the queries' columns untouched).
__global__ void place_rows_kernel(bf16* __restrict__ whole, const bf16* __restrict__ local,
                                  const bf16* __restrict__ pack, int64_t n, int T, int64_t Tw, RowPositions pos,
                                  int Hkv, int G, int D) {
  const int64_t Ql = int64_t(Hkv) * (G + 2) * D;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / Ql, e = idx % Ql, b = row / T, i = row % T;
    bf16* to = whole + (b * Tw + pos(i)) * Ql + e;
    if (local) {
      *to = local[idx];
    } else {
      const int64_t g = e / ((G + 2) * D), j = e % ((G + 2) * D) - int64_t(G) * D;
      if (j >= 0) *to = pack[(row * Hkv + g) * 2 * D + j];
    }
  }
}

// One thread per element of the rank's pack (B,T,Hkv,2,D), widened to fp32.
__global__ void take_kv_grad_kernel(float* __restrict__ pack, const bf16* __restrict__ dwhole, int64_t n, int T,
                                    int64_t Tw, RowPositions pos, int Hkv, int G, int D) {
  const int64_t KV = int64_t(Hkv) * 2 * D, Ql = int64_t(Hkv) * (G + 2) * D;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / KV, k = idx % KV, g = k / (2 * D), e = k % (2 * D), b = row / T, i = row % T;
    pack[idx] = __bfloat162float(dwhole[(b * Tw + pos(i)) * Ql + (g * (G + 2) + G) * D + e]);
  }
}

// One thread per element of dlocal (B,T,Ql): the queries' gradient from the rank's rows of
// dwhole, the keys' and values' from the reduce-scatter's sum.
__global__ void unpack_kv_grad_kernel(bf16* __restrict__ dlocal, const float* __restrict__ mine,
                                      const bf16* __restrict__ dwhole, int64_t n, int T, int64_t Tw,
                                      RowPositions pos, int Hkv, int G, int D) {
  const int64_t Ql = int64_t(Hkv) * (G + 2) * D;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / Ql, e = idx % Ql, b = row / T, i = row % T;
    const int64_t g = e / ((G + 2) * D), j = e % ((G + 2) * D) - int64_t(G) * D;
    dlocal[idx] = j >= 0 ? __float2bfloat16(mine[(row * Hkv + g) * 2 * D + j]) : dwhole[(b * Tw + pos(i)) * Ql + e];
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

void cp_place_rows(bf16* whole, const bf16* local, const bf16* pack, int B, int T, int64_t Tw, RowPositions pos,
                   int Hkv, int G, int D, cudaStream_t stream) {
  MYRIAD_CHECK((local == nullptr) != (pack == nullptr), "cp_place_rows: one of local and pack");
  const int64_t n = int64_t(B) * T * Hkv * (G + 2) * D;
  if (n <= 0) return;
  place_rows_kernel<<<grid(n), kThreads, 0, stream>>>(whole, local, pack, n, T, Tw, pos, Hkv, G, D);
  check_launch("cp_place_rows");
}

void cp_take_kv_grad(float* pack, const bf16* dwhole, int B, int T, int64_t Tw, RowPositions pos, int Hkv, int G,
                     int D, cudaStream_t stream) {
  const int64_t n = int64_t(B) * T * Hkv * 2 * D;
  if (n <= 0) return;
  take_kv_grad_kernel<<<grid(n), kThreads, 0, stream>>>(pack, dwhole, n, T, Tw, pos, Hkv, G, D);
  check_launch("cp_take_kv_grad");
}

void cp_unpack_kv_grad(bf16* dlocal, const float* mine, const bf16* dwhole, int B, int T, int64_t Tw,
                       RowPositions pos, int Hkv, int G, int D, cudaStream_t stream) {
  const int64_t n = int64_t(B) * T * Hkv * (G + 2) * D;
  if (n <= 0) return;
  unpack_kv_grad_kernel<<<grid(n), kThreads, 0, stream>>>(dlocal, mine, dwhole, n, T, Tw, pos, Hkv, G, D);
  check_launch("cp_unpack_kv_grad");
}

}  // namespace myriad::cuda
