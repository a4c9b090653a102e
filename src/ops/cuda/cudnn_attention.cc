#include "ops/cuda/cudnn_attention.h"

#if __has_include(<cudnn_graph.h>)
#define MYRIAD_HAVE_CUDNN_HEADERS 1
#include <cudnn_graph.h>
#endif

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "ops/cuda/ops.cuh"

namespace myriad::cuda::cudnn {

#ifndef MYRIAD_HAVE_CUDNN_HEADERS

bool supports(int, int, int, int, int, int, std::string* why, const QueryRanges*, bool) {
  if (why) *why = "Myriad was built without cuDNN's headers (cudnn_graph.h)";
  return false;
}
void attention_forward(__nv_bfloat16*, float*, const __nv_bfloat16*, int, int, int, int, int, int, cudaStream_t,
                       const QueryRanges*, const int32_t*) {
  throw_runtime("cuDNN attention: not built");
}
void attention_backward(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                        const float*, int, int, int, int, int, int, cudaStream_t, const QueryRanges*,
                        const int32_t*) {
  throw_runtime("cuDNN attention: not built");
}
int version() { return 0; }
void set_deterministic(bool) {}
bool deterministic() { return true; }
size_t workspace_bytes() { return 0; }

#else

namespace {

// ---- the library, loaded at run time ----

struct Api {
  size_t (*GetVersion)();
  const char* (*GetErrorString)(cudnnStatus_t);
  void (*GetLastErrorString)(char*, size_t);
  cudnnStatus_t (*Create)(cudnnHandle_t*);
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*BackendCreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*);
  cudnnStatus_t (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*BackendSetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, const void*);
  cudnnStatus_t (*BackendGetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, int64_t*, void*);
  cudnnStatus_t (*BackendFinalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*BackendExecute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
  std::string missing;  // why the library could not be used; empty when it can
};

// The oldest cuDNN whose fused attention takes causal masks, windows and bf16 on sm_80/sm_90.
constexpr size_t kMinVersion = 90500;

const Api& api() {
  static Api a = [] {
    Api r{};
    void* lib = dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      r.missing = cat("cannot load libcudnn_graph.so.9 (", dlerror(), ")");
      return r;
    }
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
      if (!f && r.missing.empty()) r.missing = cat("libcudnn_graph.so.9 has no ", name);
    };
    sym(r.GetVersion, "cudnnGetVersion");
    sym(r.GetErrorString, "cudnnGetErrorString");
    sym(r.GetLastErrorString, "cudnnGetLastErrorString");
    sym(r.Create, "cudnnCreate");
    sym(r.SetStream, "cudnnSetStream");
    sym(r.BackendCreateDescriptor, "cudnnBackendCreateDescriptor");
    sym(r.BackendDestroyDescriptor, "cudnnBackendDestroyDescriptor");
    sym(r.BackendSetAttribute, "cudnnBackendSetAttribute");
    sym(r.BackendGetAttribute, "cudnnBackendGetAttribute");
    sym(r.BackendFinalize, "cudnnBackendFinalize");
    sym(r.BackendExecute, "cudnnBackendExecute");
    if (r.missing.empty() && r.GetVersion() < kMinVersion)
      r.missing = cat("cuDNN ", r.GetVersion(), " is older than ", kMinVersion);
    return r;
  }();
  return a;
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_runtime("cuDNN attention: ", what, ": ", cudaGetErrorString(e));
}

// cuDNN's failure as an exception; `what` names the step.
void check(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char last[512] = {0};
  api().GetLastErrorString(last, sizeof last);
  throw_runtime("cuDNN attention: ", what, ": ", api().GetErrorString(s), last[0] ? cat(" (", last, ")") : "");
}

// A backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) { check(api().BackendCreateDescriptor(type, &d_), "create"); }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&&) = delete;
  ~Desc() {
    if (d_) api().BackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* v, int64_t n = 1) {
    check(api().BackendSetAttribute(d_, name, type, n, v), "set attribute");
    return *this;
  }
  Desc& set(cudnnBackendAttributeName_t name, const Desc& d) {
    cudnnBackendDescriptor_t v = d.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &v);
  }
  Desc& finalize(const char* what) {
    check(api().BackendFinalize(d_), what);
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

cudnnHandle_t handle() {
  thread_local cudnnHandle_t h = [] {
    cudnnHandle_t r = nullptr;
    check(api().Create(&r), "cudnnCreate");
    return r;
  }();
  return h;
}

// ---- tensors and operations of a graph ----

// A 4-D tensor (B,H,rows,cols); uid names it in the variant pack.
Desc tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims, std::array<int64_t, 4> strides,
            bool is_virtual = false, bool by_value = false) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t align = 16;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4)
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
  if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
  return std::move(t.finalize("tensor"));
}

