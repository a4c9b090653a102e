// cuBLASLt is loaded at its first call, not when a process starts (model/cuda/cublaslt_library.cc):
// a process that never multiplies on a GPU never maps the library, and the calls reach the real
// library, its errors included. No GPU is needed: these calls build host-side descriptors only.
#include <gtest/gtest.h>

#if MYRIAD_HAVE_CUDA
#include <cublasLt.h>

#include <fstream>
#include <string>

namespace {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(library) != std::string::npos) return true;
  return false;
}

TEST(CublasLtLibrary, IsLoadedAtItsFirstCallNotAtStart) {
  EXPECT_FALSE(mapped("libcublasLt.so")) << "the library was mapped before any call";
  const size_t version = cublasLtGetVersion();
  EXPECT_TRUE(mapped("libcublasLt.so"));
  EXPECT_EQ(version / 10000, size_t(CUBLAS_VER_MAJOR)) << "loaded cuBLASLt " << version;
}

TEST(CublasLtLibrary, ForwardsDescriptorsAndTheLibrarysOwnErrors) {
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  ASSERT_NE(desc, nullptr);
  const int32_t transpose = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
            CUBLAS_STATUS_SUCCESS);
  // A buffer of the wrong size: the library itself refuses it.
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, 1),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);

  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, 64), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);

  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const size_t workspace = 1 << 20;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                 sizeof workspace),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
#endif  // MYRIAD_HAVE_CUDA
