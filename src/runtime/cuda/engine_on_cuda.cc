// The one step and its pipeline executor on the CUDA op set.
#include "model/cuda/cuda_ops.h"
#include "model/cuda/matmul.h"
#include "model/gpt.h"
#include "optim/cuda/cuda_optimizer.h"
#include "runtime/engine.h"
#include "runtime/model_engine.h"
#include "runtime/pipeline_impl.h"

namespace myriad {

extern template class GptModel<cuda::CudaOps>;  // model/cuda/gpt_on_cuda.cc
template class Pipeline<GptModel<cuda::CudaOps>>;
template class ModelEngine<cuda::CudaOps>;

std::unique_ptr<Engine> make_cuda_model_engine(const Config& cfg, const parallel::ParallelContext* parallel,
                                               const std::string& gemm_choices) {
  cuda::persist_gemm_choices(gemm_choices);
  return std::make_unique<ModelEngine<cuda::CudaOps>>(cfg, parallel);
}

}  // namespace myriad
