// cuBLASLt, loaded at its first call (dlopen), not when a process starts.
//
// Why: linked the usual way, libcublasLt runs its static initializers in every process that
// holds the binary, about 0.3 s and 220 MB on the 2-core dev machine, though most of Myriad's
// processes never multiply on a GPU: the launcher, the node agents, CPU runs, every `myriad`
// command a test starts. A worker restarted after a fault paid it too, before its first step
// (docs/RELIABILITY.md, Structure III's chaos runs).
//
// How: the functions below are the ones Myriad calls, defined here with cublasLt.h's own
// declarations (a mismatch does not compile), each forwarding to the library's symbol, looked
// up once. The library is the major version the headers are from; the GPU image provides it
// (scripts/stage_device.sh leaves the CUDA libraries out). A function not listed here fails to
// link, which is where a new one gets its line.
#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace {

const std::string& library_name() {
  static const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
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

// One forwarding definition per function: `name(params)` calls the library's `name(args)`.
#define MYRIAD_CUBLASLT(ret, name, params, args)                     \
  ret name params {                                                  \
    static const auto f = symbol<decltype(&::name)>(#name);           \
    return f args;                                                   \
  }

extern "C" {

MYRIAD_CUBLASLT(size_t, cublasLtGetVersion, (void), ())
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), (handle))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmul,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                 cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                 const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                 const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSize, cudaStream_t stream),
                (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspaceSize,
                 stream))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmulAlgoCheck,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                 cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                 const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result),
                (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, algo, result))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
                (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                 cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                 cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                 cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
                (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount, heuristicResultsArray,
                 returnAlgoCount))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmulDescCreate,
                (cublasLtMatmulDesc_t * desc, cublasComputeType_t computeType, cudaDataType_t scaleType),
                (desc, computeType, scaleType))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmulDescSetAttribute,
                (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t sizeInBytes),
                (desc, attr, buf, sizeInBytes))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
                (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                 size_t sizeInBytes),
                (pref, attr, buf, sizeInBytes))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatrixLayoutCreate,
                (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
                (layout, type, rows, cols, ld))
MYRIAD_CUBLASLT(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))

}  // extern "C"
