// FP8 casts (ops/fp8.h has the contract and the host emulation they are tested against).
#include <cuda_fp8.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/activations.cuh"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/ops.cuh"
#include "ops/fp8.h"

namespace myriad::cuda {
namespace {

using detail::ceil_div;
using fp8::Format;

// Non-negative floats order as their bits do, so the largest magnitude is an integer atomicMax:
// exact and independent of the order the blocks finish in. A NaN makes the amax infinite (fmaxf
// alone would skip it); a non-finite amax makes the scale NaN (fp8::scale_for), so the cast is
// all NaN and the step's gradient check sees it.
__global__ void amax_kernel(unsigned* out, const bf16* __restrict__ x, int64_t n) {
  float m = 0.0f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t vectors = n / 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors; i += stride) {
    float f[8];
    detail::load_bf16<8>(f, x + 8 * i);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(f[j])) + (f[j] != f[j] ? INFINITY : 0.0f);
  }
  for (int64_t i = 8 * vectors + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float f = __bfloat162float(x[i]);
    m = fmaxf(m, fabsf(f)) + (f != f ? INFINITY : 0.0f);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(out, __float_as_uint(m));
}

__global__ void scales_kernel(float* scale, float* inv, const float* amax, int count, Format f) {
  float m = amax[0];
  for (int i = 1; i < count; ++i) m = fmaxf(m, amax[i]);  // amaxes are >= 0 or infinite, never NaN
  const float s = fp8::scale_for(m, f);
  *scale = s;
  if (inv) *inv = 1.0f / s;  // exact: a power of two
}

__device__ __forceinline__ uint8_t to_fp8(float x, Format f) {
  return static_cast<uint8_t>(
      __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == Format::e4m3 ? __NV_E4M3 : __NV_E5M2));
}

// Where a cast's 8 values at (row, col..col+8) of a (rows, cols) tensor come from: the tensor
// itself (bf16), or an MLP activation recomputed from its input, rounded to bf16 as its own
// kernel writes it (swiglu.cu, elementwise.cu), so the cast sees the same bits.
struct FromTensor {
  const bf16* x;
  int cols;
  __device__ void operator()(float (&v)[8], int row, int col) const {
    detail::load_bf16<8>(v, x + int64_t(row) * cols + col);
  }
};
struct FromSwiGlu {  // gu (rows, cols, 2): (gate, up) pairs
  const bf16* gu;
  int cols;
  __device__ void operator()(float (&v)[8], int row, int col) const {
    float p[8], q[8];
    detail::load_bf16<8>(p, gu + 2 * (int64_t(row) * cols + col));
    detail::load_bf16<8>(q, gu + 2 * (int64_t(row) * cols + col) + 8);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = __bfloat162float(__float2bfloat16(activation::silu(p[2 * e]) * p[2 * e + 1]));
      v[4 + e] = __bfloat162float(__float2bfloat16(activation::silu(q[2 * e]) * q[2 * e + 1]));
    }
  }
};
struct FromGelu {  // pre (rows, cols)
  const bf16* pre;
  int cols;
  __device__ void operator()(float (&v)[8], int row, int col) const {
    detail::load_bf16<8>(v, pre + int64_t(row) * cols + col);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(__float2bfloat16(activation::gelu(v[j])));
  }
};

