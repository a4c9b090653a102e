// The process's GPU: how many are visible, which one this process uses, and whether a config
// can run on it.
#pragma once

#include <string>

#include "core/config.h"

namespace myriad {

// GPUs visible to this process (0 when the driver or device is missing).
int cuda_device_count();
// Makes GPU `index` this process's device (before any allocation or communicator).
void cuda_use_device(int index);
// Before the engine is built: the driver and cuBLASLt are new enough (a runtime fault naming
// what to update otherwise), and the model fits the CUDA kernels (an input error naming the key).
void check_cuda_config(const Config& cfg);
// Why the CUDA kernels cannot run this model (its head size, its width), or "" when they can.
std::string cuda_unsupported_model(const Config& cfg);

// A node's self-check of GPU `index` (myriad self-check): a GEMM through the training kernels
// (cuBLASLt: bf16 operands, fp32 accumulation) on small-integer operands, so that every element
// of the product is exact and checked, then 256 MiB copied to the GPU and back. Returns the
// GEMM's TFLOP/s; a runtime fault naming the GPU where it computes or stores wrongly.
double cuda_self_check(int index);

}  // namespace myriad
