// Llama 3.1's "llama3" scaling, as Hugging Face transformers computes it: with
// L = original_max_positions and wavelength w = 2 pi / f of a default frequency f,
// - w < L / high_freq_factor (fast pairs, many turns within the original context): f as is;
// - w > L / low_freq_factor (slow pairs, less than one turn in it): f / factor, i.e. positions
//   interpolated into the range the model was trained on;
// - in between: (1 - a) f / factor + a f with a = (L / w - low) / (high - low), which runs from
//   0 at the slow end to 1 at the fast one, so the result is continuous in w.
#include "ops/rope.h"

#include <cmath>
#include <numbers>
#include <stdexcept>

namespace myriad {

std::vector<double> rope_frequencies(double theta, int D, const RopeScaling& s) {
  if (!(theta > 0) || !std::isfinite(theta))
    throw std::invalid_argument("rope theta must be a positive number");
  if (D <= 0 || D % 2 != 0) throw std::invalid_argument("rope head size must be even and positive");
  const bool llama3 = s.type == "llama3";
  if (!llama3 && !s.type.empty())
    throw std::invalid_argument("unknown rope scaling type '" + s.type + "' (none or llama3)");
  if (llama3 && (!(s.factor > 0) || !(s.high_freq_factor > s.low_freq_factor) ||
                 !(s.low_freq_factor > 0) || s.original_max_positions <= 0))
    throw std::invalid_argument(
        "llama3 rope scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
        "original_max_positions > 0");

  std::vector<double> freqs(static_cast<size_t>(D / 2));
  for (int i = 0; i < D / 2; ++i) {
    // pow of the exact exponent rather than repeated division: no drift along i.
    const double f = std::pow(theta, -2.0 * i / D);
    if (!llama3) {
      freqs[i] = f;
      continue;
    }
    const double L = static_cast<double>(s.original_max_positions);
    const double wavelength = 2 * std::numbers::pi / f;
    if (wavelength < L / s.high_freq_factor) {
      freqs[i] = f;
    } else if (wavelength > L / s.low_freq_factor) {
      freqs[i] = f / s.factor;
    } else {
      const double a =
          (L / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      freqs[i] = (1 - a) * f / s.factor + a * f;
    }
  }
  return freqs;
}

}  // namespace myriad
