// AdamW and LAMB on the GPU over the owned ranges of the flat buffer: optim/optimizer.h's
// contract, with the fp32 master weights, gradients and moments in device memory and the fused
// kernels of ops/cuda (one launch per owned range). m() and v() are host copies for checkpoints,
// made current by state_to_host() and installed by state_from_host().
//
// LAMB's trust ratios need each tensor's norms over every rank that holds part of it: the
// per-piece sums of squares come to the host once per step, are completed by the NormReducer
// (in double), and go back as the apply pass's per-piece norms.
#pragma once

#include <cuda_bf16.h>

#include <memory>
#include <vector>

#include "optim/optimizer.h"

namespace myriad::cuda {

class CudaOps;

// The optimizer for cfg.name on ops' device and stream; `owned` and `reduce` as make_optimizer's.
// compute (the flat buffer's bf16 copy the kernels read, or null): the update rewrites its owned
// ranges in the same pass.
std::unique_ptr<Optimizer> make_optimizer(const CudaOps& ops, const OptimConfig& cfg,
                                          const ParamLayout& layout, std::vector<FlatRange> owned,
                                          NormReducer reduce, __nv_bfloat16* compute);

}  // namespace myriad::cuda
