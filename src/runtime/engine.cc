#include "runtime/engine.h"

#include <cstdlib>

#include "core/error.h"
#include "runtime/model_engine.h"
#include "runtime/pipeline_impl.h"
#ifdef MYRIAD_HAVE_CUDA
#include "model/cuda/device.h"
#endif

namespace myriad {

// The one step on the CPU op set (fp32, the oracle) and its pipeline executor.
template class Pipeline<Gpt>;
template class ModelEngine<cpu::CpuOps>;

int cuda_device_count_or_zero() {
#ifdef MYRIAD_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

bool cuda_available() {
#ifdef MYRIAD_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

void use_local_gpu() {
#ifdef MYRIAD_HAVE_CUDA
  const int gpus = cuda_device_count();
  if (gpus == 0) return;
  const char* local = std::getenv("MYRIAD_LOCAL_RANK");
  cuda_use_device((local && *local ? std::atoi(local) : 0) % gpus);
#endif
}

std::unique_ptr<Engine> make_engine(const Config& cfg, const parallel::ParallelContext* parallel,
                                    const std::string& gemm_choices) {
  const std::string& d = cfg.train.device;
  if (d == "cuda" || (d == "auto" && cuda_available())) {
#ifdef MYRIAD_HAVE_CUDA
    if (!cuda_available())
      throw_input("config: train.device = \"cuda\" but no GPU is visible; use cpu or auto");
    check_cuda_config(cfg);
    return make_cuda_model_engine(cfg, parallel, gemm_choices);
#else
    throw_input("config: train.device = \"cuda\" but this build has no CUDA (nvcc was not found "
                "at build time); use cpu or auto");
#endif
  }
  return std::make_unique<ModelEngine<cpu::CpuOps>>(cfg, parallel);
}

}  // namespace myriad