// Row-major strides of a virtual tensor of these dims.
std::array<int64_t, 4> packed(std::array<int64_t, 4> d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// A graph under construction, then its plan. Owns every descriptor the plan was built from.
class Graph {
 public:
  using Dims = std::array<int64_t, 4>;
  // A tensor the caller passes (non-virtual) or a by-value scalar; uid names it in the pack.
  cudnnBackendDescriptor_t io(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides) {
    return keep(tensor(uid, type, dims, strides));
  }
  cudnnBackendDescriptor_t scalar(int64_t uid, float value) {
    auto cell = std::make_unique<uint32_t>();
    std::memcpy(cell.get(), &value, 4);
    scalars_.push_back({uid, std::move(cell)});
    return keep(tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true));
  }
  cudnnBackendDescriptor_t scalar_i32(int64_t uid, int32_t value) {
    auto cell = std::make_unique<uint32_t>();
    std::memcpy(cell.get(), &value, 4);
    scalars_.push_back({uid, std::move(cell)});
    return keep(tensor(uid, CUDNN_DATA_INT32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true));
  }
  // An intermediate the engine keeps on chip (packed strides unless given).
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims dims, std::optional<Dims> strides = std::nullopt) {
    return keep(tensor(next_uid_++, type, dims, strides ? *strides : packed(dims), true));
  }

  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw.finalize("pointwise");
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y);
    if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b);
    if (t) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &t);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, &one)
        .finalize("pointwise operation");
    aux_.push_back(std::move(pw));
    ops_.push_back(std::move(op));
  }
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32).finalize("matmul");
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &a)
        .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b)
        .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &c)
        .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm)
        .finalize("matmul operation");
    aux_.push_back(std::move(mm));
    ops_.push_back(std::move(op));
  }
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32)
        .set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode)
        .finalize("reduction");
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red)
        .finalize("reduction operation");
    aux_.push_back(std::move(red));
    ops_.push_back(std::move(op));
  }
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x)
        .set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y)
        .finalize("reshape operation");
    ops_.push_back(std::move(op));
  }

  // S (f32, (B,H,Tq,Tk)) with the keys a query may not see set to -inf: causal, then the window's
  // left edge. Query row i is at position i + Tk - Tq (bottom-right alignment): key j is kept
  // when i + Tk - Tq >= j, and within a window when j + window - (Tk - Tq) > i. The shapes are
  // cuDNN frontend's (its diagonal band mask before 9.21): the bottom-right shift as an int32 add
  // of Tk and subtraction of Tq on the row index, the window's as one float add on the column;
  // a float add of the shift on the row ran without complaint and masked as if Tk = Tq (seen on
  // an H100 with cuDNN 9.14, 2026-12-06). With documents, `starts` (the rows' document starts,
  // (B,1,Tq,1) int32): key j kept when j >= its query's document's first position.
  cudnnBackendDescriptor_t mask(cudnnBackendDescriptor_t s, Dims st, int window, int Tq, int Tk, int64_t neg_inf_uid,
                                cudnnBackendDescriptor_t starts = nullptr) {
    auto select = [&](cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t keep, int64_t uid) {
      cudnnBackendDescriptor_t y = virt(CUDNN_DATA_FLOAT, st);
      pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, scalar(uid, -INFINITY), keep, y);
      return y;
    };
    auto index = [&](cudnnBackendDescriptor_t x, int64_t axis) {
      cudnnBackendDescriptor_t i = virt(CUDNN_DATA_INT32, st);
      pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, i, CUDNN_DATA_FLOAT, axis);
      return i;
    };
    {  // causal: row (+ Tk - Tq) >= col
      cudnnBackendDescriptor_t row = index(s, 2), col = index(s, 3);
      if (Tk != Tq) {
        cudnnBackendDescriptor_t plus = virt(CUDNN_DATA_INT32, st), shifted = virt(CUDNN_DATA_INT32, st);
        pointwise(CUDNN_POINTWISE_ADD, row, scalar_i32(neg_inf_uid + 1, Tk), nullptr, plus, CUDNN_DATA_INT32, 3);
        pointwise(CUDNN_POINTWISE_SUB, plus, scalar_i32(neg_inf_uid + 2, Tq), nullptr, shifted, CUDNN_DATA_INT32, 3);
        row = shifted;
      }
      cudnnBackendDescriptor_t keep = virt(CUDNN_DATA_BOOLEAN, st);
      pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
      s = select(s, keep, neg_inf_uid);
    }
    if (window > 0) {  // col + window - (Tk - Tq) > row
      cudnnBackendDescriptor_t row = index(s, 2), col = index(s, 3);
      cudnnBackendDescriptor_t shifted = virt(CUDNN_DATA_FLOAT, st), keep = virt(CUDNN_DATA_BOOLEAN, st);
      pointwise(CUDNN_POINTWISE_ADD, col, scalar(neg_inf_uid + 11, float(window - (Tk - Tq))), nullptr, shifted);
      pointwise(CUDNN_POINTWISE_CMP_GT, shifted, row, nullptr, keep, CUDNN_DATA_BOOLEAN);
      s = select(s, keep, neg_inf_uid + 10);
    }
    if (starts) {  // col >= the row's document start
      cudnnBackendDescriptor_t col = index(s, 3), keep = virt(CUDNN_DATA_BOOLEAN, st);
      pointwise(CUDNN_POINTWISE_CMP_GE, col, starts, nullptr, keep, CUDNN_DATA_BOOLEAN);
      s = select(s, keep, neg_inf_uid + 20);
    }
    return s;
  }

  // The plan: the operation graph, cuDNN's heuristic (mode A) candidates, the first that builds.
  void build(const char* what) {
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const Desc& d : ops_) ops.push_back(d.get());
    cudnnHandle_t h = handle();
    graph_.emplace(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph_->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h)
        .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(), int64_t(ops.size()))
        .finalize(what);
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t g = graph_->get();
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &g)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode)
        .finalize("heuristics");
    int64_t n = 0;
    check(api().BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                    nullptr), "heuristic results");
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < n; ++i) raw.push_back(cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    int64_t got = 0;
    if (n > 0)
      check(api().BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                                      &got, raw.data()), "heuristic results");
    std::string last = "no engine offered";
    for (int64_t i = 0; i < got; ++i) {
      Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw[i]);
      const cudnnStatus_t s = api().BackendFinalize(plan.get());
      if (s != CUDNN_STATUS_SUCCESS) {
        char msg[512] = {0};
        api().GetLastErrorString(msg, sizeof msg);
        last = cat(api().GetErrorString(s), msg[0] ? cat(" (", msg, ")") : "");
        continue;
      }
      check(api().BackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                      &got, &workspace_), "workspace size");
      plan_.emplace(std::move(plan));
      return;
    }
    throw_runtime("cuDNN attention: ", what, ": no engine builds a plan: ", last);
  }

  // Runs the plan with these device pointers (uid, pointer) and `ws` bytes of workspace.
  void execute(std::vector<std::pair<int64_t, void*>> ptrs, void* ws, cudaStream_t stream) {
    for (auto& [uid, v] : scalars_) ptrs.push_back({uid, v.get()});
    std::vector<int64_t> uids;
    std::vector<void*> data;
    for (auto& [uid, p] : ptrs) uids.push_back(uid), data.push_back(p);
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), int64_t(uids.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, data.data(), int64_t(data.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws)
        .finalize("variant pack");
    check(api().SetStream(handle(), stream), "set stream");
    check(api().BackendExecute(handle(), plan_->get(), pack.get()), "execute");
  }
  int64_t workspace() const { return workspace_; }

 private:
  cudnnBackendDescriptor_t keep(Desc d) { return tensors_.emplace_back(std::move(d)).get(); }
  std::deque<Desc> tensors_, ops_, aux_;
  std::vector<std::pair<int64_t, std::unique_ptr<uint32_t>>> scalars_;  // by-value (f32, i32): host pointers in the pack
  std::optional<Desc> graph_, plan_;
  int64_t workspace_ = 0;
  int64_t next_uid_ = 1000;
};

