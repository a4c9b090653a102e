#include "model/cuda/matmul.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "model/cuda/cuda_check.h"

namespace myriad::cuda {
namespace {

// What picks an algorithm: sizes, transposes, leading dimensions, epilogue, fp32 output, and the
// alignments of A, B and D.
struct Key {
  int m, n, k;
  bool ta, tb;
  int lda, ldb, epi;
  bool f32;
  uint32_t align_a, align_b, align_d;
  int type_a, type_b;  // cudaDataType_t: bf16, or an FP8 format
  bool fast_accum;
  int scale_a, scale_b;  // cublasLtMatmulMatrixScale_t: per tensor (0), or block scaling's
  auto tie() const {
    return std::tie(m, n, k, ta, tb, lda, ldb, epi, f32, align_a, align_b, align_d, type_a, type_b, fast_accum,
                    scale_a, scale_b);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
  std::string text() const {
    std::ostringstream s;
    s << m << ' ' << n << ' ' << k << ' ' << ta << ' ' << tb << ' ' << lda << ' ' << ldb << ' ' << epi << ' ' << f32
      << ' ' << align_a << ' ' << align_b << ' ' << align_d << ' ' << type_a << ' ' << type_b << ' ' << fast_accum;
    if (scale_a || scale_b) s << ' ' << scale_a << ' ' << scale_b;
    return s.str();
  }
};

// The process's choices, shared by every Matmul, and the file they persist in (empty: none).
struct Choices {
  std::mutex mu;
  std::map<Key, cublasLtMatmulAlgo_t> algos;
  std::string path, header;
  bool loaded = false;
};
}  // namespace

struct Matmul::LocalChoices {
  std::map<Key, cublasLtMatmulAlgo_t> algos;
};

namespace {
Choices& choices() {
  static Choices c;
  return c;
}

// "cublasLt <version> <device>": choices saved under another library or device are not reused.
std::string header_line() {
  int dev = 0;
  cudaDeviceProp p{};
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&p, dev);
  std::string name = p.name;
  std::replace(name.begin(), name.end(), ' ', '_');
  return "cublasLt " + std::to_string(cublasLtGetVersion()) + " " + name;
}

// Reads the saved choices once (lines "<key> : <8 words of the algorithm, hex>").
void load_choices(Choices& c) {
  if (c.loaded) return;
  c.loaded = true;
  if (c.path.empty()) return;
  c.header = header_line();
  std::ifstream in(c.path);
  std::string line;
  if (!std::getline(in, line) || line != c.header) return;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    Key k{};
    std::string colon;
    if (!(s >> k.m >> k.n >> k.k >> k.ta >> k.tb >> k.lda >> k.ldb >> k.epi >> k.f32 >> k.align_a >> k.align_b >>
          k.align_d >> colon))
      continue;
    // Lines written before FP8 end their key here (bf16 operands); later ones add the types, and
    // block scaling's the scale modes.
    k.type_a = k.type_b = CUDA_R_16BF, k.fast_accum = false, k.scale_a = k.scale_b = 0;
    if (colon != ":" && !(std::istringstream(colon) >> k.type_a && s >> k.type_b >> k.fast_accum >> colon))
      continue;
    if (colon != ":" && !(std::istringstream(colon) >> k.scale_a && s >> k.scale_b >> colon && colon == ":")) continue;
    cublasLtMatmulAlgo_t algo{};
    bool ok = true;
    for (uint64_t& w : algo.data) ok = ok && static_cast<bool>(s >> std::hex >> w);
    if (ok) c.algos[k] = algo;
  }
}

void save_choices(const Choices& c) {
  if (c.path.empty()) return;
  const std::string tmp = c.path + ".tmp";
  {
    std::ofstream out(tmp);
    out << c.header << "\n";
    for (const auto& [k, algo] : c.algos) {
      out << k.text() << " :" << std::hex;
      for (uint64_t w : algo.data) out << ' ' << w;
      out << std::dec << "\n";
    }
    if (!out) return;  // a full disk costs a retune at the next start, nothing more
  }
  std::rename(tmp.c_str(), c.path.c_str());
}

}  // namespace