// A 64x64 tile per block of 256 threads: read as rows of 8 values (cols a multiple of 8), written
// cast in the source's order (8 bytes a thread) and, through shared memory, transposed (the same).
constexpr int kTile = 64;
template <class Load>
__global__ void cast_kernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, Load load, int rows, int cols,
                            const float* __restrict__ scale_ptr, Format f) {
  __shared__ __align__(16) uint8_t tile[kTile][kTile + 8];  // [column][row] of the cast tile
  const float scale = *scale_ptr;
  const int r0 = blockIdx.y * kTile, c0 = blockIdx.x * kTile;
  // 256 threads: 32 rows x 8 vectors of 8 columns, in two passes.
  const int vc = threadIdx.x % 8, vr = threadIdx.x / 8;
  for (int pass = 0; pass < kTile / 32; ++pass) {
    const int r = vr + 32 * pass, row = r0 + r, col = c0 + 8 * vc;
    if (row >= rows || col >= cols) continue;
    float v[8];
    load(v, row, col);
    alignas(8) uint8_t q[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = to_fp8(v[j] * scale, f);
    if (out) *reinterpret_cast<uint2*>(out + int64_t(row) * cols + col) = *reinterpret_cast<const uint2*>(q);
#pragma unroll
    for (int j = 0; j < 8; ++j) tile[8 * vc + j][r] = q[j];
  }
  if (!out_t) return;
  __syncthreads();
  // out_t (cols, rows): row c of the tile is tile[c][0..64).
  for (int pass = 0; pass < kTile / 32; ++pass) {
    const int c = vr + 32 * pass, col = c0 + c, row = r0 + 8 * vc;
    if (col >= cols || row >= rows) continue;
    if (row + 8 <= rows) {
      *reinterpret_cast<uint2*>(out_t + int64_t(col) * rows + row) = *reinterpret_cast<const uint2*>(&tile[c][8 * vc]);
    } else {
      for (int j = 0; j < 8 && row + j < rows; ++j) out_t[int64_t(col) * rows + row + j] = tile[c][8 * vc + j];
    }
  }
}

// Block scaling's cast: a 128 x 128 region of x per block of 256 threads, staged in shared
// memory in bf16, then its tiles' amaxes: per row (out's 1 x 128 tiles), per column (out_t's), or
// of the whole region (a 128 x 128 block, both outputs). Partial regions at the edges read as
// zeros, which no amax sees. Out is written from the staged rows, out_t 16 bytes of a column a
// thread, the lanes along the columns (no shared-memory bank conflicts).
constexpr int kRegion = 128;

__global__ void cast_tiles_kernel(uint8_t* __restrict__ out, float* __restrict__ inv, uint8_t* __restrict__ out_t,
                                  float* __restrict__ inv_t, const bf16* __restrict__ x, int rows, int cols,
                                  bool blocks, Format f) {
  __shared__ __align__(16) bf16 tile[kRegion][kRegion + 8];
  __shared__ float row_scale[kRegion], col_scale[kRegion], col_half[kRegion];
  __shared__ unsigned region_amax;
  const int t = threadIdx.x, r0 = blockIdx.y * kRegion, c0 = blockIdx.x * kRegion;
  if (t == 0) region_amax = 0;
  __syncthreads();
  // Stage: 16 threads a row, 8 values each, 16 rows a pass.
  float m_all = 0.0f;
  for (int pass = 0; pass < kRegion / 16; ++pass) {
    const int r = pass * 16 + t / 16, c = 8 * (t % 16);
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (r0 + r < rows && c0 + c < cols) raw = *reinterpret_cast<const uint4*>(x + int64_t(r0 + r) * cols + c0 + c);
    *reinterpret_cast<uint4*>(&tile[r][c]) = raw;
    const bf16* v = reinterpret_cast<const bf16*>(&raw);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = detail::amax_fold(m, __bfloat162float(v[j]));
    m_all = fmaxf(m_all, m);
#pragma unroll
    for (int o = 8; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));  // within the row's 16 lanes
    if (t % 16 == 0) row_scale[r] = m;
  }
  if (blocks) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m_all = fmaxf(m_all, __shfl_xor_sync(0xffffffffu, m_all, o));
    if (t % 32 == 0) atomicMax(&region_amax, __float_as_uint(m_all));
  }
  __syncthreads();
  if (!blocks && out_t) {  // each column's amax, in two halves of 64 rows
    const int c = t % kRegion, h = t / kRegion;
    float m = 0.0f;
    for (int r = 64 * h; r < 64 * h + 64; ++r) m = detail::amax_fold(m, __bfloat162float(tile[r][c]));
    if (h == 1) col_half[c] = m;
    __syncthreads();
    if (h == 0) col_scale[c] = fmaxf(m, col_half[c]);
  }
  __syncthreads();
  // Amaxes to scales, and the inverse scales where cuBLASLt reads them.
  if (blocks) {
    const float s = fp8::scale_for(__uint_as_float(region_amax), f);
    if (t < kRegion) row_scale[t] = s, col_scale[t] = s;
    if (t == 0) {
      const int gx = gridDim.x, gy = gridDim.y, lx = (gx + 3) / 4 * 4, ly = (gy + 3) / 4 * 4;
      if (out) {
        inv[blockIdx.y * lx + blockIdx.x] = 1.0f / s;
        if (blockIdx.x == gx - 1)
          for (int j = gx; j < lx; ++j) inv[blockIdx.y * lx + j] = 0.0f;
      }
      if (out_t) {
        inv_t[blockIdx.x * ly + blockIdx.y] = 1.0f / s;
        if (blockIdx.y == gy - 1)
          for (int j = gy; j < ly; ++j) inv_t[blockIdx.x * ly + j] = 0.0f;
      }
    }
  } else if (t < kRegion) {
    if (out) {
      row_scale[t] = fp8::scale_for(row_scale[t], f);
      if (r0 + t < rows) inv[int64_t(blockIdx.x) * rows + r0 + t] = 1.0f / row_scale[t];
    }
    if (out_t) {
      col_scale[t] = fp8::scale_for(col_scale[t], f);
      if (c0 + t < cols) inv_t[int64_t(blockIdx.y) * cols + c0 + t] = 1.0f / col_scale[t];
    }
  }
  __syncthreads();
  if (out) {
    for (int pass = 0; pass < kRegion / 16; ++pass) {
      const int r = pass * 16 + t / 16, c = 8 * (t % 16);
      if (r0 + r >= rows || c0 + c >= cols) continue;
      const float s = row_scale[r];
      alignas(8) uint8_t q[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) q[j] = to_fp8(__bfloat162float(tile[r][c + j]) * s, f);
      *reinterpret_cast<uint2*>(out + int64_t(r0 + r) * cols + c0 + c) = *reinterpret_cast<const uint2*>(q);
    }
  }
  if (out_t) {
    // out_t (cols, rows): a warp's lanes take 32 columns, each 16 consecutive rows of its column.
    for (int pass = 0; pass < kRegion * kRegion / (256 * 16); ++pass) {
      const int i = pass * 256 + t, c = (i / 256) * 32 + i % 32, r = 16 * ((i % 256) / 32);
      if (c0 + c >= cols || r0 + r >= rows) continue;
      const float s = col_scale[c];
      alignas(16) uint8_t q[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) q[j] = to_fp8(__bfloat162float(tile[r + j][c]) * s, f);
      *reinterpret_cast<uint4*>(out_t + int64_t(c0 + c) * rows + r0 + r) = *reinterpret_cast<const uint4*>(q);
    }
  }
}

}  // namespace

