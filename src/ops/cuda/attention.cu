// Flash attention, forward and backward, on the tensor cores (mma.sync m16n8k16, bf16 operands,
// fp32 accumulation), causal with an optional sliding window and, for packed documents, each
// query's document start (data.document_mask). Nothing T x T ever reaches device
// memory: scores live in registers, one tile at a time.
//
// Tiling. Every kernel gives each warp 16*MT "own" rows (queries in the forward and dQ kernels,
// keys in the dK/dV kernel; MT = 1 or 2 m16 tiles) and streams the other side through shared
// memory in tiles of 64 (or 32) rows, double buffered with cp.async: the next tile's copy is in
// flight while the current one is multiplied, and its two halves (K and V, or Q and dO) are
// separate commit groups so that the first product starts before the second half has landed.
// Shared-memory rows are D + 8 elements long: the 16-byte pad puts the 8 rows an ldmatrix phase
// reads in 8 different bank groups (D*2 + 16 bytes is an odd number of 16-byte units for D = 64,
// 80, 128). Operands reach the tensor cores through ldmatrix (.trans where the product needs the
// tile's transpose), and the fp32 accumulator of one product is repacked in registers as the
// bf16 A operand of the next (the m16n8 accumulator layout of two adjacent n-tiles is the m16k16
// A layout), so P and dS never touch shared memory. A warp owning 32 rows reuses each streamed
// B fragment twice (half the shared-memory traffic per flop, the bound of these kernels) but
// needs twice the accumulators; it pays where they fit (forward at D = 64, 80). The tilings are
// template parameters; default_config() picks per D what measured fastest (attn_detail lists
// the compiled ones, the test runs them all and the benchmark compares them).
//
// Forward (one block = W warps of one (batch, head)): Q fragments loaded once into registers
// (re-read from shared memory when they would not fit); for each key tile S = Q K^T, online
// softmax in the exp2 domain (running max m and sum l per row, the output accumulator rescaled
// when m grows; a row that has seen no key yet subtracts 0 instead of -inf), O += P V; at the
// end O / l and lse = m/sqrt(D) + ln l. Key tiles are walked from the diagonal down, only those
// the block can see (causal, window and document limits), and a warp skips a tile none of its rows can
// see; masks are evaluated only on tiles that cross a limit. Blocks with the most key tiles are
// launched first.
//
// Backward, deterministic (no atomics, fixed reduction orders), in three kernels:
// 1. prep: Dv_i = rowsum(dO_i * O_i) and lse_i * log2(e) into the scratch, rows padded to a
//    multiple of 256 with zeros so that tiles load them without bounds checks.
// 2. dK/dV (one block = W warps of keys): for each query tile that can see them, recompute
//    P^T = exp2(K Q^T * c - lse2), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - Dv),
//    dK += dS^T Q; the transposed formulation keeps keys as the warp's rows, so P^T and dS^T
//    are directly A operands. dK, dV are written once at the end.
// 3. dQ (one block = W warps of queries): for each visible key tile, recompute P,
//    dP = dO V^T, dS = P (dP - Dv), dQ += dS K.
// The recomputation costs 7 tile products instead of 5, the price of having no atomics.
//
// Measured on an H200 (B=8, H=16, causal, FLOPs counted as 4*B*H*T^2*D/2 per pass, backward
// 2.5 passes): D=128 T=2048 forward 228-231 TFLOP/s, backward 178-180, together 190-192;
// D=80 T=2048 183 together; D=64 T=1024 140; D=128 T=4096 window 1024 (visible pairs counted)
// 190.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "ops/cuda/attention_detail.cuh"
#include "ops/cuda/ops.cuh"

namespace myriad::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kTile = 64;   // rows of the streamed tiles

// The first key query `row` sees: its window's, and its document's when docs (the row of
// document starts of its batch row) is set. Both only grow with the row, so a block's first
// query bounds the keys of the whole block and its last query tells whether a tile needs masks.
__device__ __forceinline__ int first_key(int row, int window, const int32_t* __restrict__ docs) {
  const int lo = window > 0 ? max(0, row - window + 1) : 0;
  return docs ? max(lo, __ldg(docs + row)) : lo;
}

// The first keys of a warp whose rows are queries (forward, dQ): of its first row (0 past T:
// such a warp skips every tile), of its last row below T, and of this thread's own rows
// rw + 16 t + g + 8 hf (0 past T, where nothing is written).
template <int MT>
struct WarpFirstKeys {
  int first, last, row[MT][2];
  __device__ __forceinline__ WarpFirstKeys(int rw, int RW, int g, int T, int window, const int32_t* drow) {
    first = rw < T ? first_key(rw, window, drow) : 0;
    last = first_key(min(rw + RW - 1, T - 1), window, drow);
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = rw + t * 16 + g + hf * 8;
        row[t][hf] = r < T ? first_key(r, window, drow) : 0;
      }
  }
};
constexpr int kPadT = 256;  // row padding of the scratch's per-(b,h) vectors

// The query rows of a launch (ops.cuh's QueryRows) as the query-row kernels (forward, dQ) walk
// them: blocks [0, nb0) cover positions [b[0], e[0]) in blocks of the kernel's rows, the rest
// [b[1], e[1]); the local row (of out, dout, lse and the scratch) of position p of range c is
// p - shift[c]. The whole sequence: one range [0, T), shift 0, exactly the kernels' old walk.
struct QRanges {
  int b[2], e[2], shift[2];
  int nb0;    // blocks of range 0
  int count;  // local rows, Tq
};
// One block's (or tile's) queries: positions [q0, min(q0 + rows, qend)), local rows p - shift.
struct QBlock {
  int q0, qend, shift;
};
__device__ __forceinline__ QBlock query_block(const QRanges& r, int qb, int rows) {
  return qb < r.nb0 ? QBlock{r.b[0] + qb * rows, r.e[0], r.shift[0]}
                    : QBlock{r.b[1] + (qb - r.nb0) * rows, r.e[1], r.shift[1]};
}

// ---------------------------------------------------------------------------------------------
// PTX wrappers
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte global -> shared copy; zero-fills the destination when !full.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool full) {
  const int n = full ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// d += a * b for one m16n8k16 tile.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ void store_bf16x2(bf16* p, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
}