Matmul::Matmul() {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  // 32 MiB: what cuBLASLt's Hopper kernels ask for at most.
  workspace_bytes_ = 32u << 20;
  reduction_mask_ = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE |
                    CUBLASLT_REDUCTION_SCHEME_NONE;
  // The debug switches, read once here (docs/CONFIG.md): measuring, never training.
  if (const char* k = std::getenv("MYRIAD_SPLITK")) {
    if (std::string(k) == "none") reduction_mask_ = CUBLASLT_REDUCTION_SCHEME_NONE;
    if (std::string(k) == "any") reduction_mask_ = CUBLASLT_REDUCTION_SCHEME_MASK;
  }
  const char* tune = std::getenv("MYRIAD_GEMM_TUNE");
  tune_ = !(tune && std::string(tune) == "0");
  const char* report = std::getenv("MYRIAD_GEMM_REPORT");
  report_ = report && std::string(report) == "1";
  CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

void Matmul::forget_shapes() {
  tune_ = false, remember_ = false;
  if (!local_) local_ = std::make_unique<LocalChoices>();
}

Matmul::~Matmul() {
  cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

#if CUBLAS_VERSION >= 120900  // cuBLAS 12.9 brought the block-scaled modes
namespace {
int32_t scale_mode(Matmul::Scales s) {
  return s == Matmul::Scales::kBlocks  ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
         : s == Matmul::Scales::kTiles ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                       : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}
}  // namespace
#endif

void Matmul::describe_fp8(cublasLtMatmulDesc_t desc, const Fp8Operands& fp8, int32_t& scale_a, int32_t& scale_b) {
  const int8_t fast_accum = fp8.fast_accum ? 1 : 0;
  const bool blockwise = fp8.a_scales != Scales::kTensor || fp8.b_scales != Scales::kTensor;
  MYRIAD_CHECK(!blockwise || (fp8.a_scales != Scales::kTensor && fp8.b_scales != Scales::kTensor &&
                              !(fp8.a_scales == Scales::kBlocks && fp8.b_scales == Scales::kBlocks) && !fast_accum),
               "cuBLASLt FP8: block scaling takes tiles by blocks, blocks by tiles or tiles by tiles, without fast "
               "accumulation");
  if (blockwise) {
#if CUBLAS_VERSION >= 120900
    scale_a = scale_mode(fp8.a_scales), scale_b = scale_mode(fp8.b_scales);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &scale_a, sizeof scale_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &scale_b, sizeof scale_b));
#else
    throw_input("train.fp8_scaling = \"block\" needs cuBLAS 12.9 or later (its block-scaled GEMMs); this build has ",
                CUBLAS_VERSION, ": use train.fp8_scaling = \"tensor\"");
#endif
  }
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &fp8.a_inv_scale,
                                              sizeof fp8.a_inv_scale));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &fp8.b_inv_scale,
                                              sizeof fp8.b_inv_scale));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum));
}

