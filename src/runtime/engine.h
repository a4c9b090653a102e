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
// layout; host_state() the local shards); that runs on the CPU engine only, with AdamW.
std::unique_ptr<Engine> make_engine(const Config& cfg,
                                    const parallel::ParallelContext* parallel = nullptr);

// Whether this build can run on a GPU here.
bool cuda_available();
// GPUs visible to this process (0 without CUDA).
int cuda_device_count_or_zero();

}  // namespace myriad