// ---------------------------------------------------------------------------------------------
// Fragment helpers. A tile in shared memory is row-major with LD = D + 8 elements per row.
// ---------------------------------------------------------------------------------------------
// A operand (16 x 16) at rows r0.., columns c0.. of a row-major tile.
template <int LD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int r0, int c0,
                                       int lane) {
  ldsm_x4(a, smem_addr(tile + (r0 + (lane & 15)) * LD + c0 + (lane >> 4) * 8));
}
// B operands of two n-tiles (n = rows n0..n0+15 of the tile, k = columns c0..c0+15): the
// product's B is the tile's transpose (S = Q K^T style). b[0..1] n-tile 0, b[2..3] n-tile 1.
template <int LD>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], const bf16* tile, int n0, int c0,
                                            int lane) {
  ldsm_x4(b, smem_addr(tile + (n0 + (lane >> 4) * 8 + (lane & 7)) * LD + c0 +
                       ((lane >> 3) & 1) * 8));
}
// B operands of two n-tiles where k = rows k0..k0+15 and n = columns n0..n0+15 of the tile
// (O = P V style). b[0..1] n-tile n0, b[2..3] n-tile n0 + 8.
template <int LD>
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[4], const bf16* tile, int k0, int n0,
                                            int lane) {
  ldsm_x4_t(b, smem_addr(tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + n0 +
                         (lane >> 4) * 8));
}

// The two products every kernel here is made of, on warp tiles of MT x 16 rows.
//
// acc (MT x SN n-tiles of 16 x 8) = rows [r0, r0 + 16 MT) of tile A times the transpose of rows
// [0, 8 SN) of tile B, over the KS * 16 columns of both (S = Q K^T style).
template <int LD, int KS, int MT, int SN>
__device__ __forceinline__ void mma_abt(float (&acc)[MT][SN][4], const bf16* A, int r0,
                                        const bf16* B, int lane) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int n = 0; n < SN; ++n) acc[t][n][0] = acc[t][n][1] = acc[t][n][2] = acc[t][n][3] = 0.f;
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t) load_a<LD>(a[t], A, r0 + t * 16, ks * 16, lane);
#pragma unroll
    for (int np = 0; np < SN / 2; ++np) {
      uint32_t b[4];
      load_b_rows<LD>(b, B, np * 16, ks * 16, lane);
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        mma(acc[t][2 * np], a[t], b[0], b[1]);
        mma(acc[t][2 * np + 1], a[t], b[2], b[3]);
      }
    }
  }
}

// The k-slice kt (columns [16 kt, 16 kt + 16)) of a product's accumulators, rounded to bf16 as
// the A fragments of the next product (P, or dS, on the left).
template <int MT, int SN>
__device__ __forceinline__ void pack_a(uint32_t (&a)[MT][4], const float (&acc)[MT][SN][4],
                                       int kt) {
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    a[t][0] = pack_bf16(acc[t][2 * kt][0], acc[t][2 * kt][1]);
    a[t][1] = pack_bf16(acc[t][2 * kt][2], acc[t][2 * kt][3]);
    a[t][2] = pack_bf16(acc[t][2 * kt + 1][0], acc[t][2 * kt + 1][1]);
    a[t][3] = pack_bf16(acc[t][2 * kt + 1][2], acc[t][2 * kt + 1][3]);
  }
}

// acc (MT x ON n-tiles of 16 x 8, ON = D / 8) += a (k-slice kt, from pack_a) times rows
// [16 kt, 16 kt + 16) of tile B, all D of its columns (O += P V style).
template <int LD, int MT, int ON>
__device__ __forceinline__ void mma_ab_slice(float (&acc)[MT][ON][4], const uint32_t (&a)[MT][4],
                                             const bf16* B, int kt, int lane) {
#pragma unroll
  for (int np = 0; np < ON / 2; ++np) {
    uint32_t b[4];
    load_b_cols<LD>(b, B, kt * 16, np * 16, lane);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      mma(acc[t][2 * np], a[t], b[0], b[1]);
      mma(acc[t][2 * np + 1], a[t], b[2], b[3]);
    }
  }
}

// The heads of one batch row b in the fused QKV activation, (Hkv, G+2, D) per token: key/value
// head `group`'s query heads, key and value (the group of query head h is h / G).
struct QkvHeads {
  int64_t ts;          // elements per token
  const bf16* token0;  // the row's first token
  const bf16 *base, *k, *v;  // the group's first query head, its key, its value (first token)
  int D;
  __device__ QkvHeads(const bf16* qkv, int b, int T, int H, int G, int D_, int group) : D(D_) {
    ts = int64_t(H + 2 * (H / G)) * D;
    token0 = qkv + int64_t(b) * T * ts;
    base = token0 + int64_t(group) * (G + 2) * D;
    k = base + int64_t(G) * D;
    v = k + D;
  }
  __device__ const bf16* q(int j) const { return base + int64_t(j) * D; }  // the group's query head j
  __device__ int64_t offset(const bf16* p) const { return p - token0; }    // within a token
};

// Copies rows row0 .. row0+R-1 (each D elements, global row stride `stride`) into a tile of
// R rows x LD; rows at or past T are zero-filled.
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* g, int64_t stride, int row0,
                                          int T) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kTotal = R * kChunks;