void Matmul::gemm(void* d, cudaDataType_t d_type, const void* a, bool trans_a, int lda,
                  const void* b, bool trans_b, int ldb, int m, int n, int k, float beta,
                  const bf16* bias, cudaStream_t stream, cublasLtEpilogue_t epi, const void* aux,
                  const Fp8Operands* fp8) {
  cublasLtMatmulDesc_t desc;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cudaDataType_t type_a = CUDA_R_16BF, type_b = CUDA_R_16BF;
  int32_t scale_a = 0, scale_b = 0;  // cublasLtMatmulMatrixScale_t: 0 per tensor, as before cuBLAS 12.9
  if (fp8) {
    // Hopper's FP8 GEMMs take A transposed and B not (both K-major), with per-tensor scales that
    // multiply the product back: D = (a_inv b_inv) A B.
    MYRIAD_CHECK(trans_a && !trans_b, "cuBLASLt FP8: A must be transposed and B not (both K-major)");
    type_a = fp8->a_type, type_b = fp8->b_type;
    describe_fp8(desc, *fp8, scale_a, scale_b);
  }
  cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (bias) {
    if (epi == CUBLASLT_EPILOGUE_DEFAULT) epi = CUBLASLT_EPILOGUE_BIAS;
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX) epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    cudaDataType_t bias_type = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  if (epi != CUBLASLT_EPILOGUE_DEFAULT)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (aux) {
    const int64_t ld = m;
    cudaDataType_t aux_type = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof aux_type));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type_a, trans_a ? k : m, trans_a ? m : k, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type_b, trans_b ? n : k, trans_b ? k : n, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, m));

  // Parameters sit at arbitrary offsets of the flat buffers: tell the heuristic the alignment
  // the pointers really have (it assumes 256 bytes otherwise).
  auto alignment = [](const void* p) {
    uint32_t a = 256;
    while (a > 2 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
    return a;
  };
  const uint32_t align_a = alignment(a), align_b = alignment(b), align_d = alignment(d);
  const Key key{m,       n,       k,       trans_a,           trans_b,           lda, ldb, static_cast<int>(epi),
                d_type == CUDA_R_32F, align_a, align_b, align_d, static_cast<int>(type_a), static_cast<int>(type_b),
                fp8 && fp8->fast_accum, scale_a, scale_b};
  const float alpha = 1.0f;
  Choices& c = choices();
  std::unique_lock<std::mutex> lock(c.mu);
  load_choices(c);
  // forget_shapes(): this Matmul's own choices, the heuristic's first, kept in memory only.
  std::map<Key, cublasLtMatmulAlgo_t>& algos = remember_ ? c.algos : local_->algos;
  auto it = algos.find(key);
  if (remember_ && it != algos.end()) {  // a saved choice must still be one this library runs
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(handle_, desc, la, lb, ld, ld, &it->second, &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > workspace_bytes_) {
      algos.erase(it);
      it = algos.end();
    }
  }
  if (it == algos.end()) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes_, sizeof workspace_bytes_));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d));
    // Split-K only with a reduction in the workspace, which adds the K slices in a fixed order;
    // the in-place scheme adds them into D in whatever order they finish. MYRIAD_SPLITK=none
    // (no split-K) or =any (cuBLASLt's choice) are for measuring.
    const uint32_t reduction = reduction_mask_;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction));
    const int wanted = tune_ ? 8 : 1;
    cublasLtMatmulHeuristicResult_t results[8];
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc, la, lb, ld, ld, pref, wanted, results, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0)
      throw_runtime("cuBLASLt: no algorithm for a ", m, "x", n, "x", k,
                    scale_a ? " block-scaled FP8 GEMM (it needs a Hopper GPU and cuBLAS 12.9 or later; train.fp8_scaling "
                              "= \"tensor\" does not)"
                            : fp8 ? " FP8 GEMM" : " bf16 GEMM");
    int best = 0;
    if (found > 1) {
      // Timed on this call's operands; a call that accumulates (beta 1) writes a scratch output
      // instead, so that its D is untouched. Each candidate: one run to warm up, then 3.
      void* out = d;
      if (beta != 0.0f && cudaMalloc(&out, size_t(m) * n * (d_type == CUDA_R_32F ? 4 : 2)) != cudaSuccess) {
        cudaGetLastError();
        out = nullptr;
      }
      if (out) {
        cudaEvent_t t0, t1;
        CUDA_CHECK(cudaEventCreate(&t0));
        CUDA_CHECK(cudaEventCreate(&t1));
        float best_ms = 1e30f, first_ms = 0;
        for (int i = 0; i < found; ++i) {
          if (cublasLtMatmul(handle_, desc, &alpha, a, la, b, lb, &beta, out, ld, out, ld, &results[i].algo,
                             workspace_, workspace_bytes_, stream) != CUBLAS_STATUS_SUCCESS)
            continue;
          CUDA_CHECK(cudaEventRecord(t0, stream));
          for (int r = 0; r < 3; ++r)
            cublasLtMatmul(handle_, desc, &alpha, a, la, b, lb, &beta, out, ld, out, ld, &results[i].algo, workspace_,
                           workspace_bytes_, stream);
          CUDA_CHECK(cudaEventRecord(t1, stream));
          CUDA_CHECK(cudaEventSynchronize(t1));
          float ms = 0;
          CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
          if (i == 0) first_ms = ms;
          if (ms < best_ms) best_ms = ms, best = i;
        }
        if (report_)
          log::info("gemm ", m, "x", n, "x", k, fp8 ? " fp8" : "", (trans_a ? " T" : " N"), (trans_b ? "T" : "N"), " epilogue ",
                    static_cast<int>(epi), d_type == CUDA_R_32F ? " fp32 out" : "", ": ", found,
                    " candidates, the heuristic's first ", first_ms / 3, " ms, the fastest (#", best, ") ",
                    best_ms / 3, " ms = ", 2.0 * m * n * k / (best_ms / 3 * 1e-3) / 1e12, " TFLOP/s");
        cudaEventDestroy(t0);
        cudaEventDestroy(t1);
        if (out != d) cudaFree(out);
      }
    }
    if (remember_) {
      it = c.algos.emplace(key, results[best].algo).first;
      save_choices(c);
    } else {
      if (algos.size() >= 4096) algos.clear();  // rows change every step: a bound, not a leak
      it = algos.emplace(key, results[best].algo).first;
    }
  }
  const cublasLtMatmulAlgo_t algo = it->second;
  lock.unlock();
  if (const cublasStatus_t status = cublasLtMatmul(handle_, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algo,
                                                   workspace_, workspace_bytes_, stream);
      status != CUBLAS_STATUS_SUCCESS)
    throw_runtime("cuBLASLt: a ", m, "x", n, "x", k, fp8 ? " FP8" : " bf16", " GEMM (types ", static_cast<int>(type_a),
                  "/", static_cast<int>(type_b), ", ", trans_a ? "T" : "N", trans_b ? "T" : "N", ", beta ", beta,
                  ", epilogue ", static_cast<int>(epi), ", alignments A ", align_a, " B ", align_b, " D ", align_d,
                  fp8 ? cat(" scales ", alignment(fp8->a_inv_scale), "/", alignment(fp8->b_inv_scale)) : std::string(),
                  ") failed with status ", static_cast<int>(status));
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

