#include "core/error.h"
#include "ops/cuda/ops.cuh"

namespace myriad::cuda {

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw_runtime("CUDA: ", what, ": ", cudaGetErrorString(e));
}

}  // namespace myriad::cuda