// The uids of the tensors the caller passes.
// Every uid distinct within a graph, the by-value scalars included: cuDNN refuses a pack that repeats one.
enum : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum, kDocStarts,
  kScale = 50, kOne, kScaleDS, kNegInf = 60
};

// Myriad's layouts as (B,heads,rows,D) views: QKV per token (Hkv,G+2,D), the output (H,D). With
// G = 1 the heads are one stride (3D) apart: one call reads QKV where it is. With G > 1 the
// query heads of different groups are not one stride apart, so QKV is first moved into the
// heads' layout, per token [H query heads | Hkv keys | Hkv values] (qkv_to_heads, in this
// module's buffer; the gradients back with qkv_from_heads): one call over all H query heads,
// cuDNN broadcasting each key/value head to its G query heads and reducing their dK and dV.
// One call takes Tq queries at positions Tk - Tq .. Tk - 1 against the keys 0 .. Tk - 1 of a
// buffer of T positions a sequence (Tq = Tk = T for a whole sequence); out and the stats hold To
// rows a sequence, dK and dV Tdkv positions (T, or a scratch's). With documents each query sees
// only its document's keys: the graph takes the queries' document starts, (B,Tq) of the (B,T)
// int32 starts of every position (data.document_mask's), and masks the keys before them (the
// tiles wholly before them are computed and masked: cuDNN skips only the causal ones).
struct Shape {
  int B, Tq, Tk, H, G, D, window;
  int64_t T, To, Tdkv;
  bool deterministic, docs;
  auto key() const { return std::make_tuple(B, Tq, Tk, H, G, D, window, T, To, Tdkv, deterministic, docs); }
  int Hkv() const { return H / G; }
  int64_t token() const { return int64_t(H + 2 * Hkv()) * D; }  // elements of a token's QKV
  bool moved() const { return G > 1; }                            // QKV in the heads' layout
  int64_t head_stride() const { return moved() ? D : 3 * D; }
  Graph::Dims q_strides() const { return {T * token(), head_stride(), token(), 1}; }
  Graph::Dims dkv_strides() const { return {Tdkv * token(), head_stride(), token(), 1}; }
  Graph::Dims out_strides() const { return {To * H * D, D, int64_t(H) * D, 1}; }
  Graph::Dims stats_strides() const { return {int64_t(H) * To, To, 1, 1}; }
  Graph::Dims bhtd() const { return {B, H, Tq, D}; }
  Graph::Dims kv_btd() const { return {B, Hkv(), Tk, D}; }
  Graph::Dims kv_bdt() const { return {B, Hkv(), D, Tk}; }
  Graph::Dims scores() const { return {B, H, Tq, Tk}; }
  Graph::Dims rows() const { return {B, H, Tq, 1}; }
  Graph::Dims starts() const { return {B, 1, Tq, 1}; }
  Graph::Dims starts_strides() const { return {T, T, 1, 1}; }
  float scale() const { return 1.0f / std::sqrt(float(D)); }
  // From the first query head: the first key and the first value.
  int64_t k_offset() const { return moved() ? int64_t(H) * D : D; }
  int64_t v_offset() const { return moved() ? int64_t(H + Hkv()) * D : 2 * D; }
  size_t qkv_bytes() const { return size_t(B) * T * token() * 2; }
  size_t dkv_scratch_bytes() const { return Tdkv == T ? 0 : size_t(B) * Tdkv * token() * 2; }
};
using ShapeKey = decltype(std::declval<Shape>().key());
Graph::Dims transposed(Graph::Dims s) { return {s[0], s[1], s[3], s[2]}; }

