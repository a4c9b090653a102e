// cuBLAS (not cuBLASLt), loaded at its first call (dlopen), for the one routine cuBLASLt lacks:
// the grouped GEMM of a mixture of experts' layer (cublasGemmGroupedBatchedEx, one call over
// every expert's rows, each expert its own row count). Loaded lazily for the reasons
// cublaslt_library.cc gives: most of Myriad's processes never multiply on a GPU, and a dense
// model never calls it. The functions below are the ones Myriad calls, each with cublas_v2.h's
// own declaration (a mismatch does not compile), forwarding to the library's symbol.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace {

const std::string& library_name() {
  static const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  return name;
}

void* library() {
  static void* const lib = [] {
    void* h = dlopen(library_name().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h)
      myriad::throw_runtime("cannot load ", library_name(), " (", dlerror(), "): install CUDA ", CUBLAS_VER_MAJOR,
                            "'s cuBLAS or put its folder on LD_LIBRARY_PATH");
    return h;
  }();
  return lib;
}

template <typename F>
F symbol(const char* name) {
  void* f = dlsym(library(), name);
  if (!f) myriad::throw_runtime(library_name(), " has no ", name, ": use the cuBLAS of CUDA ", CUBLAS_VER_MAJOR);
  return reinterpret_cast<F>(f);
}

}  // namespace

#define MYRIAD_CUBLAS(ret, name, params, args)                       \
  ret name params {                                                  \
    static const auto f = symbol<decltype(&::name)>(#name);           \
    return f args;                                                   \
  }

extern "C" {

MYRIAD_CUBLAS(cublasStatus_t, cublasCreate_v2, (cublasHandle_t * handle), (handle))
MYRIAD_CUBLAS(cublasStatus_t, cublasDestroy_v2, (cublasHandle_t handle), (handle))
MYRIAD_CUBLAS(cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
MYRIAD_CUBLAS(cublasStatus_t, cublasSetWorkspace_v2, (cublasHandle_t handle, void* workspace, size_t bytes),
              (handle, workspace, bytes))
MYRIAD_CUBLAS(cublasStatus_t, cublasGemmGroupedBatchedEx,
              (cublasHandle_t handle, const cublasOperation_t transa_array[], const cublasOperation_t transb_array[],
               const int m_array[], const int n_array[], const int k_array[], const void* alpha_array,
               const void* const Aarray[], cudaDataType_t Atype, const int lda_array[], const void* const Barray[],
               cudaDataType_t Btype, const int ldb_array[], const void* beta_array, void* const Carray[],
               cudaDataType_t Ctype, const int ldc_array[], int group_count, const int group_size[],
               cublasComputeType_t computeType),
              (handle, transa_array, transb_array, m_array, n_array, k_array, alpha_array, Aarray, Atype, lda_array,
               Barray, Btype, ldb_array, beta_array, Carray, Ctype, ldc_array, group_count, group_size, computeType))

}  // extern "C"