void amax(float* out, const bf16* x, int64_t n, cudaStream_t stream) {
  MYRIAD_CHECK(cudaMemsetAsync(out, 0, sizeof(float), stream) == cudaSuccess, "amax: cannot clear its output");
  if (n <= 0) return;
  MYRIAD_CHECK(detail::aligned16(x), "amax: the input must be 16-byte aligned");
  const int blocks = std::min<int64_t>(ceil_div(n, 256 * 8), 1024);
  amax_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<unsigned*>(out), x, n);
  check_launch("amax");
}

void fp8_scales(float* scale, float* inv_scale, const float* amax, int count, fp8::Format f, cudaStream_t stream) {
  MYRIAD_CHECK(count >= 1, "fp8_scales: ", count, " amaxes");
  scales_kernel<<<1, 1, 0, stream>>>(scale, inv_scale, amax, count, f);
  check_launch("fp8_scales");
}

void cast_fp8(uint8_t* out, uint8_t* out_t, const bf16* x, int rows, int cols, const float* scale, fp8::Format f,
              cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  MYRIAD_CHECK(cols % 8 == 0 && detail::aligned16(x) && (!out || detail::aligned16(out)) &&
                   (!out_t || (rows % 8 == 0 && detail::aligned16(out_t))) && (out || out_t),
               "cast_fp8: rows ", rows, " cols ", cols, ": 8-element rows (and columns when transposed), 16-byte "
               "aligned buffers");
  MYRIAD_CHECK(ceil_div(rows, kTile) <= 65535, "cast_fp8: ", rows, " rows exceed the grid's 65535 tiles of ", kTile);
  const dim3 grid(ceil_div(cols, kTile), ceil_div(rows, kTile));
  cast_kernel<<<grid, 256, 0, stream>>>(out, out_t, FromTensor{x, cols}, rows, cols, scale, f);
  check_launch("cast_fp8");
}

void cast_fp8_activation_t(uint8_t* out_t, const bf16* pre, bool swiglu, int rows, int cols, const float* scale,
                           fp8::Format f, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  MYRIAD_CHECK(cols % 8 == 0 && rows % 8 == 0 && detail::aligned16(pre) && detail::aligned16(out_t),
               "cast_fp8_activation_t: rows ", rows, " cols ", cols, ": multiples of 8, 16-byte aligned buffers");
  MYRIAD_CHECK(ceil_div(rows, kTile) <= 65535, "cast_fp8_activation_t: ", rows, " rows exceed the grid's 65535 tiles");
  const dim3 grid(ceil_div(cols, kTile), ceil_div(rows, kTile));
  if (swiglu)
    cast_kernel<<<grid, 256, 0, stream>>>(nullptr, out_t, FromSwiGlu{pre, cols}, rows, cols, scale, f);
  else
    cast_kernel<<<grid, 256, 0, stream>>>(nullptr, out_t, FromGelu{pre, cols}, rows, cols, scale, f);
  check_launch("cast_fp8_activation_t");
}

void cast_fp8_tiles(uint8_t* out, float* inv, uint8_t* out_t, float* inv_t, const bf16* x, int rows, int cols,
                    bool blocks, fp8::Format f, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  MYRIAD_CHECK((out || out_t) && (!out || inv) && (!out_t || inv_t), "cast_fp8_tiles: an output without its scales");
  MYRIAD_CHECK(rows % 16 == 0 && cols % 16 == 0 && detail::aligned16(x) && (!out || detail::aligned16(out)) &&
                   (!out_t || detail::aligned16(out_t)) && (!inv || detail::aligned16(inv)) &&
                   (!inv_t || detail::aligned16(inv_t)),
               "cast_fp8_tiles: rows ", rows, " cols ", cols, ": multiples of 16, 16-byte aligned buffers");
  MYRIAD_CHECK(ceil_div(rows, kRegion) <= 65535, "cast_fp8_tiles: ", rows, " rows exceed the grid's 65535 regions");
  const dim3 grid(ceil_div(cols, kRegion), ceil_div(rows, kRegion));
  cast_tiles_kernel<<<grid, 256, 0, stream>>>(out, inv, out_t, inv_t, x, rows, cols, blocks, f);
  check_launch("cast_fp8_tiles");
}

}  // namespace myriad::cuda
