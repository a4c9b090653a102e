// The rotation frequencies of rotary positions (RoPE), shared by the CPU and CUDA op sets so that
// both rotate by the same angles: one definition, computed once on the host in double.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// Hugging Face's `rope_scaling`, the kinds Myriad supports. The defaults are Llama 3.1's.
struct RopeScaling {
  std::string type = "";  // "" none, "llama3" (Llama 3.1's long-context scaling)
  double factor = 8;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_positions = 8192;  // HF original_max_position_embeddings
};

// freqs[i] for i < D/2: the angle per position of rotation pair i, theta^(-2i/D), then scaled as
// s says. "llama3" keeps the pairs whose wavelength 2 pi / f is shorter than
// original_max_positions / high_freq_factor, slows those longer than
// original_max_positions / low_freq_factor down by factor, and blends the two in between.
// Throws std::invalid_argument on theta <= 0, an odd or non-positive D, an unknown type or, for
// "llama3", factor <= 0 or high_freq_factor <= low_freq_factor.
std::vector<double> rope_frequencies(double theta, int D, const RopeScaling& s);

}  // namespace myriad
