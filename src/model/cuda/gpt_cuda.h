// The GPT on one GPU: bf16 activations and compute weights, fp32 master weights, gradients
// and optimizer state, cuBLASLt GEMMs, flash attention, fused kernels (ops/cuda/ops.cuh).
// Same model, same canonical layout, same semantics as the CPU backend, which is its oracle.
#pragma once

#include <memory>

#include "core/config.h"
#include "model/engine.h"

namespace myriad {

// GPUs visible to this process (0 when the driver or device is missing).
int cuda_device_count();
// Makes GPU `index` this process's device (before any allocation or communicator).
void cuda_use_device(int index);

// The CUDA engine for cfg on the current device. Allocates everything up front: parameters,
// gradients, optimizer state and the activations of one micro-batch: every layer's, or with
// train.recompute = selective / full fewer, the rest recomputed in backward (the gradients are
// bitwise those of "none"). Logs the mode and the activation bytes it planned.
std::unique_ptr<Engine> make_cuda_engine(const Config& cfg);

}  // namespace myriad