// Forward: S = QK^T * scale, masked, softmax (its log-sum-exp the stats), O = PV.
std::unique_ptr<Graph> forward_graph(const Shape& x) {
  auto g = std::make_unique<Graph>();
  const auto S = x.scores(), R = x.rows();
  auto q = g->io(kQ, CUDNN_DATA_BFLOAT16, x.bhtd(), x.q_strides());
  auto kt = g->io(kK, CUDNN_DATA_BFLOAT16, x.kv_bdt(), transposed(x.q_strides()));
  auto v = g->io(kV, CUDNN_DATA_BFLOAT16, x.kv_btd(), x.q_strides());
  auto o = g->io(kO, CUDNN_DATA_BFLOAT16, x.bhtd(), x.out_strides());
  auto stats = g->io(kStats, CUDNN_DATA_FLOAT, R, x.stats_strides());
  auto starts = x.docs ? g->io(kDocStarts, CUDNN_DATA_INT32, x.starts(), x.starts_strides()) : nullptr;
  auto s1 = g->virt(CUDNN_DATA_FLOAT, S), s2 = g->virt(CUDNN_DATA_FLOAT, S);
  g->matmul(q, kt, s1);
  g->pointwise(CUDNN_POINTWISE_MUL, s1, g->scalar(kScale, x.scale()), nullptr, s2);
  auto s3 = g->mask(s2, S, x.window, x.Tq, x.Tk, kNegInf, starts);
  auto mx = g->virt(CUDNN_DATA_FLOAT, R), sub = g->virt(CUDNN_DATA_FLOAT, S), e = g->virt(CUDNN_DATA_FLOAT, S);
  auto z = g->virt(CUDNN_DATA_FLOAT, R), lz = g->virt(CUDNN_DATA_FLOAT, R), p = g->virt(CUDNN_DATA_BFLOAT16, S);
  g->reduction(CUDNN_REDUCE_TENSOR_MAX, s3, mx);
  g->pointwise(CUDNN_POINTWISE_SUB, s3, mx, nullptr, sub);
  g->pointwise(CUDNN_POINTWISE_EXP, sub, nullptr, nullptr, e);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  g->pointwise(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, lz);
  g->pointwise(CUDNN_POINTWISE_ADD, mx, lz, nullptr, stats);
  g->pointwise(CUDNN_POINTWISE_DIV, e, z, nullptr, p);
  g->matmul(p, v, o);
  g->build("attention forward");
  return g;
}