// Row-major (R,C) buffers are column-major (C,R): each product below is written for cuBLAS's
// column-major view of the same memory.
void Matmul::forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int N,
                     int IC, int OC, cudaStream_t stream) {
  // out^T (OC,N) = W (OC,IC) . inp^T (IC,N); W's memory is (IC,OC) column-major: transpose it.
  gemm(out, CUDA_R_16BF, weight, true, IC, inp, false, IC, OC, N, IC, 0.0f, bias, stream);
}

void Matmul::forward_f32(float* out, const bf16* inp, const bf16* weight, int N, int IC, int OC,
                         cudaStream_t stream) {
  gemm(out, CUDA_R_32F, weight, true, IC, inp, false, IC, OC, N, IC, 0.0f, nullptr, stream);
}

void Matmul::forward_gelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight,
                          const bf16* bias, int N, int IC, int OC, cudaStream_t stream) {
  gemm(out, CUDA_R_16BF, weight, true, IC, inp, false, IC, OC, N, IC, 0.0f, bias, stream,
       CUBLASLT_EPILOGUE_GELU_AUX, pre);
}

void Matmul::backward_input_dgelu(bf16* dpre, const bf16* dout, const bf16* weight,
                                  const bf16* pre, int N, int IC, int OC, cudaStream_t stream) {
  gemm(dpre, CUDA_R_16BF, weight, false, IC, dout, false, OC, IC, N, OC, 0.0f, nullptr, stream,
       CUBLASLT_EPILOGUE_DGELU, pre);
}

