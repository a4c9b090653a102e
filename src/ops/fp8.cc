#include "ops/fp8.h"

#include <algorithm>
#include <cmath>

#include "core/config.h"
#include "core/error.h"

namespace myriad::fp8 {
namespace {

struct Layout {
  int man;     // mantissa bits
  int bias;    // exponent bias
  float max;   // largest finite value
  int min_e;   // exponent of the smallest normal, 1 - bias
  uint8_t max_byte;
};

Layout layout(Format f) {
  return f == Format::e4m3 ? Layout{3, 7, 448.0f, -6, 0x7e} : Layout{2, 15, 57344.0f, -14, 0x7b};
}

}  // namespace

float max_finite(Format f) { return layout(f).max; }

uint8_t encode(float x, Format f) {
  const Layout l = layout(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  const float a = std::fabs(x);
  if (a >= l.max) return sign | l.max_byte;
  // The spacing of representable values around a: 2^(e - man) in the binade [2^e, 2^(e+1)),
  // and the subnormals' fixed spacing below the smallest normal. a / quantum is exact (a power of
  // two), so rounding it to an integer, ties to even, is rounding a to the format.
  const int e = a == 0 ? l.min_e : std::max(std::ilogb(a), l.min_e);
  const float quantum = std::ldexp(1.0f, e - l.man);
  const float v = std::nearbyint(a / quantum) * quantum;  // the default rounding: ties to even
  if (v < std::ldexp(1.0f, l.min_e)) return sign | static_cast<uint8_t>(v / std::ldexp(1.0f, l.min_e - l.man));
  const int ve = std::ilogb(v);  // rounding may carry into the next binade
  const int mantissa = static_cast<int>(std::ldexp(v, l.man - ve)) - (1 << l.man);
  return sign | static_cast<uint8_t>(((ve + l.bias) << l.man) | mantissa);
}

float decode(uint8_t q, Format f) {
  const Layout l = layout(f);
  const float sign = (q & 0x80) ? -1.0f : 1.0f;
  const int bits = q & 0x7f, field = bits >> l.man, mantissa = bits & ((1 << l.man) - 1);
  if (f == Format::e4m3 && bits == 0x7f) return NAN;
  if (f == Format::e5m2 && field == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (field == 0) return sign * std::ldexp(static_cast<float>(mantissa), l.min_e - l.man);
  return sign * std::ldexp(static_cast<float>((1 << l.man) | mantissa), field - l.bias - l.man);
}

namespace {
const char* name(Format f) { return f == Format::e4m3 ? "e4m3" : "e5m2"; }
}  // namespace

Recipe recipe_of(const TrainConfig& t) {
  MYRIAD_CHECK(t.fp8_gradients == "e4m3" || t.fp8_gradients == "e5m2", "train.fp8_gradients = \"", t.fp8_gradients,
               "\" passed the config's validation");
  Recipe r;
  MYRIAD_CHECK(t.fp8_scaling == "tensor" || t.fp8_scaling == "block", "train.fp8_scaling = \"", t.fp8_scaling,
               "\" passed the config's validation");
  r.gradient = t.fp8_gradients == "e4m3" ? Format::e4m3 : Format::e5m2;
  r.scaling = t.fp8_scaling == "block" ? Scaling::block : Scaling::tensor;
  r.fast_accum = t.fp8_fast_accum;
  r.lm_head = t.fp8_lm_head;
  return r;
}

std::string describe(const Recipe& r) {
  return std::string("the block's linear GEMMs") + (r.lm_head ? " and the LM head's" : "") +
         " in FP8 (activations and weights " + name(r.forward) + ", gradients " + name(r.gradient) +
         (r.scaling == Scaling::block
              ? "; block scaling (1 x 128 tiles of activations and gradients, 128 x 128 blocks of weights), each "
                "tile's scale a power of two from its amax; "
              : "; per-tensor current scaling by a power of two from each operand's amax, over the tensor-parallel "
                "group; ") +
         (r.fast_accum ? "fast accumulation in the forward" : "no fast accumulation") + ")" +
         (r.lm_head ? "" : "; the LM head in bf16") + "; attention, the norms and the update in bf16/fp32";
}

std::string gpu_refusal(int major, int minor, Scaling scaling) {
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  if (major < 9)
    return "train.precision = \"fp8\": the GPU's compute capability is " + cc +
           ": FP8 training needs a Hopper GPU (9.0) or later; use train.precision = \"bf16\"";
  if (scaling == Scaling::block && major != 9)
    return "train.fp8_scaling = \"block\" takes cuBLASLt's 1 x 128 and 128 x 128 block-scaled GEMMs, which Hopper "
           "(9.x) has and the GPU's compute capability " + cc + " does not; use train.fp8_scaling = \"tensor\"";
  return "";
}

void quantize(uint8_t* out, const float* in, int64_t n, float scale, Format f) {
  for (int64_t i = 0; i < n; ++i) out[i] = encode(in[i] * scale, f);
}

void quantize_tiles(uint8_t* out, float* inv, const float* x, int64_t M, int64_t K, bool blocks, Format f) {
  const int64_t tm = blocks ? 128 : 1, kb = (K + 127) / 128, row = (kb + 3) / 4 * 4;
  std::fill(inv, inv + tile_scales(M, K, blocks), 0.0f);  // the blocks' padding
  for (int64_t m0 = 0; m0 < M; m0 += tm)
    for (int64_t k0 = 0; k0 < K; k0 += 128) {
      const int64_t m1 = std::min(m0 + tm, M), k1 = std::min(k0 + 128, K);
      float amax = 0;  // a NaN makes it NaN, and scale_for NaN, as the device's infinite amax does
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t k = k0; k < k1; ++k) {
          const float a = std::fabs(x[m * K + k]);
          amax = std::isnan(a) || std::isnan(amax) ? NAN : std::max(amax, a);
        }
      const float s = scale_for(amax, f);
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t k = k0; k < k1; ++k) out[m * K + k] = encode(x[m * K + k] * s, f);
      inv[blocks ? m0 / 128 * row + k0 / 128 : k0 / 128 * M + m0] = 1.0f / s;
    }
}

}  // namespace myriad::fp8