#pragma unroll
  for (int i = 0; i < (kTotal + NT - 1) / NT; ++i) {
    const int c = threadIdx.x + i * NT;
    if (kTotal % NT == 0 || c < kTotal) {
      const int r = c / kChunks;
      const int col = (c % kChunks) * 8;
      const int row = row0 + r;
      const bool ok = row < T;
      cp_async16(smem_addr(tile + r * (D + 8) + col), g + (ok ? row : 0) * stride + col, ok);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward: W warps of 16*MT queries each; key tiles of kTile.
// ---------------------------------------------------------------------------------------------
template <int D, int W, int MT>
constexpr size_t fwd_smem() {
  return size_t(16 * MT * W + 4 * kTile) * (D + 8) * sizeof(bf16);
}

// kDocs: compiled with the document starts or without (their loads and bisections gone).
template <int D, int W, int MT, bool kDocs>
__global__ void __launch_bounds__(W * 32)
    attn_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                    int T, int H, int G, int window, const int32_t* __restrict__ docs, QRanges qr,
                    float c, float inv_sqrt_d) {
  constexpr int NT = W * 32, RW = 16 * MT, BR = RW * W, BC = kTile, LD = D + 8;
  constexpr int KS = D / 16;  // k-steps over D
  constexpr int SN = BC / 8;  // n-tiles of S
  constexpr int ON = D / 8;   // n-tiles of O
  // Q fragments stay in registers when they fit beside the accumulators, else are re-read.
  constexpr bool kQReg = MT == 1 || D <= 64;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + BR * LD;
  bf16* sV = sK + 2 * BC * LD;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  // Queries at positions [q0, qend), keys at [0, T).
  const QBlock qbk = query_block(qr, gridDim.x - 1 - blockIdx.x, BR);
  const int q0 = qbk.q0, qend = qbk.qend;
  const QkvHeads x(qkv, b, T, H, G, D, h / G);
  const int64_t ts = x.ts;
  const bf16* qg = x.q(h % G);
  const bf16* kg = x.k;
  const bf16* vg = x.v;
  const int32_t* drow = kDocs ? docs + int64_t(b) * T : nullptr;
  const int kb_lo = first_key(q0, window, drow) / BC;
  const int kb_hi = min(q0 + BR - 1, qend - 1) / BC;

  load_tile<BR, D, NT>(sQ, qg, ts, q0, qend);
  load_tile<BC, D, NT>(sK, kg, ts, kb_hi * BC, T);
  cp_async_commit();
  load_tile<BC, D, NT>(sV, vg, ts, kb_hi * BC, T);
  cp_async_commit();

  const int rw = q0 + warp * RW;  // the warp's first query
  const WarpFirstKeys<MT> lo(rw, RW, g, qend, window, drow);
  uint32_t qf[kQReg ? MT : 1][kQReg ? KS : 1][4];
  float o[MT][ON][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int n = 0; n < ON; ++n) o[t][n][0] = o[t][n][1] = o[t][n][2] = o[t][n][3] = 0.f;
    m[t][0] = m[t][1] = -INFINITY;
    l[t][0] = l[t][1] = 0.f;
  }

  for (int kb = kb_hi, it = 0; kb >= kb_lo; --kb, ++it) {
    const int st = it & 1;
    const int k0 = kb * BC;
    const bf16* cK = sK + st * BC * LD;
    const bf16* cV = sV + st * BC * LD;
    cp_async_wait<1>();
    __syncthreads();
    if (kQReg && it == 0) {
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
          load_a<LD>(qf[kQReg ? t : 0][kQReg ? ks : 0], sQ, warp * RW + t * 16, ks * 16, lane);
    }
    if (kb > kb_lo) load_tile<BC, D, NT>(sK + (st ^ 1) * BC * LD, kg, ts, k0 - BC, T);
    cp_async_commit();
    if (kb > kb_lo) load_tile<BC, D, NT>(sV + (st ^ 1) * BC * LD, vg, ts, k0 - BC, T);
    cp_async_commit();

    const bool skip = rw >= qend || k0 > rw + RW - 1 || k0 + BC - 1 < lo.first;
    const bool need_mask = k0 + BC - 1 > rw || k0 + BC > T || k0 < lo.last;
    float s[MT][SN][4];
    if (!skip) {
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int n = 0; n < SN; ++n) s[t][n][0] = s[t][n][1] = s[t][n][2] = s[t][n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t a[MT][4];
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          if constexpr (kQReg) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[t][i] = qf[kQReg ? t : 0][kQReg ? ks : 0][i];
          } else {
            load_a<LD>(a[t], sQ, warp * RW + t * 16, ks * 16, lane);
          }
        }
#pragma unroll
        for (int np = 0; np < SN / 2; ++np) {
          uint32_t kf[4];
          load_b_rows<LD>(kf, cK, np * 16, ks * 16, lane);
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            mma(s[t][2 * np], a[t], kf[0], kf[1]);
            mma(s[t][2 * np + 1], a[t], kf[2], kf[3]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int r0 = rw + t * 16 + g, r1 = r0 + 8;
        if (need_mask) {
#pragma unroll
          for (int n = 0; n < SN; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = k0 + n * 8 + 2 * tig + (e & 1);
              const int row = e < 2 ? r0 : r1;
              const bool ok = key <= row && key < T && key >= lo.row[t][e < 2 ? 0 : 1];
              if (!ok) s[t][n][e] = -INFINITY;
            }
          }
        }
        // Online softmax: row maxima over the quad of threads sharing the row.
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < SN; ++n) {
          mx0 = fmaxf(mx0, fmaxf(s[t][n][0], s[t][n][1]));
          mx1 = fmaxf(mx1, fmaxf(s[t][n][2], s[t][n][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m[t][0], mx0), mn1 = fmaxf(m[t][1], mx1);
        // A row that has seen no key yet keeps m = -inf; subtract 0 then (p = 0, no NaN).
        const float mu0 = mn0 == -INFINITY ? 0.f : mn0 * c;
        const float mu1 = mn1 == -INFINITY ? 0.f : mn1 * c;
        const float al0 = ex2(m[t][0] * c - mu0), al1 = ex2(m[t][1] * c - mu1);
        m[t][0] = mn0;
        m[t][1] = mn1;
        float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
        for (int n = 0; n < SN; ++n) {
          s[t][n][0] = ex2(fmaf(s[t][n][0], c, -mu0));
          s[t][n][1] = ex2(fmaf(s[t][n][1], c, -mu0));
          s[t][n][2] = ex2(fmaf(s[t][n][2], c, -mu1));
          s[t][n][3] = ex2(fmaf(s[t][n][3], c, -mu1));
          ps0 += s[t][n][0] + s[t][n][1];
          ps1 += s[t][n][2] + s[t][n][3];
        }
        l[t][0] = l[t][0] * al0 + ps0;
        l[t][1] = l[t][1] * al1 + ps1;
#pragma unroll
        for (int n = 0; n < ON; ++n) {
          o[t][n][0] *= al0;
          o[t][n][1] *= al0;
          o[t][n][2] *= al1;
          o[t][n][3] *= al1;
        }
      }
    }
    cp_async_wait<2>();
    __syncthreads();
    if (!skip) {
#pragma unroll
      for (int kt = 0; kt < BC / 16; ++kt) {
        uint32_t a[MT][4];
        pack_a(a, s, kt);
        mma_ab_slice<LD>(o, a, cV, kt, lane);
      }
    }
  }

  // Finish: full row sums over the quad, normalize, write O and lse.
  const int64_t os = int64_t(H) * D;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lt = l[t][hf];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      const int row = rw + t * 16 + g + hf * 8, local = row - qbk.shift;
      if (row < qend) {
        bf16* po = out + (int64_t(b) * qr.count + local) * os + int64_t(h) * D + 2 * tig;
#pragma unroll
        for (int n = 0; n < ON; ++n)
          store_bf16x2(po + n * 8, o[t][n][2 * hf] * inv, o[t][n][2 * hf + 1] * inv);
        if (tig == 0) lse[int64_t(bh) * qr.count + local] = m[t][hf] * inv_sqrt_d + logf(lt);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward 1: Dv = rowsum(dO * O), lse2 = lse * log2(e), per (b,h) rows padded to Tp with 0.
// ---------------------------------------------------------------------------------------------
__global__ void attn_bwd_prep_kernel(float* __restrict__ dvec, float* __restrict__ lse2,
                                     const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                     const float* __restrict__ lse, int BH, int T, int Tp, int H,
                                     int D) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(BH) * Tp) return;
  const int t = int(w % Tp);
  const int bh = int(w / Tp), b = bh / H, h = bh % H;
  float acc = 0.f;
  if (t < T) {
    const int64_t off = (int64_t(b) * T + t) * H * D + int64_t(h) * D;
    const __nv_bfloat162* pd = reinterpret_cast<const __nv_bfloat162*>(dout + off);
    const __nv_bfloat162* po = reinterpret_cast<const __nv_bfloat162*>(out + off);
    for (int i = lane; i < D / 2; i += 32) {
      const float2 x = __bfloat1622float2(pd[i]);
      const float2 y = __bfloat1622float2(po[i]);
      acc = fmaf(x.x, y.x, acc);
      acc = fmaf(x.y, y.y, acc);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    dvec[w] = acc;
    lse2[w] = t < T ? lse[int64_t(bh) * T + t] * kLog2e : 0.f;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward 2: dK, dV; W warps of 16*MT keys each; query tiles of BN.
// ---------------------------------------------------------------------------------------------
template <int D, int W, int MT, int BN>
constexpr size_t dkdv_smem() {
  return size_t(2 * 16 * MT * W + 4 * BN) * (D + 8) * sizeof(bf16) + 4 * BN * sizeof(float);
}

template <int D, int W, int MT, int BN, bool kDocs>
__global__ void __launch_bounds__(W * 32)
    attn_bwd_dkdv_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                         const bf16* __restrict__ qkv, const float* __restrict__ dvec,
                         const float* __restrict__ lse2, int T, int Tp, int H, int G, int window,
                         const int32_t* __restrict__ docs, QRanges qr, float c, float inv_sqrt_d) {
  constexpr int NT = W * 32, RW = 16 * MT, BC = RW * W, BQ = BN, LD = D + 8;
  constexpr int KS = D / 16;  // k-steps over D
  constexpr int SN = BQ / 8;  // n-tiles of S^T (queries)
  constexpr int ON = D / 8;   // n-tiles of dK, dV
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + BC * LD;
  bf16* sQ = sV + BC * LD;
  bf16* sO = sQ + 2 * BQ * LD;  // dO
  float* sL = reinterpret_cast<float*>(sO + 2 * BQ * LD);
  float* sD = sL + 2 * BQ;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  // One block per key tile of one key/value head: its dK and dV sum the G query heads of its
  // group, in head order (deterministic), as one stream of (head, query tile) steps.
  const int Hkv = H / G, bg = blockIdx.y, b = bg / Hkv, gq = bg % Hkv;
  const int k0 = blockIdx.x * BC;
  const QkvHeads x(qkv, b, T, H, G, D, gq);
  const int64_t ts = x.ts, os = int64_t(H) * D;
  const bf16* kg = x.k;
  const bf16* vg = x.v;
  const int32_t* drow = kDocs ? docs + int64_t(b) * T : nullptr;
  // The last query that sees a key of the block: within the window of its last key, and
  // within that key's document (the last query whose document starts at or before the key).
  int q_last = window > 0 ? int(min(int64_t(T - 1), int64_t(k0) + BC + window - 2)) : T - 1;
  if (drow) {
    const int k_last = min(k0 + BC - 1, T - 1);
    int lo = k_last, hi = T;  // drow[lo] <= k_last < drow[hi] (hi = T: past the row)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (__ldg(drow + mid) > k_last)
        hi = mid;
      else
        lo = mid;
    }
    q_last = min(q_last, lo);
  }
  // The query tiles that see the block's keys, in position order: of each range c of queries,
  // its tiles [j0[c], j0[c] + nt[c]) (tile j at position b[c] + j BQ) within [k0, q_last].
  int j0[2], nt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int first = max(qr.b[r], k0), last = min(qr.e[r] - 1, q_last);
    j0[r] = (first - qr.b[r]) / BQ;
    nt[r] = last < first ? 0 : (last - qr.b[r]) / BQ - j0[r] + 1;
  }
  const int nq = nt[0] + nt[1], steps = G * nq;
  auto tile = [&](int i) {  // the i-th of those tiles
    const int r = i < nt[0] ? 0 : 1;
    return QBlock{qr.b[r] + (j0[r] + (r ? i - nt[0] : i)) * BQ, qr.e[r], qr.shift[r]};
  };

  // Step i: query head gq G + i / nq, query tile tile(i % nq). The tile's lse2 and Dv are read
  // for its rows before qend (its range's end), zeros past it.
  auto load_q = [&](int i, int st) {
    const int j = i / nq;
    const QBlock q = tile(i % nq);
    const int64_t bh = int64_t(b) * H + gq * G + j;
    load_tile<BQ, D, NT>(sQ + st * BQ * LD, x.q(j), ts, q.q0, q.qend);
    const int t = threadIdx.x, local = q.q0 - q.shift;
    if (t < BQ / 4) {
      const bool in = q.q0 + t * 4 < q.qend;
      cp_async16(smem_addr(sL + st * BQ + t * 4), lse2 + bh * Tp + local + (in ? t * 4 : 0), in);
    } else if (t < BQ / 2) {
      const int u = (t - BQ / 4) * 4;
      const bool in = q.q0 + u < q.qend;
      cp_async16(smem_addr(sD + st * BQ + u), dvec + bh * Tp + local + (in ? u : 0), in);
    }
  };
  auto load_o = [&](int i, int st) {
    const int j = i / nq;
    const QBlock q = tile(i % nq);
    const bf16* dog = dout + int64_t(b) * qr.count * os + int64_t(gq * G + j) * D;
    load_tile<BQ, D, NT>(sO + st * BQ * LD, dog, os, q.q0 - q.shift, q.qend - q.shift);
  };
  if (steps > 0) {  // none: no query here sees these keys (context parallelism), dK = dV = 0
    load_tile<BC, D, NT>(sK, kg, ts, k0, T);
    load_tile<BC, D, NT>(sV, vg, ts, k0, T);
    load_q(0, 0);
  }
  cp_async_commit();
  if (steps > 0) load_o(0, 0);
  cp_async_commit();

  const int kw = k0 + warp * RW;  // the warp's first key
  float dk[MT][ON][4], dv[MT][ON][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int n = 0; n < ON; ++n) {
      dk[t][n][0] = dk[t][n][1] = dk[t][n][2] = dk[t][n][3] = 0.f;
      dv[t][n][0] = dv[t][n][1] = dv[t][n][2] = dv[t][n][3] = 0.f;
    }

  for (int it = 0; it < steps; ++it) {
    const int st = it & 1;
    const QBlock qt = tile(it % nq);
    const int q0 = qt.q0, qend = qt.qend;
    const bf16* cQ = sQ + st * BQ * LD;
    const bf16* cO = sO + st * BQ * LD;
    const float* cL = sL + st * BQ;
    const float* cD = sD + st * BQ;
    cp_async_wait<1>();
    __syncthreads();
    if (it + 1 < steps) load_q(it + 1, st ^ 1);
    cp_async_commit();
    if (it + 1 < steps) load_o(it + 1, st ^ 1);
    cp_async_commit();

    // Queries only grow their first key, so the tile's first query decides whether any of it
    // sees the warp's keys, and its last whether all of it sees them all (q0 < qend: the tiles'
    // bound). Queries past qend (their range's end) are masked.
    const bool skip = kw >= T || q0 + BQ - 1 < kw || first_key(q0, window, drow) > kw + RW - 1;
    const bool need_mask = q0 < kw + RW - 1 || q0 + BQ > qend || kw + RW - 1 >= T ||
                           first_key(min(q0 + BQ, qend) - 1, window, drow) > kw;
    float s[MT][SN][4];
    if (!skip) {
      // S^T = K Q^T (keys x queries), then P^T = exp2(S^T c - lse2[query]).
      mma_abt<LD, KS>(s, sK, warp * RW, cQ, lane);
#pragma unroll
      for (int n = 0; n < SN; ++n) {
        const float2 lq = *reinterpret_cast<const float2*>(cL + n * 8 + 2 * tig);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          s[t][n][0] = ex2(fmaf(s[t][n][0], c, -lq.x));
          s[t][n][1] = ex2(fmaf(s[t][n][1], c, -lq.y));
          s[t][n][2] = ex2(fmaf(s[t][n][2], c, -lq.x));
          s[t][n][3] = ex2(fmaf(s[t][n][3], c, -lq.y));
        }
      }
      if (need_mask) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int n = 0; n < SN; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int q = q0 + n * 8 + 2 * tig + (e & 1);
              const int kr = kw + t * 16 + g + (e < 2 ? 0 : 8);
              const bool ok = kr <= q && q < qend && kr >= first_key(q, window, drow);
              if (!ok) s[t][n][e] = 0.f;
            }
          }
      }
    }
    cp_async_wait<2>();
    __syncthreads();
    if (!skip) {
      // dP^T = V dO^T
      float dp[MT][SN][4];
      mma_abt<LD, KS>(dp, sV, warp * RW, cO, lane);
      // dS^T = P^T (dP^T - Dv[query])
#pragma unroll
      for (int n = 0; n < SN; ++n) {
        const float2 d = *reinterpret_cast<const float2*>(cD + n * 8 + 2 * tig);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          dp[t][n][0] = s[t][n][0] * (dp[t][n][0] - d.x);
          dp[t][n][1] = s[t][n][1] * (dp[t][n][1] - d.y);
          dp[t][n][2] = s[t][n][2] * (dp[t][n][2] - d.x);
          dp[t][n][3] = s[t][n][3] * (dp[t][n][3] - d.y);
        }
      }
      // dV += P^T dO, dK += dS^T Q