// Backward from the stats: P again, dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)) * scale,
// dK = dS^T Q, dQ = dS K. Deterministic: dQ straight from its GEMM; otherwise through an fp32
// accumulator that the engine adds into from several blocks.
std::unique_ptr<Graph> backward_graph(const Shape& x) {
  auto g = std::make_unique<Graph>();
  const auto S = x.scores(), R = x.rows();
  const auto qs = x.q_strides(), ks = x.dkv_strides(), os = x.out_strides();
  auto q = g->io(kQ, CUDNN_DATA_BFLOAT16, x.bhtd(), qs);
  auto kt = g->io(kK, CUDNN_DATA_BFLOAT16, x.kv_bdt(), transposed(qs));
  auto vt = g->io(kV, CUDNN_DATA_BFLOAT16, x.kv_bdt(), transposed(qs));
  auto o = g->io(kO, CUDNN_DATA_BFLOAT16, x.bhtd(), os);
  auto dout = g->io(kDO, CUDNN_DATA_BFLOAT16, x.bhtd(), os);
  auto stats = g->io(kStats, CUDNN_DATA_FLOAT, R, x.stats_strides());
  auto starts = x.docs ? g->io(kDocStarts, CUDNN_DATA_INT32, x.starts(), x.starts_strides()) : nullptr;
  auto dq = g->io(kDQ, CUDNN_DATA_BFLOAT16, x.bhtd(), qs);
  auto dk = g->io(kDK, CUDNN_DATA_BFLOAT16, x.kv_btd(), ks);
  auto dv = g->io(kDV, CUDNN_DATA_BFLOAT16, x.kv_btd(), ks);
  // With G query heads over each key/value head, dK and dV are made per query head and reduced
  // over each group.
  const Graph::Dims heads_kv = {x.B, x.H, x.Tk, x.D};
  auto dk_heads = x.G == 1 ? dk : g->virt(CUDNN_DATA_BFLOAT16, heads_kv);
  auto dv_heads = x.G == 1 ? dv : g->virt(CUDNN_DATA_BFLOAT16, heads_kv);
  auto softmax_sum = g->io(kSoftmaxSum, CUDNN_DATA_FLOAT, R, packed(R));
  // rowsum(dO * O)
  const Graph::Dims od = {int64_t(x.H) * x.Tq * x.D, int64_t(x.Tq) * x.D, int64_t(x.H) * x.D, 1};
  auto dot = g->virt(CUDNN_DATA_FLOAT, x.bhtd(), od), dsum = g->virt(CUDNN_DATA_FLOAT, R);
  g->pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr, dot);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, dot, dsum);
  g->pointwise(CUDNN_POINTWISE_MUL, dsum, g->scalar(kOne, 1.0f), nullptr, softmax_sum);
  // P = exp(QK^T * scale - stats), masked
  auto s1 = g->virt(CUDNN_DATA_FLOAT, S), s2 = g->virt(CUDNN_DATA_FLOAT, S), s3 = g->virt(CUDNN_DATA_FLOAT, S);
  g->matmul(q, kt, s1);
  g->pointwise(CUDNN_POINTWISE_MUL, s1, g->scalar(kScale, x.scale()), nullptr, s2);
  g->pointwise(CUDNN_POINTWISE_SUB, s2, stats, nullptr, s3);
  auto s4 = g->mask(s3, S, x.window, x.Tq, x.Tk, kNegInf, starts);
  auto p = g->virt(CUDNN_DATA_FLOAT, S);
  g->pointwise(CUDNN_POINTWISE_EXP, s4, nullptr, nullptr, p);
  // dV = P^T dO
  auto pt = g->virt(CUDNN_DATA_BFLOAT16, transposed(S), transposed(packed(S)));
  g->reshape(p, pt);
  g->matmul(pt, dout, dv_heads);
  if (x.G > 1) g->reduction(CUDNN_REDUCE_TENSOR_ADD, dv_heads, dv);
  // dS = P (dO V^T - softmax_sum) * scale
  auto dp = g->virt(CUDNN_DATA_FLOAT, S), d1 = g->virt(CUDNN_DATA_FLOAT, S), d2 = g->virt(CUDNN_DATA_FLOAT, S);
  auto ds = g->virt(CUDNN_DATA_FLOAT, S);
  g->matmul(dout, vt, dp);
  g->pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, d1);
  g->pointwise(CUDNN_POINTWISE_MUL, d1, p, nullptr, d2);
  g->pointwise(CUDNN_POINTWISE_MUL, d2, g->scalar(kScaleDS, x.scale()), nullptr, ds);
  // dK = dS^T Q
  auto dst = g->virt(CUDNN_DATA_BFLOAT16, transposed(S), transposed(packed(S)));
  g->reshape(ds, dst);
  g->matmul(dst, q, dk_heads);
  if (x.G > 1) g->reduction(CUDNN_REDUCE_TENSOR_ADD, dk_heads, dk);
  // dQ = dS K
  auto k = g->virt(CUDNN_DATA_FLOAT, x.kv_btd(), qs);
  g->reshape(kt, k);
  if (x.deterministic) {
    g->matmul(ds, k, dq);
  } else {
    auto acc = g->io(kDQAccum, CUDNN_DATA_FLOAT, x.bhtd(), packed(x.bhtd()));
    g->matmul(ds, k, acc);
    g->pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dq);
  }
  g->build("attention backward");
  return g;
}

