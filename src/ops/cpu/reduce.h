// Reductions shared by the model (TP gradient norms) and the optimizers.
#pragma once

#include <cstdint>

namespace myriad::cpu {

// sum(x^2) in double over fixed chunks whose partial sums are added in chunk order: bitwise the
// same whatever the number of threads.
double sum_squares(const float* x, int64_t n);

}  // namespace myriad::cpu