#pragma unroll
      for (int kt = 0; kt < BQ / 16; ++kt) {
        uint32_t pa[MT][4];
        pack_a(pa, s, kt);
        mma_ab_slice<LD>(dv, pa, cO, kt, lane);
      }
#pragma unroll
      for (int kt = 0; kt < BQ / 16; ++kt) {
        uint32_t da[MT][4];
        pack_a(da, dp, kt);
        mma_ab_slice<LD>(dk, da, cQ, kt, lane);
      }
    }
  }

#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int kr = kw + t * 16 + g + hf * 8;
      if (kr < T) {
        bf16* p = dqkv + (int64_t(b) * T + kr) * ts + x.offset(x.k) + 2 * tig;
#pragma unroll
        for (int n = 0; n < ON; ++n) {
          store_bf16x2(p + n * 8, dk[t][n][2 * hf] * inv_sqrt_d,
                       dk[t][n][2 * hf + 1] * inv_sqrt_d);
          store_bf16x2(p + D + n * 8, dv[t][n][2 * hf], dv[t][n][2 * hf + 1]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward 3: dQ; W warps of 16*MT queries each; key tiles of BN.
// ---------------------------------------------------------------------------------------------
template <int D, int W, int MT, int BN>
constexpr size_t dq_smem() {
  return size_t(2 * 16 * MT * W + 4 * BN) * (D + 8) * sizeof(bf16);
}

template <int D, int W, int MT, int BN, bool kDocs>
__global__ void __launch_bounds__(W * 32)
    attn_bwd_dq_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout,
                       const bf16* __restrict__ qkv, const float* __restrict__ dvec,
                       const float* __restrict__ lse2, int T, int Tp, int H, int G, int window,
                       const int32_t* __restrict__ docs, QRanges qr, float c, float inv_sqrt_d) {
  constexpr int NT = W * 32, RW = 16 * MT, BQ = RW * W, BC = BN, LD = D + 8;
  constexpr int KS = D / 16;
  constexpr int SN = BC / 8;
  constexpr int ON = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sO = sQ + BQ * LD;  // dO
  bf16* sK = sO + BQ * LD;
  bf16* sV = sK + 2 * BC * LD;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int bh = blockIdx.y, b = bh / H, h = bh % H;
  // Queries at positions [q0, qend) (local rows p - shift), keys at [0, T).
  const QBlock qbk = query_block(qr, gridDim.x - 1 - blockIdx.x, BQ);
  const int q0 = qbk.q0, qend = qbk.qend, shift = qbk.shift;
  const QkvHeads x(qkv, b, T, H, G, D, h / G);
  const int64_t ts = x.ts, os = int64_t(H) * D;
  const bf16* qg = x.q(h % G);
  const bf16* kg = x.k;
  const bf16* vg = x.v;
  const bf16* dog = dout + int64_t(b) * qr.count * os + int64_t(h) * D;
  const int32_t* drow = kDocs ? docs + int64_t(b) * T : nullptr;
  const int kb_lo = first_key(q0, window, drow) / BC;
  const int kb_hi = min(q0 + BQ - 1, qend - 1) / BC;

  load_tile<BQ, D, NT>(sQ, qg, ts, q0, qend);
  load_tile<BQ, D, NT>(sO, dog, os, q0 - shift, qend - shift);
  load_tile<BC, D, NT>(sK, kg, ts, kb_hi * BC, T);
  cp_async_commit();
  load_tile<BC, D, NT>(sV, vg, ts, kb_hi * BC, T);
  cp_async_commit();

  const int rw = q0 + warp * RW;
  const WarpFirstKeys<MT> lo(rw, RW, g, qend, window, drow);
  // Rows past qend (their range's end) take zeros.
  float L[MT][2], Dd[MT][2];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = rw + t * 16 + g + hf * 8;
      const bool in = row < qend;
      L[t][hf] = in ? lse2[int64_t(bh) * Tp + row - shift] : 0.f;
      Dd[t][hf] = in ? dvec[int64_t(bh) * Tp + row - shift] : 0.f;
    }
  float dq[MT][ON][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int n = 0; n < ON; ++n) dq[t][n][0] = dq[t][n][1] = dq[t][n][2] = dq[t][n][3] = 0.f;

  for (int kb = kb_hi, it = 0; kb >= kb_lo; --kb, ++it) {
    const int st = it & 1;
    const int k0 = kb * BC;
    const bf16* cK = sK + st * BC * LD;
    const bf16* cV = sV + st * BC * LD;
    cp_async_wait<1>();
    __syncthreads();
    if (kb > kb_lo) load_tile<BC, D, NT>(sK + (st ^ 1) * BC * LD, kg, ts, k0 - BC, T);
    cp_async_commit();
    if (kb > kb_lo) load_tile<BC, D, NT>(sV + (st ^ 1) * BC * LD, vg, ts, k0 - BC, T);
    cp_async_commit();

    const bool skip = rw >= qend || k0 > rw + RW - 1 || k0 + BC - 1 < lo.first;
    const bool need_mask = k0 + BC - 1 > rw || k0 + BC > T || rw + RW > qend || k0 < lo.last;
    float s[MT][SN][4];
    if (!skip) {
      // S = Q K^T, then P = exp2(S c - lse2[query]).
      mma_abt<LD, KS>(s, sQ, warp * RW, cK, lane);
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int n = 0; n < SN; ++n) {
          s[t][n][0] = ex2(fmaf(s[t][n][0], c, -L[t][0]));
          s[t][n][1] = ex2(fmaf(s[t][n][1], c, -L[t][0]));
          s[t][n][2] = ex2(fmaf(s[t][n][2], c, -L[t][1]));
          s[t][n][3] = ex2(fmaf(s[t][n][3], c, -L[t][1]));
        }
      if (need_mask) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int n = 0; n < SN; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = k0 + n * 8 + 2 * tig + (e & 1);
              const int row = rw + t * 16 + g + (e < 2 ? 0 : 8);
              const bool ok = key <= row && key < T && row < qend && key >= lo.row[t][e < 2 ? 0 : 1];
              if (!ok) s[t][n][e] = 0.f;
            }
          }
      }
    }
    cp_async_wait<2>();
    __syncthreads();
    if (!skip) {
      // dP = dO V^T; dS = P (dP - Dv[query]); dQ += dS K.
      float dp[MT][SN][4];
      mma_abt<LD, KS>(dp, sO, warp * RW, cV, lane);
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int n = 0; n < SN; ++n) {
          dp[t][n][0] = s[t][n][0] * (dp[t][n][0] - Dd[t][0]);
          dp[t][n][1] = s[t][n][1] * (dp[t][n][1] - Dd[t][0]);
          dp[t][n][2] = s[t][n][2] * (dp[t][n][2] - Dd[t][1]);
          dp[t][n][3] = s[t][n][3] * (dp[t][n][3] - Dd[t][1]);
        }
