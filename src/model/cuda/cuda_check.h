// Checks for CUDA runtime and cuBLASLt calls: a failure becomes a runtime Error carrying the
// call and file:line (a GPU fault is worth a restart; the driver decides).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess)                                                                 \
      ::myriad::throw_runtime("CUDA: ", #call, " failed at ", __FILE__, ":", __LINE__, ": ", \
                              cudaGetErrorString(e_));                                     \
  } while (0)

#define CUBLAS_CHECK(call)                                                                 \
  do {                                                                                     \
    cublasStatus_t s_ = (call);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::myriad::throw_runtime("cuBLASLt: ", #call, " failed at ", __FILE__, ":", __LINE__,  \
                              ": status ", static_cast<int>(s_));                          \
  } while (0)
