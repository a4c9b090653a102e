// Deterministic reductions: the fixed-order reduction of per-block partials (shared by the
// parameter-gradient kernels), bias_backward and segment_sum_squares.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "ops/cuda/kernel_util.cuh"

namespace myriad::cuda {
namespace detail {

int sm_count() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 1;
  static std::mutex mu;
  static std::vector<int> counts;  // by device; 0 = not asked yet
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(counts.size()) <= dev) counts.resize(dev + 1, 0);
  if (counts[dev] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    counts[dev] = std::max(1, n);
  }
  return counts[dev];
}

int resident_blocks(const void* kernel, int threads, size_t smem) {
  int dev = 0;
  cudaGetDevice(&dev);
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, kernel, threads, smem);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess)
    per_sm = 1;
  const int n = std::max(1, per_sm) * sm_count();
  cache.emplace(key, n);
  return n;
}

namespace {

constexpr int kReduceWarps = 8;

// grid (ceil(M/32)), block (32, kReduceWarps): 32 columns per block; warp w sums rows w, w+8, ...
__global__ void reduce_partials_kernel(float* out0, float* out1, int split,
                                       const float* partials,  // (R,M)
                                       int R, int M, bool accumulate) {
  __shared__ float sums[kReduceWarps][kWarp];
  const int j = blockIdx.x * kWarp + threadIdx.x;
  float s = 0.0f;
  if (j < M)
    for (int r = threadIdx.y; r < R; r += kReduceWarps) s += partials[static_cast<int64_t>(r) * M + j];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= M) return;
  float t = sums[0][threadIdx.x];
#pragma unroll
  for (int w = 1; w < kReduceWarps; ++w) t += sums[w][threadIdx.x];
  float* o = j < split ? out0 + j : out1 + (j - split);
  *o = accumulate ? *o + t : t;
}

}  // namespace

void reduce_partials(float* out0, float* out1, int split, const float* partials, int R, int M,
                     bool accumulate, cudaStream_t stream) {
  if (M <= 0) return;
  reduce_partials_kernel<<<ceil_div(M, kWarp), dim3(kWarp, kReduceWarps), 0, stream>>>(
      out0, out1, split, partials, R, M, accumulate);
  check_launch("reduce_partials");
}

}  // namespace detail

using namespace detail;

// ---------------------------------------------------------------------------------------------
// bias_backward: column sums of dout (N,OC). Phase 1: block (x, y) sums the rows of chunk y for
// the 32*VW columns of tile x (8 row slices in the block, added in slice order) into
// scratch[y][OC]; phase 2 adds the chunks in order (reduce_partials).

namespace {

constexpr int kBiasSlices = 8;      // warps per block, each a strided subset of the chunk's rows
constexpr int kBiasMaxChunks = 1024;

// Row chunks: about 1024 blocks in all, at least 32 rows each (fixed by the shape alone, so the
// summation order does not depend on the device).
int bias_chunks(int N, int OC) {
  const int tiles = ceil_div(OC, kWarp * 8);
  const int want = std::max(1, kBiasMaxChunks / tiles);
  return std::max(1, std::min(want, ceil_div(N, 32)));
}

// grid (tiles, chunks), block (32, kBiasSlices)
template <int VW>
__global__ void bias_partials_kernel(float* partials,  // (chunks,OC)
                                     const bf16* dout, int N, int OC, int rows_per_chunk) {
  __shared__ float sums[kBiasSlices][VW][kWarp];  // [slice][e][lane]: no bank conflicts
  const int col = (blockIdx.x * kWarp + threadIdx.x) * VW;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float acc[VW] = {};
  if (col < OC) {
    for (int r = r0 + threadIdx.y; r < r1; r += kBiasSlices) {
      float f[VW];
      load_bf16<VW>(f, dout + static_cast<int64_t>(r) * OC + col);
#pragma unroll
      for (int e = 0; e < VW; ++e) acc[e] += f[e];
    }
  }
#pragma unroll
  for (int e = 0; e < VW; ++e) sums[threadIdx.y][e][threadIdx.x] = acc[e];
  __syncthreads();
  // The first slice's threads add the slices in order for their own columns.
  if (threadIdx.y != 0 || col >= OC) return;
  float* out = partials + static_cast<int64_t>(blockIdx.y) * OC + col;
#pragma unroll
  for (int e = 0; e < VW; ++e) {
    float t = sums[0][e][threadIdx.x];
#pragma unroll
    for (int s = 1; s < kBiasSlices; ++s) t += sums[s][e][threadIdx.x];
    acc[e] = t;
  }
  store_f32<VW>(out, acc);
}

}  // namespace

size_t bias_scratch_floats(int N, int OC) {
  return static_cast<size_t>(bias_chunks(N, OC)) * static_cast<size_t>(std::max(OC, 0));
}