// Plans by shape, and one workspace for all (grown on demand: only at a shape's first call).
struct Plans {
  std::mutex mu;
  std::map<ShapeKey, std::pair<std::unique_ptr<Graph>, std::unique_ptr<Graph>>> by_shape;
  std::map<ShapeKey, std::string> refused;
  void* ws = nullptr;
  size_t ws_bytes = 0;
};
Plans& plans() {
  static Plans p;
  return p;
}

// The backward's fp32 scratch, at the start of its workspace: rowsum(dO O) (B,H,Tq), padded to
// 256 bytes, then the dQ accumulator (B,H,Tq,D) when not deterministic.
size_t row_sums_bytes(const Shape& x) { return (size_t(x.B) * x.H * x.Tq * 4 + 255) / 256 * 256; }
size_t backward_scratch_bytes(const Shape& x) {
  return row_sums_bytes(x) + (x.deterministic ? 0 : size_t(x.B) * x.H * x.Tq * x.D * 4);
}

std::pair<Graph*, Graph*> plan_for(const Shape& x) {
  Plans& ps = plans();
  std::lock_guard<std::mutex> lock(ps.mu);
  auto it = ps.by_shape.find(x.key());
  if (it == ps.by_shape.end()) {
    auto f = forward_graph(x), b = backward_graph(x);
    const size_t need = std::max(size_t(f->workspace()), backward_scratch_bytes(x) + size_t(b->workspace()));
    if (need > ps.ws_bytes) {
      cuda_ok(cudaDeviceSynchronize(), "synchronize before the workspace grows");  // any stream may use it
      cudaFree(ps.ws);
      ps.ws = nullptr;
      cuda_ok(cudaMalloc(&ps.ws, need), "workspace");
      ps.ws_bytes = need;
    }
    log::info("attention: cuDNN ", api().GetVersion(), " fused attention for B ", x.B, " T ", x.Tq,
              x.Tk != x.Tq ? cat(" queries against ", x.Tk, " keys") : "", " H ", x.H,
              x.G > 1 ? cat(" over ", x.Hkv(), " key/value heads") : "", " D ", x.D, x.window ? cat(" window ", x.window) : "",
              x.docs ? ", documents" : "", x.deterministic ? ", deterministic" : "",
              " (workspace ", (need + (1 << 20) - 1) >> 20, " MiB)");
    it = ps.by_shape.emplace(x.key(), std::make_pair(std::move(f), std::move(b))).first;
  }
  return {it->second.first.get(), it->second.second.get()};
}

bool deterministic_default = true;