#pragma unroll
      for (int kt = 0; kt < BC / 16; ++kt) {
        uint32_t da[MT][4];
        pack_a(da, dp, kt);
        mma_ab_slice<LD>(dq, da, cK, kt, lane);
      }
    }
  }

#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = rw + t * 16 + g + hf * 8;
      if (row < qend) {
        bf16* p = dqkv + (int64_t(b) * T + row) * ts + x.offset(x.q(h % G)) + 2 * tig;
#pragma unroll
        for (int n = 0; n < ON; ++n)
          store_bf16x2(p + n * 8, dq[t][n][2 * hf] * inv_sqrt_d,
                       dq[t][n][2 * hf + 1] * inv_sqrt_d);
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Launchers and the table of compiled variants
// ---------------------------------------------------------------------------------------------
using attn_detail::KernelCfg;

inline int padded_t(int T) { return (T + kPadT - 1) / kPadT * kPadT; }

// The kernels' walk of the query rows `rows` names (whole: [0, T)) in blocks of `block` rows;
// nblocks: the query-row kernels' grid.
QRanges query_ranges(QueryRows rows, int T, int block, int* nblocks) {
  QRanges r{};
  r.count = rows.count < 0 ? T : rows.count;
  const int n0 = int(std::min<int64_t>(rows.pos.n0, r.count));
  r.b[0] = int(rows.pos.p0), r.e[0] = r.b[0] + n0, r.shift[0] = r.b[0];
  r.b[1] = n0 < r.count ? int(rows.pos.p1) : T, r.e[1] = r.b[1] + (r.count - n0), r.shift[1] = r.b[1] - n0;
  r.nb0 = (n0 + block - 1) / block;
  *nblocks = r.nb0 + (r.count - n0 + block - 1) / block;
  return r;
}

template <int D, int W, int MT, int BN>
void launch_fwd(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int G, int window,
                const int32_t* docs, QueryRows rows, cudaStream_t stream) {
  static_assert(BN == kTile, "the forward streams key tiles of kTile");
  constexpr size_t smem = fwd_smem<D, W, MT>();
  auto kernel = docs ? attn_fwd_kernel<D, W, MT, true> : attn_fwd_kernel<D, W, MT, false>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const float inv_sqrt_d = 1.f / std::sqrt(float(D));
  int blocks = 0;
  const QRanges qr = query_ranges(rows, T, 16 * MT * W, &blocks);
  const dim3 grid(blocks, B * H);
  kernel<<<grid, W * 32, smem, stream>>>(out, lse, qkv, T, H, G, window, docs, qr, inv_sqrt_d * kLog2e,
                                         inv_sqrt_d);
  check_launch("attention_forward");
}

template <int D, int W, int MT, int BN>
void launch_dkdv(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* dvec,
                 const float* lse2, int B, int T, int H, int G, int window, const int32_t* docs,
                 QueryRows rows, cudaStream_t stream) {
  constexpr size_t smem = dkdv_smem<D, W, MT, BN>();
  auto kernel = docs ? attn_bwd_dkdv_kernel<D, W, MT, BN, true> : attn_bwd_dkdv_kernel<D, W, MT, BN, false>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const float inv_sqrt_d = 1.f / std::sqrt(float(D));
  constexpr int keys = 16 * MT * W;
  int unused = 0;
  const QRanges qr = query_ranges(rows, T, BN, &unused);
  const dim3 grid((T + keys - 1) / keys, B * (H / G));
  kernel<<<grid, W * 32, smem, stream>>>(dqkv, dout, qkv, dvec, lse2, T, padded_t(qr.count), H, G, window, docs,
                                         qr, inv_sqrt_d * kLog2e, inv_sqrt_d);
  check_launch("attention_backward (dK, dV)");
}

template <int D, int W, int MT, int BN>
void launch_dq(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* dvec,
               const float* lse2, int B, int T, int H, int G, int window, const int32_t* docs,
               QueryRows rows, cudaStream_t stream) {
  constexpr size_t smem = dq_smem<D, W, MT, BN>();
  auto kernel = docs ? attn_bwd_dq_kernel<D, W, MT, BN, true> : attn_bwd_dq_kernel<D, W, MT, BN, false>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  const float inv_sqrt_d = 1.f / std::sqrt(float(D));
  int blocks = 0;
  const QRanges qr = query_ranges(rows, T, 16 * MT * W, &blocks);
  const dim3 grid(blocks, B * H);
  kernel<<<grid, W * 32, smem, stream>>>(dqkv, dout, qkv, dvec, lse2, T, padded_t(qr.count), H, G, window, docs,
                                         qr, inv_sqrt_d * kLog2e, inv_sqrt_d);
  check_launch("attention_backward (dQ)");
}

using FwdFn = void (*)(bf16*, float*, const bf16*, int, int, int, int, int, const int32_t*, QueryRows,
                       cudaStream_t);
using BwdFn = void (*)(bf16*, const bf16*, const bf16*, const float*, const float*, int, int, int,
                       int, int, const int32_t*, QueryRows, cudaStream_t);
template <class Fn>
struct Variant {
  int D;
  KernelCfg k;
  Fn fn;
};

#define MYRIAD_ATTN_FWD(D, W, MT) {D, {W, MT, kTile}, &launch_fwd<D, W, MT, kTile>}
#define MYRIAD_ATTN_DKDV(D, W, MT, BN) {D, {W, MT, BN}, &launch_dkdv<D, W, MT, BN>}
#define MYRIAD_ATTN_DQ(D, W, MT, BN) {D, {W, MT, BN}, &launch_dq<D, W, MT, BN>}
const Variant<FwdFn> kFwdVariants[] = {
    MYRIAD_ATTN_FWD(64, 4, 1),  MYRIAD_ATTN_FWD(64, 8, 1),  MYRIAD_ATTN_FWD(64, 4, 2),
    MYRIAD_ATTN_FWD(80, 4, 1),  MYRIAD_ATTN_FWD(80, 8, 1),  MYRIAD_ATTN_FWD(80, 4, 2),
    MYRIAD_ATTN_FWD(128, 4, 1), MYRIAD_ATTN_FWD(128, 8, 1),
};
const Variant<BwdFn> kDkdvVariants[] = {
    MYRIAD_ATTN_DKDV(64, 4, 1, 64),  MYRIAD_ATTN_DKDV(64, 8, 1, 64),
    MYRIAD_ATTN_DKDV(64, 4, 2, 32),  MYRIAD_ATTN_DKDV(80, 4, 1, 64),
    MYRIAD_ATTN_DKDV(80, 8, 1, 64),  MYRIAD_ATTN_DKDV(128, 4, 1, 64),
    MYRIAD_ATTN_DKDV(128, 8, 1, 64),
};
const Variant<BwdFn> kDqVariants[] = {
    MYRIAD_ATTN_DQ(64, 4, 1, 64),  MYRIAD_ATTN_DQ(64, 8, 1, 64),  MYRIAD_ATTN_DQ(80, 4, 1, 64),
    MYRIAD_ATTN_DQ(80, 8, 1, 64),  MYRIAD_ATTN_DQ(128, 4, 1, 64), MYRIAD_ATTN_DQ(128, 8, 1, 64),
};

template <class Fn, size_t N>
Fn find_variant(const Variant<Fn> (&table)[N], int D, const KernelCfg& k, const char* what) {
  if (D != 64 && D != 80 && D != 128)
    throw_input(what, ": head size ", D, " is not supported (64, 80 or 128)");
  for (const auto& v : table)
    if (v.D == D && v.k.warps == k.warps && v.k.mt == k.mt && v.k.tile == k.tile) return v.fn;
  throw_input(what, ": no kernel compiled for D=", D, " warps=", k.warps, " mt=", k.mt,
              " tile=", k.tile);
}

template <class Fn, size_t N>
std::vector<KernelCfg> list_variants(const Variant<Fn> (&table)[N], int D) {
  std::vector<KernelCfg> r;
  for (const auto& v : table)
    if (v.D == D) r.push_back(v.k);
  return r;
}

void check_shape(const char* what, int B, int T, int H, int Hkv, QueryRows rows) {
  if (B < 1 || T < 1 || H < 1 || Hkv < 1 || H % Hkv != 0 || int64_t(B) * H > 65535)
    throw_input(what, ": bad shape B=", B, " T=", T, " H=", H, " Hkv=", Hkv);
  if (rows.count < 0) return;
  // Each range a multiple of 8 rows: the backward reads a tile's lse and Dv in 16-byte pieces
  // from its range's first local row on.
  const int64_t n0 = std::min<int64_t>(rows.pos.n0, rows.count), n1 = rows.count - n0;
  MYRIAD_CHECK(rows.count >= 1 && n0 % 8 == 0 && n1 % 8 == 0 && rows.pos.p0 >= 0 && rows.pos.p0 + n0 <= T &&
                   (n1 == 0 || (rows.pos.p1 >= rows.pos.p0 + n0 && rows.pos.p1 + n1 <= T)),
               what, ": query rows [", rows.pos.p0, ", ", rows.pos.p0 + n0, ") and [", rows.pos.p1, ", ",
               rows.pos.p1 + n1, ") of T=", T, " (ranges in order, inside the sequence, multiples of 8 rows)");
}

}  // namespace

