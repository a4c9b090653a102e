// Token + position embedding, forward and backward (deterministic without atomics: dwte rows
// are owned by the groups of positions the host built, dwpe rows by the threads of one kernel).
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

// One thread per VW columns of one token, grid-stride.
template <int VW>
__global__ void embedding_forward_kernel(bf16* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const bf16* __restrict__ wte, const bf16* __restrict__ wpe,
                                         int64_t rows, int T, int C, RowPositions pos) {
  const int nvec = C / VW;
  const int64_t n = rows * nvec;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / nvec;
    const int c = static_cast<int>(idx - row * nvec) * VW;
    const int64_t p = pos(row % T);
    float a[VW], b[VW];
    load_bf16<VW>(a, wte + static_cast<int64_t>(tokens[row]) * C + c);
    load_bf16<VW>(b, wpe + p * C + c);
#pragma unroll
    for (int e = 0; e < VW; ++e) a[e] += b[e];
    store_bf16<VW>(out + row * C + c, a);
  }
}

// dwpe[pos(t), c..c+VW) += sum over b in order; one thread per (t, vector).
template <int VW>
__global__ void embedding_dwpe_kernel(float* __restrict__ dwpe, const bf16* __restrict__ dout,
                                      int B, int T, int C, RowPositions pos) {
  const int nvec = C / VW;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= int64_t(T) * nvec) return;
  const int t = static_cast<int>(idx / nvec);
  const int c = static_cast<int>(idx % nvec) * VW;
  float* to = dwpe + pos(t) * C + c;
  float acc[VW];
  load_f32<VW>(acc, to);
  int b = 0;
  // Four rows in flight, added in order.
  for (; b + 4 <= B; b += 4) {
    float f[4][VW];
#pragma unroll
    for (int u = 0; u < 4; ++u) load_bf16<VW>(f[u], dout + (static_cast<int64_t>(b + u) * T + t) * C + c);
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int e = 0; e < VW; ++e) acc[e] += f[u][e];
  }
  for (; b < B; ++b) {
    float f[VW];
    load_bf16<VW>(f, dout + (static_cast<int64_t>(b) * T + t) * C + c);
#pragma unroll
    for (int e = 0; e < VW; ++e) acc[e] += f[e];
  }
  store_f32<VW>(to, acc);
}

constexpr int kRowsInFlight = 4;  // dout rows a warp loads before adding them
constexpr int kMaxWarps = 4;      // per block of the small-group kernel
constexpr int kLargeGroup = 64;   // positions above which a group takes the sliced kernel
constexpr int kSlices = 8;        // warps sharing one large group's positions
constexpr int kChunksPerBlock = 2;  // column chunks per block of the large-group kernel

// acc += the dout rows positions[pa..pb) in order (columns v*VW.. of this lane). The lanes load
// 32 positions at once and share them by shuffles; kRowsInFlight rows are loaded together.
// Warp-uniform pa, pb.
template <int VW>
__device__ __forceinline__ void sum_rows(float (&acc)[VW], const bf16* __restrict__ dout,
                                         const int32_t* __restrict__ positions, int pa, int pb,
                                         int v, bool mine, int C) {
  const int lane = threadIdx.x;
  for (int base = pa; base < pb; base += kWarp) {
    const int cnt = min(kWarp, pb - base);
    const int my_pos = lane < cnt ? positions[base + lane] : 0;
    for (int k = 0; k < cnt; k += kRowsInFlight) {
      BfPack<VW> r[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const int pos = __shfl_sync(0xffffffffu, my_pos, (k + u) & (kWarp - 1));
        if (mine && k + u < cnt) r[u] = load_pack<VW>(dout + static_cast<int64_t>(pos) * C + v * VW);
      }
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        if (k + u >= cnt) break;
#pragma unroll
        for (int e = 0; e < VW; ++e) acc[e] += r[u][e];
      }
    }
  }
}

// dwte[ids[g]] += the dout rows of group g, for groups of at most kLargeGroup positions (most:
// rare tokens). One warp per (group, 32*VW columns), no syncs: a one-position group costs two
// round trips to memory. grid (groups, ceil(chunks / warps)), block (32, warps).
template <int VW>
__global__ void __launch_bounds__(kWarp * kMaxWarps, 8)
    embedding_dwte_kernel(float* __restrict__ dwte, const bf16* __restrict__ dout,
                          const int32_t* __restrict__ positions, const int32_t* __restrict__ starts,
                          const int32_t* __restrict__ ids, int C) {
  const int g = blockIdx.x;
  const int p0 = starts[g], p1 = starts[g + 1];
  if (p1 - p0 > kLargeGroup) return;  // the sliced kernel's
  const int chunk = blockIdx.y * blockDim.y + threadIdx.y;
  const int nvec = C / VW;
  if (chunk * kWarp >= nvec) return;  // whole warp
  const int v = chunk * kWarp + threadIdx.x;
  const bool mine = v < nvec;
  float* dst = dwte + static_cast<int64_t>(ids[g]) * C + static_cast<int64_t>(v) * VW;
  float o[VW] = {};
  if (mine) load_f32<VW>(o, dst);  // in flight with the loads below
  float acc[VW] = {};
  sum_rows<VW>(acc, dout, positions, p0, p1, v, mine, C);
  if (!mine) return;
#pragma unroll
  for (int e = 0; e < VW; ++e) o[e] += acc[e];
  store_f32<VW>(dst, o);
}