// A call's shape with its place: the queries' first position in qkv, their first row in out.
struct Part {
  Shape x;
  int64_t begin, row;
};
// One call a range of query rows (one for a whole sequence), the range whose keys reach furthest
// first: the backward writes its dK and dV in place and the other's into a scratch of its keys'
// positions, added after.
std::vector<Part> parts(int B, int T, int H, int Hkv, int D, int window, const QueryRanges* r, bool docs) {
  MYRIAD_CHECK(Hkv > 0 && H % Hkv == 0, "attention: ", H, " query heads over ", Hkv, " key/value heads");
  const int G = H / Hkv;
  if (!r) return {Part{Shape{B, T, T, H, G, D, window, T, T, T, deterministic_default, docs}, 0, 0}};
  MYRIAD_CHECK(r->n == 1 || r->n == 2, "attention: ", r->n, " query ranges (1 or 2)");
  std::vector<Part> p;
  int64_t row = 0;
  for (int i = 0; i < r->n; ++i) {
    const int64_t b = r->begin[i], e = r->end[i];
    MYRIAD_CHECK(0 <= b && b < e && e <= T, "attention: query range [", b, ", ", e, ") of ", T, " positions");
    p.push_back(
        Part{Shape{B, int(e - b), int(e), H, G, D, window, T, r->count(), T, deterministic_default, docs}, b, row});
    row += e - b;
  }
  std::sort(p.begin(), p.end(), [](const Part& a, const Part& b) { return a.x.Tk > b.x.Tk; });
  for (size_t i = 1; i < p.size(); ++i) p[i].x.Tdkv = p[i].x.Tk;
  return p;
}

// This module's buffer, held for the process (counted in workspace_bytes): with G > 1, QKV and its
// gradient in the heads' layout (qkv_bytes each); under two query ranges, the second call's dK
// and dV. Grown to the largest need.
struct Held {
  std::mutex mu;
  char* buf = nullptr;
  size_t bytes = 0;
};
Held& held() {
  static Held h;
  return h;
}
char* held_buffer(size_t need) {
  Held& m = held();
  std::lock_guard<std::mutex> lock(m.mu);
  if (need > m.bytes) {
    cuda_ok(cudaDeviceSynchronize(), "synchronize before the held buffer grows");
    cudaFree(m.buf);
    m.buf = nullptr;
    cuda_ok(cudaMalloc(&m.buf, need), "the held buffer (moved QKV, the keys' gradients' scratch)");
    m.bytes = need;
  }
  return m.buf;
}

}  // namespace

int version() { return api().missing.empty() ? int(api().GetVersion()) : 0; }

bool supports(int B, int T, int H, int Hkv, int D, int window, std::string* why, const QueryRanges* rows,
              bool documents) {
  auto refuse = [&](std::string r) {
    if (why) *why = std::move(r);
    return false;
  };
  if (!api().missing.empty()) return refuse(api().missing);
  int dev = 0, major = 0;
  cuda_ok(cudaGetDevice(&dev), "device");
  cuda_ok(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "compute capability");
  if (major < 8) return refuse(cat("compute capability ", major, ".x: cuDNN's fused attention needs 8.0 or newer"));
  if (D % 8 != 0 || D > 256) return refuse(cat("head size ", D, ": cuDNN takes multiples of 8 up to 256"));
  if (Hkv < 1 || H % Hkv != 0) return refuse(cat("H ", H, " is not a multiple of Hkv ", Hkv));
  for (const Part& p : parts(B, T, H, Hkv, D, window, rows, documents)) {
    const Shape& x = p.x;
    // Before 9.16, cuDNN's backward needs T % 128 == 0 unless given a padding mask, not built here.
    if (api().GetVersion() < 91600 && (x.Tq % 128 != 0 || x.Tk % 128 != 0))
      return refuse(x.Tq == x.Tk ? cat("T ", T, " is not a multiple of 128 (cuDNN < 9.16)")
                                 : cat("a query range of ", x.Tq, " rows against ", x.Tk,
                                       " keys: not multiples of 128 (cuDNN < 9.16)"));
    Plans& ps = plans();
    {
      std::lock_guard<std::mutex> lock(ps.mu);
      if (auto r = ps.refused.find(x.key()); r != ps.refused.end()) return refuse(r->second);
    }
    try {
      plan_for(x);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(ps.mu);
      ps.refused[x.key()] = e.what();
      return refuse(e.what());
    }
  }
  return true;
}

void set_deterministic(bool on) { deterministic_default = on; }
bool deterministic() { return deterministic_default; }

size_t workspace_bytes() {
  size_t h = 0;
  {
    std::lock_guard<std::mutex> lock(held().mu);
    h = held().bytes;
  }
  std::lock_guard<std::mutex> lock(plans().mu);
  return plans().ws_bytes + h;
}