namespace attn_detail {

// Measured on an H200 (B=8, H=16, causal; T=2048 for D=128 and 80, T=1024 for D=64).
Config default_config(int D) {
  if (D == 128) return Config{{4, 1, kTile}, {8, 1, kTile}, {4, 1, kTile}};
  return Config{{4, 2, kTile}, {4, 1, kTile}, {4, 1, kTile}};
}

std::vector<KernelCfg> fwd_variants(int D) { return list_variants(kFwdVariants, D); }
std::vector<KernelCfg> dkdv_variants(int D) { return list_variants(kDkdvVariants, D); }
std::vector<KernelCfg> dq_variants(int D) { return list_variants(kDqVariants, D); }

void forward(const Config& cfg, bf16* out, float* lse, const bf16* qkv, int B, int T, int H,
             int Hkv, int D, int window, cudaStream_t stream, const int32_t* docs, QueryRows rows) {
  check_shape("attention_forward", B, T, H, Hkv, rows);
  find_variant(kFwdVariants, D, cfg.fwd, "attention_forward")(out, lse, qkv, B, T, H, H / Hkv, window,
                                                              docs, rows, stream);
}

void backward(const Config& cfg, bf16* dqkv, float* scratch, const bf16* dout, const bf16* out,
              const bf16* qkv, const float* lse, int B, int T, int H, int Hkv, int D, int window,
              cudaStream_t stream, const int32_t* docs, QueryRows rows) {
  check_shape("attention_backward", B, T, H, Hkv, rows);
  const BwdFn dkdv = find_variant(kDkdvVariants, D, cfg.dkdv, "attention_backward");
  const BwdFn dq = find_variant(kDqVariants, D, cfg.dq, "attention_backward");
  const int Tq = rows.count < 0 ? T : rows.count, Tp = padded_t(Tq);
  float* dvec = scratch;
  float* lse2 = scratch + int64_t(B) * H * Tp;
  {
    const int64_t warps = int64_t(B) * H * Tp;
    const int threads = 256;
    const int64_t blocks = (warps * 32 + threads - 1) / threads;
    attn_bwd_prep_kernel<<<unsigned(blocks), threads, 0, stream>>>(dvec, lse2, dout, out, lse,
                                                                   B * H, Tq, Tp, H, D);
    check_launch("attention_backward (prep)");
  }
  dkdv(dqkv, dout, qkv, dvec, lse2, B, T, H, H / Hkv, window, docs, rows, stream);
  dq(dqkv, dout, qkv, dvec, lse2, B, T, H, H / Hkv, window, docs, rows, stream);
}

}  // namespace attn_detail

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int H, int Hkv, int D,
                       int window, cudaStream_t stream, const int32_t* docs, QueryRows rows) {
  attn_detail::forward(attn_detail::default_config(D), out, lse, qkv, B, T, H, Hkv, D, window, stream, docs,
                       rows);
}

size_t attention_scratch_floats(int B, int Tq, int H, int D) {
  return size_t(2) * B * H * padded_t(Tq);
}

void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* out,
                        const bf16* qkv, const float* lse, int B, int T, int H, int Hkv, int D, int window,
                        cudaStream_t stream, const int32_t* docs, QueryRows rows) {
  attn_detail::backward(attn_detail::default_config(D), dqkv, scratch, dout, out, qkv, lse, B, T,
                        H, Hkv, D, window, stream, docs, rows);
}

}  // namespace myriad::cuda
