// FP8 as Myriad's FP8 training computes it (OCP FP8: e4m3 "fn", no infinities, and e5m2; issue
// 28), on the host: the exact emulation that the CUDA casting kernels are tested
// against, and the one definition of the per-tensor scale.
//
// Contract of a cast: q = encode(x * scale) with round to nearest, ties to even, saturating to
// the largest finite value (CUDA's __NV_SATFINITE); a GEMM on q multiplies back by 1 / scale.
// Scales are powers of two: x * scale is then exact in fp32 (short of the subnormal edge), so the
// cast depends on x and the amax alone, and every device and layout that sees the same amax
// rounds alike. A power of two wastes at most one binade of the format's top, never precision:
// the format is floating point, so relative precision does not depend on where values sit.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#if defined(__CUDACC__)
#define MYRIAD_FP8_HD __host__ __device__
#else
#define MYRIAD_FP8_HD
#endif

namespace myriad {
struct TrainConfig;
}

namespace myriad::fp8 {

enum class Format { e4m3, e5m2 };

// The largest finite magnitude: 448 (e4m3), 57344 (e5m2).
float max_finite(Format f);
// The byte of x's value in the format: nearest, ties to even mantissa, |x| past max_finite (and
// infinities) to +-max_finite; NaN to the format's NaN (0x7f, or 0xff for negative NaN).
uint8_t encode(float x, Format f);
// The value of a byte (every byte of e4m3 but 0x7f/0xff is finite; e5m2 has +-inf and NaNs).
float decode(uint8_t q, Format f);
// The power of two s, 2^-126..2^126, largest with amax * s <= max_finite(f): the cast's scale for
// a tensor whose largest magnitude is amax. 1 when amax is 0. NaN when amax is not finite (an
// infinity or a NaN in the tensor): the saturating cast would turn an infinity into a finite
// value, so the whole tensor becomes NaN instead and the step's gradient check sees it. Host and
// device compute it alike: exponent arithmetic only.
MYRIAD_FP8_HD inline float scale_for(float amax, Format f) {
  if (!(amax <= 3.4028235e38f)) return NAN;  // +inf, or NaN
  if (!(amax > 0)) return 1.0f;
  // amax = m 2^e with m in [0.5, 1); the largest finite is 0.875 x 2^9 (e4m3), 0.875 x 2^16 (e5m2).
  int e = 0;
  const float m = frexpf(amax, &e);
  int k = (f == Format::e4m3 ? 9 : 16) - e - (m > 0.875f ? 1 : 0);
  k = k < -126 ? -126 : (k > 126 ? 126 : k);
  return ldexpf(1.0f, k);
}
// What one scale covers (train.fp8_scaling):
// - tensor: the whole tensor (over the tensor-parallel group: AmaxGroup);
// - block: DeepSeek-V3's tiles. A GEMM operand (M, K), K its inner dimension, takes a scale per
//   1 x 128 tile along K when it is an activation or a gradient, and per 128 x 128 block when it is
//   a weight, through cuBLASLt's block-scaled FP8 GEMMs (Hopper). An outlier then coarsens its own
//   128 values only. Each scale is scale_for its tile's amax, as a tensor's is for the tensor.
enum class Scaling { tensor, block };
// A run's FP8 recipe (train.precision = "fp8" and the train.fp8_* keys): the formats of the
// GEMMs' operands (the weights take the forward's), each scaled by scale_for the current amax of
// what its scale covers; whether the forward's GEMM accumulates with cuBLASLt's fast (coarser)
// accumulation (tensor scaling only); whether the LM head's GEMMs are FP8 too.
struct Recipe {
  Format forward = Format::e4m3;   // activations and weights
  Format gradient = Format::e5m2;  // output gradients (train.fp8_gradients)
  Scaling scaling = Scaling::tensor;  // train.fp8_scaling
  bool fast_accum = false;         // train.fp8_fast_accum
  bool lm_head = false;            // train.fp8_lm_head
};
Recipe recipe_of(const TrainConfig& t);
// The recipe in words, as a run logs it at its start.
std::string describe(const Recipe& r);
// Where the amaxes of a tensor's shards meet. Under tensor parallelism a rank holds a slice of a
// weight, an activation or a gradient; each rank scales its slice by the whole tensor's amax, as
// one GPU would, so the layout computes what one GPU computes. gather(local, all): all[ranks]
// (device floats) receives every rank's *local, in rank order, on the op set's stream; collective
// over the group. ranks 1: nothing to gather.
struct AmaxGroup {
  int ranks = 1;
  std::function<void(const float* local, float* all)> gather;
};
// What an FP8 linear's forward keeps of its input x (N rows, IC features) for its backward, whose
// weight gradient takes x^T in FP8 at x's scale: the cast's scalars, and where a model asks, the
// transposed cast itself. With the scalars the backward's cast of x^T skips the amax pass (and,
// under tensor parallelism, the group's gather); with the bytes there is no cast at all, and a
// model keeps them in place of x's bf16 (half the bytes). The backward's x (kept, refilled by a
// recompute, or recomputed from the activation's input) is bitwise the forward's, so it computes
// what casting it afresh computes.
struct Kept {
  float* scalars = nullptr;  // device, kept_floats(ranks): amax at 0, scale 16, 1/scale 32, the group's amaxes 48..
  uint8_t* bytes = nullptr;  // device, (IC, N) in the forward's format; null: not kept
  // x's producer (the MLP's activation) writes x's amax at scalars[0] as it writes x: the
  // forward's cast then skips its amax pass.
  bool producer_amax = false;
};
// Floats of a cast's scalars with `ranks` tensor-parallel ranks: each scalar 64-byte aligned
// (cuBLASLt reads a scale only there), the group's amaxes from 48.
inline int64_t aligned_floats(int64_t n) { return (n + 15) / 16 * 16; }  // to 64 bytes
inline int64_t kept_floats(int64_t ranks) { return 48 + aligned_floats(ranks); }
// A weight's FP8 casts, made once (the op set's fp8_cast_weight) and read by the GEMMs that take
// the weight until the model casts it again: W (OC, IC) row-major for the forward and W^T
// (IC, OC) for the input gradient, in one pass at one scale. A weight changes only at the
// optimizer's step, so within a step these are the bytes each call's own cast would make.
struct WeightCast {
  uint8_t* bytes = nullptr;    // device, (OC, IC)
  uint8_t* bytes_t = nullptr;  // device, (IC, OC)
  // device, weight_cast_floats. tensor: Kept's layout (1 / scale at 32, for both layouts); block:
  // W's blocks' inverse scales, then from weight_cast_t_offset W^T's, at scales_t
  float* scales = nullptr;
  float* scales_t = nullptr;  // block: W^T's blocks' inverse scales; tensor: the same as scales
};
// Whether a step that casts a weight `casts` times casts it once into a WeightCast instead: when
// it would cast it more than twice (micro-batches, full recompute's second forward, the LM head's
// row chunks). Twice, one micro-batch's forward and backward, the cast held for the step would
// cost 2 bytes a parameter to save one pass over the weight.
inline bool cast_weights_once(int64_t casts) { return casts > 2; }
// Why a GPU of compute capability major.minor cannot train in FP8 with `scaling` ("" when it can:
// Hopper, 9.0, and later; block scaling Hopper only, whose cuBLASLt has the 1 x 128 and
// 128 x 128 block-scaled GEMMs), with what to set instead. A function of the capability alone,
// so that it is tested off the GPU.
std::string gpu_refusal(int major, int minor, Scaling scaling = Scaling::tensor);
// The cast kernels' contract on n values: out[i] = encode(in[i] * scale).
void quantize(uint8_t* out, const float* in, int64_t n, float scale, Format f);

// Block scaling's operands. An operand (M, K), row-major (K-major, as Hopper's FP8 GEMMs take
// it), has tiles of 1 x 128 (blocks false) or 128 x 128 (blocks true), the last ones cut short at
// its edges. Its inverse scales (1 / scale, what the GEMM multiplies by) sit where cuBLASLt reads
// them: 1 x 128 tiles (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) at [k / 128][m], M-fastest;
// 128 x 128 blocks (BLK128x128_32F) at [m / 128][k / 128] with each row of blocks padded to a
// multiple of 4 with zeros. tile_scales: how many floats that takes.
inline int64_t tile_scales(int64_t M, int64_t K, bool blocks) {
  const int64_t kb = (K + 127) / 128;
  return blocks ? (M + 127) / 128 * ((kb + 3) / 4 * 4) : M * kb;
}
// A WeightCast's scales for a weight (OC, IC): per tensor one cast's scalars; per block both
// layouts' blocks, W^T's from a 64-byte boundary (where cuBLASLt reads scales).
inline int64_t weight_cast_t_offset(int64_t OC, int64_t IC) { return aligned_floats(tile_scales(OC, IC, true)); }
inline int64_t weight_cast_floats(int64_t OC, int64_t IC, Scaling s, int64_t ranks) {
  return s == Scaling::block ? weight_cast_t_offset(OC, IC) + aligned_floats(tile_scales(IC, OC, true))
                             : kept_floats(ranks);
}
// The bytes of a WeightCast for a weight (OC, IC): W and W^T, one byte an element, and the scales.
inline int64_t weight_cast_bytes(int64_t OC, int64_t IC, Scaling s, int64_t ranks) {
  return 2 * OC * IC + 4 * weight_cast_floats(OC, IC, s, ranks);
}
// The block cast's contract (the host emulation the kernel is tested against): out[m][k] =
// encode(x[m][k] * s), s = scale_for(the amax of x's tile holding (m, k)); inv (tile_scales
// floats) = 1 / s of each tile, laid out as above.
void quantize_tiles(uint8_t* out, float* inv, const float* x, int64_t M, int64_t K, bool blocks, Format f);

}  // namespace myriad::fp8