void attention_forward(__nv_bfloat16* out, float* stats, const __nv_bfloat16* qkv, int B, int T, int H, int Hkv,
                       int D, int window, cudaStream_t stream, const QueryRanges* rows, const int32_t* docs) {
  const std::vector<Part> ps = parts(B, T, H, Hkv, D, window, rows, docs != nullptr);
  const Shape& x0 = ps[0].x;
  auto* q = const_cast<__nv_bfloat16*>(qkv);
  if (x0.moved()) {
    auto* heads = reinterpret_cast<__nv_bfloat16*>(held_buffer(x0.qkv_bytes()));
    qkv_to_heads(heads, qkv, int64_t(B) * T, H, Hkv, D, stream);
    q = heads;
  }
  for (const Part& p : ps) {
    const Shape& x = p.x;
    Graph* f = plan_for(x).first;
    std::vector<std::pair<int64_t, void*>> ptrs = {{kQ, q + p.begin * x.token()}, {kK, q + x.k_offset()},
                                                   {kV, q + x.v_offset()}, {kO, out + p.row * H * D},
                                                   {kStats, stats + p.row}};
    if (docs) ptrs.push_back({kDocStarts, const_cast<int32_t*>(docs + p.begin)});
    f->execute(std::move(ptrs), plans().ws, stream);
  }
}

void attention_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                        const __nv_bfloat16* qkv, const float* stats, int B, int T, int H, int Hkv, int D, int window,
                        cudaStream_t stream, const QueryRanges* rows, const int32_t* docs) {
  const std::vector<Part> ps = parts(B, T, H, Hkv, D, window, rows, docs != nullptr);
  const Shape& x0 = ps[0].x;
  const size_t moved_bytes = x0.moved() ? 2 * x0.qkv_bytes() : 0;
  size_t need = moved_bytes;
  for (const Part& p : ps) need = std::max(need, moved_bytes + p.x.dkv_scratch_bytes());
  char* h = need ? held_buffer(need) : nullptr;
  auto* q = const_cast<__nv_bfloat16*>(qkv);
  __nv_bfloat16* dq = dqkv;
  if (x0.moved()) {  // the forward's moved QKV is not kept: moved again, and the gradient back
    auto* heads = reinterpret_cast<__nv_bfloat16*>(h);
    qkv_to_heads(heads, qkv, int64_t(B) * T, H, Hkv, D, stream);
    q = heads, dq = heads + x0.qkv_bytes() / 2;
  }
  auto* scratch = reinterpret_cast<__nv_bfloat16*>(h + moved_bytes);
  char* ws = static_cast<char*>(plans().ws);
  for (const Part& p : ps) {
    const Shape& x = p.x;
    Graph* b = plan_for(x).second;
    __nv_bfloat16* dkv = x.Tdkv == T ? dq : scratch;
    const int64_t o = p.row * H * D;
    std::vector<std::pair<int64_t, void*>> ptrs = {
        {kQ, q + p.begin * x.token()}, {kK, q + x.k_offset()}, {kV, q + x.v_offset()},
        {kO, const_cast<__nv_bfloat16*>(out + o)}, {kDO, const_cast<__nv_bfloat16*>(dout + o)},
        {kStats, const_cast<float*>(stats + p.row)}, {kDQ, dq + p.begin * x.token()},
        {kDK, dkv + x.k_offset()}, {kDV, dkv + x.v_offset()}, {kSoftmaxSum, ws}};
    if (!x.deterministic) ptrs.push_back({kDQAccum, ws + row_sums_bytes(x)});
    if (docs) ptrs.push_back({kDocStarts, const_cast<int32_t*>(docs + p.begin)});
    b->execute(std::move(ptrs), ws + backward_scratch_bytes(x), stream);
  }
  const int width = int(x0.token());
  for (size_t i = 1; i < ps.size(); ++i)  // the second range's keys' gradients added to the first's
    add_token_columns(dq, scratch, B, ps[i].x.Tk, T, ps[i].x.Tdkv, width, x0.moved() ? width : 3 * D,
                      x0.moved() ? H * D : D, x0.moved() ? width : 3 * D, stream);
  if (x0.Tk < T)  // keys past every query's reach: no gradient
    cuda_ok(cudaMemset2DAsync(dq + int64_t(x0.Tk) * width, size_t(T) * width * 2, 0,
                              size_t(T - x0.Tk) * width * 2, B, stream),
            "zero the keys' gradients past the queries");
  if (x0.moved()) qkv_from_heads(dqkv, dq, int64_t(B) * T, H, Hkv, D, stream);
}

#endif  // MYRIAD_HAVE_CUDNN_HEADERS

}  // namespace myriad::cuda::cudnn