void bias_backward(float* dbias, float* scratch, const bf16* dout, int N, int OC,
                   cudaStream_t stream) {
  if (N <= 0 || OC <= 0) return;
  const int chunks = bias_chunks(N, OC);
  const int rows = ceil_div(N, chunks);
  const bool vec = OC % 8 == 0 && all_aligned16(dout, scratch);
  const int vw = vec ? 8 : 1;
  const dim3 grid(ceil_div(OC, kWarp * vw), chunks), block(kWarp, kBiasSlices);
  if (vec)
    bias_partials_kernel<8><<<grid, block, 0, stream>>>(scratch, dout, N, OC, rows);
  else
    bias_partials_kernel<1><<<grid, block, 0, stream>>>(scratch, dout, N, OC, rows);
  check_launch("bias_backward");
  reduce_partials(dbias, nullptr, OC, scratch, chunks, OC, true, stream);
}

// ---------------------------------------------------------------------------------------------
// segment_sum_squares. The flat range is cut at multiples of kSumsqChunk and at the segment
// boundaries; piece (chunk k, segment i) has its partial in slot k + i (injective: along the
// pieces in order, k + i strictly increases), so segment i owns the contiguous slots
// [first_chunk(i) + i, last_chunk(i) + i]. Phase 1: one block per chunk, one block-wide sum
// per piece; phase 2: one block per segment adds its slots in a fixed order.

namespace {

constexpr int kSumsqChunk = 16384;  // floats per phase-1 block
constexpr int kSumsqThreads = 256;

// Fixed-order block sum (every thread gets the result). `red` holds kSumsqThreads/32 floats and
// must not be read by anyone from an earlier call: callers sync before reusing it.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < kSumsqThreads / kWarp; ++w) t += red[w];
  return t;
}

// Last index i in [0, count] with segments[i] <= x (segments ascending, segments[0] = 0).
__device__ int find_segment(const int64_t* segments, int count, int64_t x) {
  int lo = 0, hi = count;  // invariant: segments[lo] <= x, answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (segments[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ float sum_squares_range(const float* x, int64_t a, int64_t b, bool vec) {
  float s = 0.0f;
  if (vec) {
    const int64_t a4 = min(b, (a + 3) & ~int64_t(3)), b4 = max(a4, b & ~int64_t(3));
    for (int64_t j = a + threadIdx.x; j < a4; j += kSumsqThreads) s += x[j] * x[j];
    for (int64_t j = a4 + 4 * int64_t(threadIdx.x); j < b4; j += 4 * kSumsqThreads) {
      const float4 v = *reinterpret_cast<const float4*>(x + j);
      s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int64_t j = b4 + threadIdx.x; j < b; j += kSumsqThreads) s += x[j] * x[j];
  } else {
    for (int64_t j = a + threadIdx.x; j < b; j += kSumsqThreads) s += x[j] * x[j];
  }
  return s;
}

// grid (chunks), block (kSumsqThreads)
__global__ void sumsq_pieces_kernel(float* slots, const float* x, const int64_t* segments,
                                    int count, int64_t total, bool vec) {
  __shared__ float red[2][kSumsqThreads / kWarp];
  const int64_t k = blockIdx.x;
  const int64_t c0 = k * kSumsqChunk, c1 = min(total, c0 + kSumsqChunk);
  int i = find_segment(segments, count, c0);
  int parity = 0;
  for (; i < count && segments[i] < c1; ++i) {
    const int64_t a = max(c0, segments[i]), b = min(c1, segments[i + 1]);
    if (a >= b) continue;  // an empty segment
    // Alternating buffers: the sync inside the next block_sum orders these reads before reuse.
    const float s = block_sum(sum_squares_range(x, a, b, vec), red[parity]);
    parity ^= 1;
    if (threadIdx.x == 0) slots[k + i] = s;
  }
}

// grid (count), block (kSumsqThreads): thread t adds slots t, t+256, ... in order, then the
// block sum.
__global__ void sumsq_segments_kernel(float* out, const float* slots, const int64_t* segments) {
  __shared__ float red[kSumsqThreads / kWarp];
  const int i = blockIdx.x;
  const int64_t a = segments[i], b = segments[i + 1];
  float s = 0.0f;
  if (a < b) {
    const int64_t first = a / kSumsqChunk + i, last = (b - 1) / kSumsqChunk + i;
    for (int64_t j = first + threadIdx.x; j <= last; j += kSumsqThreads) s += slots[j];
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) out[i] = s;
}

}  // namespace

size_t sumsq_scratch_floats(int64_t total, int count) {
  return static_cast<size_t>((total + kSumsqChunk - 1) / kSumsqChunk) + static_cast<size_t>(count);
}

void segment_sum_squares(float* out, float* scratch, const float* x, const int64_t* segments,
                         int count, int64_t total, cudaStream_t stream) {
  if (count <= 0) return;
  const int64_t chunks = (total + kSumsqChunk - 1) / kSumsqChunk;
  if (chunks > 0) {
    MYRIAD_CHECK(chunks < (int64_t(1) << 31), "segment_sum_squares: too many elements");
    sumsq_pieces_kernel<<<static_cast<unsigned>(chunks), kSumsqThreads, 0, stream>>>(
        scratch, x, segments, count, total, aligned16(x));
    check_launch("segment_sum_squares (pieces)");
  }
  sumsq_segments_kernel<<<count, kSumsqThreads, 0, stream>>>(out, scratch, segments);
  check_launch("segment_sum_squares (segments)");
}

}  // namespace myriad::cuda