// The same for groups of more than kLargeGroup positions (frequent tokens): kSlices warps take
// contiguous slices of the positions, and their sums are added in slice order through shared
// memory. grid (groups, ceil(chunks / kChunksPerBlock)), block (32, kSlices): the blocks of the
// small groups only read two offsets and exit, so there are few of them (kChunksPerBlock column
// chunks each, in turn).
template <int VW>
__global__ void __launch_bounds__(kWarp * kSlices, 4)
    embedding_dwte_large_kernel(float* __restrict__ dwte, const bf16* __restrict__ dout,
                                const int32_t* __restrict__ positions,
                                const int32_t* __restrict__ starts,
                                const int32_t* __restrict__ ids, int C) {
  __shared__ float part[kSlices][VW][kWarp];
  const int g = blockIdx.x;
  const int p0 = starts[g], p1 = starts[g + 1];
  if (p1 - p0 <= kLargeGroup) return;  // whole block
  const int nvec = C / VW;
  const int len = ceil_div(p1 - p0, kSlices);
  const int pa = min(p1, p0 + static_cast<int>(threadIdx.y) * len), pb = min(p1, pa + len);
  float* row = dwte + static_cast<int64_t>(ids[g]) * C;
  for (int c = 0; c < kChunksPerBlock; ++c) {
    const int chunk = blockIdx.y * kChunksPerBlock + c;
    if (chunk * kWarp >= nvec) break;  // uniform in the block
    const int v = chunk * kWarp + threadIdx.x;
    const bool mine = v < nvec;
    float acc[VW] = {};
    sum_rows<VW>(acc, dout, positions, pa, pb, v, mine, C);
#pragma unroll
    for (int e = 0; e < VW; ++e) part[threadIdx.y][e][threadIdx.x] = acc[e];
    __syncthreads();
    if (threadIdx.y == 0 && mine) {
      float o[VW];
      load_f32<VW>(o, row + static_cast<int64_t>(v) * VW);
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        float t = part[0][e][threadIdx.x];
        for (int s = 1; s < kSlices; ++s) t += part[s][e][threadIdx.x];
        o[e] += t;
      }
      store_f32<VW>(row + static_cast<int64_t>(v) * VW, o);
    }
    __syncthreads();  // before the next chunk overwrites `part`
  }
}

template <int VW>
void launch_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* positions,
                     const int32_t* starts, const int32_t* ids, int groups, int B, int T, int C,
                     cudaStream_t stream, RowPositions pos) {
  const int nvec = C / VW;
  if (dwpe) {  // null: the tensor-parallel vocabulary rows, whose positions are apart
    embedding_dwpe_kernel<VW><<<ceil_div(int64_t(T) * nvec, kThreads), kThreads, 0, stream>>>(
        dwpe, dout, B, T, C, pos);
    check_launch("embedding_backward (dwpe)");
  }
  if (groups <= 0) return;
  const int chunks = ceil_div(nvec, kWarp);
  const int warps = std::min(kMaxWarps, chunks);
  embedding_dwte_kernel<VW><<<dim3(groups, ceil_div(chunks, warps)), dim3(kWarp, warps), 0, stream>>>(
      dwte, dout, positions, starts, ids, C);
  check_launch("embedding_backward (dwte)");
  // Blocks of the small groups exit at once; the group sizes live on the device only.
  embedding_dwte_large_kernel<VW>
      <<<dim3(groups, ceil_div(chunks, kChunksPerBlock)), dim3(kWarp, kSlices), 0, stream>>>(
          dwte, dout, positions, starts, ids, C);
  check_launch("embedding_backward (dwte, large groups)");
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B,
                       int T, int C, cudaStream_t stream, RowPositions pos) {
  const int64_t rows = int64_t(B) * T;
  if (rows <= 0 || C <= 0) return;
  const bool vec = C % 8 == 0 && all_aligned16(out, wte, wpe);
  const int64_t n = rows * (vec ? C / 8 : C);
  const int grid = static_cast<int>(std::min<int64_t>(ceil_div(n, kThreads), 132 * 64));
  if (vec)
    embedding_forward_kernel<8><<<grid, kThreads, 0, stream>>>(out, tokens, wte, wpe, rows, T, C, pos);
  else
    embedding_forward_kernel<1><<<grid, kThreads, 0, stream>>>(out, tokens, wte, wpe, rows, T, C, pos);
  check_launch("embedding_forward");
}

void embedding_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* positions,
                        const int32_t* starts, const int32_t* ids, int groups, int B, int T, int C,
                        cudaStream_t stream, RowPositions pos) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  if (C % 8 == 0 && all_aligned16(dwte, dwpe, dout))
    launch_backward<8>(dwte, dwpe, dout, positions, starts, ids, groups, B, T, C, stream, pos);
  else
    launch_backward<1>(dwte, dwpe, dout, positions, starts, ids, groups, B, T, C, stream, pos);
}

int group_positions_by_token(const int32_t* tokens, int N, int vocab, int32_t* out) {
  std::vector<int32_t> count(static_cast<size_t>(vocab) + 1, 0), fill(static_cast<size_t>(vocab));
  for (int n = 0; n < N; ++n) ++count[static_cast<size_t>(tokens[n]) + 1];
  for (int v = 0; v < vocab; ++v) count[v + 1] += count[v];
  std::copy(count.begin(), count.end() - 1, fill.begin());
  for (int n = 0; n < N; ++n) out[fill[tokens[n]]++] = n;
  int32_t* starts = out + N;
  int g = 0;
  for (int v = 0; v < vocab; ++v)
    if (count[v + 1] > count[v]) starts[g++] = count[v];
  starts[g] = N;
  int32_t* ids = starts + g + 1;
  for (int v = 0, k = 0; v < vocab; ++v)
    if (count[v + 1] > count[v]) ids[k++] = v;
  return g;
}

}  // namespace myriad::cuda
