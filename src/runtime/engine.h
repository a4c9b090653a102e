// Choosing and building the Engine for a config (train.device: auto, cpu, cuda).
#pragma once

#include <memory>

#include "core/config.h"
#include "model/engine.h"

namespace myriad {

namespace parallel {
struct ParallelContext;
}

// auto picks CUDA when this build has it and a GPU is visible, else the CPU. cuda without a
// GPU (or in a build without CUDA) is an input error.
// parallel: this rank's tensor-parallel group (nullptr = the whole model in this process). With
// a group of more than one rank the engine holds this rank's shards (layout() is the local
// layout; host_state() the local shards). With several processes on the GPU the engine is the
// one step on the CUDA op set.
// gemm_choices: the file a GPU engine keeps its GEMM algorithm choices in across restarts
// (model/cuda/matmul.h), so that a resumed run computes bit for bit as the run it continues; ""
// keeps them in memory. The CPU has no choices to keep.
std::unique_ptr<Engine> make_engine(const Config& cfg, const parallel::ParallelContext* parallel = nullptr,
                                    const std::string& gemm_choices = "");

#ifdef MYRIAD_HAVE_CUDA
// The one step (runtime/model_engine.h) on the CUDA op set, in any 3D layout, one process or
// many.
std::unique_ptr<Engine> make_cuda_model_engine(const Config& cfg, const parallel::ParallelContext* parallel,
                                               const std::string& gemm_choices);
#endif

// Each rank uses GPU local_rank % device_count (MYRIAD_LOCAL_RANK); a no-op without GPUs.
// Called before any device memory or communicator exists.
void use_local_gpu();

// Whether this build can run on a GPU here.
bool cuda_available();
// GPUs visible to this process (0 without CUDA).
int cuda_device_count_or_zero();

}  // namespace myriad
