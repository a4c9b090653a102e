// Choosing and building the Engine for a config (train.device: auto, cpu, cuda).
#pragma once

#include <memory>

#include "core/config.h"
#include "model/engine.h"

namespace myriad {

// auto picks CUDA when this build has it and a GPU is visible, else the CPU. cuda without a
// GPU (or in a build without CUDA) is an input error.
std::unique_ptr<Engine> make_engine(const Config& cfg);

// Whether this build can run on a GPU here.
bool cuda_available();

}  // namespace myriad