void Matmul::backward_input(bf16* dinp, const bf16* dout, const bf16* weight, int N, int IC,
                            int OC, bool accumulate, cudaStream_t stream) {
  // dinp^T (IC,N) = W^T (IC,OC) . dout^T (OC,N)
  gemm(dinp, CUDA_R_16BF, weight, false, IC, dout, false, OC, IC, N, OC, accumulate ? 1.0f : 0.0f,
       nullptr, stream);
}

void Matmul::backward_weight(float* dweight, const bf16* dout, const bf16* inp, int N, int IC,
                             int OC, cudaStream_t stream) {
  // dW^T (IC,OC) += inp^T (IC,N) . dout (N,OC)
  gemm(dweight, CUDA_R_32F, inp, false, IC, dout, true, OC, IC, OC, N, 1.0f, nullptr, stream);
}

// FP8: the same products as above, each operand K-major (Hopper's FP8 GEMMs take no other
// layout), so the backward takes the transposed copies that cast_fp8 writes.
namespace {
cudaDataType_t fp8_type(fp8::Format f) { return f == fp8::Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
}  // namespace

void Matmul::forward_fp8(bf16* out, const Fp8Tensor& inp, const Fp8Tensor& weight, const bf16* bias, int N, int IC,
                         int OC, bool fast_accum, cudaStream_t stream) {
  // out^T (OC,N) = W (OC,IC) . inp^T (IC,N): W's bytes (IC,OC) column-major, transposed.
  const Fp8Operands ops{fp8_type(weight.format), fp8_type(inp.format), weight.inv_scale, inp.inv_scale, fast_accum,
                       weight.scales, inp.scales};
  gemm(out, CUDA_R_16BF, weight.data, true, IC, inp.data, false, IC, OC, N, IC, 0.0f, bias, stream,
       CUBLASLT_EPILOGUE_DEFAULT, nullptr, &ops);
}

void Matmul::backward_input_fp8(bf16* dinp, const Fp8Tensor& dout, const Fp8Tensor& weight_t, int N, int IC, int OC,
                                bool accumulate, cudaStream_t stream) {
  // dinp^T (IC,N) = W^T (IC,OC) . dout^T (OC,N): W^T's bytes (OC,IC) column-major, transposed.
  const Fp8Operands ops{fp8_type(weight_t.format), fp8_type(dout.format), weight_t.inv_scale, dout.inv_scale, false,
                       weight_t.scales, dout.scales};
  gemm(dinp, CUDA_R_16BF, weight_t.data, true, OC, dout.data, false, OC, IC, N, OC, accumulate ? 1.0f : 0.0f,
       nullptr, stream, CUBLASLT_EPILOGUE_DEFAULT, nullptr, &ops);
}

void Matmul::backward_weight_fp8(float* dweight, const Fp8Tensor& dout_t, const Fp8Tensor& inp_t, int N, int IC,
                                 int OC, cudaStream_t stream) {
  // dW^T (IC,OC) += inp^T (IC,N) . dout (N,OC): inp^T's bytes (N,IC) column-major, transposed;
  // dout^T's bytes (N,OC) column-major as they are.
  const Fp8Operands ops{fp8_type(inp_t.format), fp8_type(dout_t.format), inp_t.inv_scale, dout_t.inv_scale, false,
                       inp_t.scales, dout_t.scales};
  gemm(dweight, CUDA_R_32F, inp_t.data, true, N, dout_t.data, false, N, IC, OC, N, 1.0f, nullptr, stream,
       CUBLASLT_EPILOGUE_DEFAULT, nullptr, &ops);
}

void persist_gemm_choices(const std::string& path) {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.path == path) return;
  c.path = path, c.loaded = false;  // read at the next GEMM
}

}  // namespace myriad::cuda
