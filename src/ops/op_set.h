// The op sets' contract, written once: what the one layer schedule (model/gpt.h) and the one
// step (runtime/model_engine.h) call on an op set. CpuOps (ops/cpu/cpu_ops.h) and CudaOps
// (model/cuda/cuda_ops.h) both satisfy it; GptModel and ModelEngine take only op sets that do,
// so a kernel one of them lacks, or takes with other arguments, fails at the template's
// declaration with this concept's name rather than deep in an instantiation.
//
// An op set names the element types and owns the kernels and buffers:
//   Act        activations and their gradients (fp32 on the CPU; bf16 on a GPU)
//   Param      the weights the kernels read (the fp32 parameters themselves on the CPU; a bf16
//              compute copy on a GPU)
//   Buffer<T>  an owned buffer of T in the op set's memory: zeros(n), data(), size()
//   Tokens     a micro-batch's token ids, with what a lookup's backward needs
// Every pointer an op takes is the op set's memory, shapes in comments as in ops/cpu/ops.h,
// whose conventions hold: row-major; backward ops ACCUMULATE into their gradients unless marked
// (=); results independent of thread timing. Parameter gradients are fp32 whatever Act is. The
// kernels' own comments are at CpuOps, the reference.
//
// Why CudaOps lives in model/cuda/ and not beside CpuOps in ops/: it owns the cuBLASLt GEMMs
// (model/cuda/matmul.h) and the device (model/cuda/device.h), which are the model floor's, while
// ops/cuda/ holds only its kernels. ops/ compiles as C++17 under nvcc too, so the concept is
// checked from host C++20 code (model/gpt.h), never from a .cu file.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/parallel_layout.h"
#include "ops/fp8.h"
#include "ops/kinds.h"

namespace myriad {

template <class O>
concept OpSet = requires(const O& o, typename O::Act* a, const typename O::Act* ca, const typename O::Param* cp,
                         float* f, const float* cf, const int32_t* cids,
                         typename O::Tokens& tokens, const typename O::Tokens& ctokens, double* d, Norm n, Mlp m,
                         Gemm g, int i, int64_t l, bool b, const std::string& s,
                         const std::vector<std::pair<int64_t, int64_t>>& pieces, const std::vector<double>& freqs,
                         const fp8::Recipe& recipe, fp8::AmaxGroup group, typename O::Param* p, void* v,
                         size_t z, const Router& router, int32_t* ids, const int64_t* counts, QkNorm qk,
                         const ContextRows* rows, const fp8::Kept* kept, const fp8::WeightCast* wcast) {
  // Types and buffers.
  typename O::template Buffer<float>;
  typename O::template Buffer<typename O::Act>;
  { o.name() } -> std::convertible_to<const char*>;
  // Moving data.
  o.zero(f, l);
  o.copy(f, cf, l);
  o.download(f, ca, l);
  o.download(f, cf, l);
  o.download(d, static_cast<const double*>(d), l);
  o.upload(f, cf, l);
  // The compute copy of the weights (bf16 on a GPU, the fp32 weights themselves on the CPU):
  // drawn on the host and rounded in, refreshed from the fp32 master after an update; the
  // host buffer a device copies from, pinned; and the fp32 copies the tensor-parallel regions
  // reduce in, widened from Act and narrowed back.
  o.upload_params(p, cf, l);
  o.cast_params(p, cf, l);
  o.pin_host(v, z);
  o.widen(f, ca, l);
  o.narrow(a, cf, l);
  o.load_tokens(tokens, cids, i, i, l, l, l);
  o.mean_into(d, cf, l, l);
  // What the step needs besides the model.
  { o.device_name() } -> std::convertible_to<std::string>;
  { o.peak_flops() } -> std::convertible_to<double>;
  { O::peak_bytes() } -> std::convertible_to<int64_t>;
  o.comm_stream();
  { o.sums_of_squares(cf, pieces) } -> std::convertible_to<std::vector<double>>;
  o.accumulate(f, cf, l);
  { o.mark() } -> std::convertible_to<int>;
  { o.seconds(i, i) } -> std::convertible_to<double>;
  o.clear_marks();
  // The block's kernels.
  o.embedding_forward(a, cids, cp, cp, i, i, i, rows);
  o.embedding_backward(f, f, ca, ctokens, i, i, i, rows);
  o.norm_forward(n, a, f, f, ca, cp, cp, i, i, kept);  // kept: FP8's keep of the output, for its amax
  o.residual_norm_forward(n, a, a, f, f, ca, ca, cp, cp, i, i, kept);
  o.norm_backward(n, a, f, f, ca, ca, cp, cf, cf, i, i);
  // Gemm::kFp8: what the forward keeps of its input's cast for the backward (fp8::Kept); in the
  // backward, the activation's input gradient's amax handed to the next backward's cast.
  // A weight's cast for the step (fp8::WeightCast), read in place of casting the weight.
  o.linear_forward(a, ca, cp, cp, i, i, i, g, kept, wcast);
  o.linear_act_forward(m, a, a, ca, cp, cp, i, i, i, g, kept, kept, wcast);
  o.linear_backward(m, a, f, f, ca, ca, cp, ca, i, i, i, b, g, kept, kept, kept, wcast);
  o.fp8_cast_weight(*wcast, cp, i, i);
  { o.fp8_refusal(recipe) } -> std::convertible_to<std::string>;
  o.set_fp8(recipe, group);
  o.add(a, ca, ca, l);
  o.select_attention(s, b);
  { o.attention_saved(i, i, i, i) } -> std::convertible_to<int64_t>;
  o.attention_forward(a, f, ca, i, i, i, i, i, i, cids, rows);
  o.attention_backward(a, ca, ca, ca, cf, i, i, i, i, i, i, cids, rows);
  o.qk_norm_forward(qk, a, f, ca, cp, cp, i, i, i, i);
  o.qk_norm_backward(qk, a, f, f, ca, cp, cp, cf, i, i, i, i);
  o.set_rope(freqs);
  o.rope_forward(a, i, i, i, i, i, rows);
  o.rope_backward(a, i, i, i, i, i, rows);
  // Context parallelism (a rank's rows of each sequence, core/parallel_layout.h): why this op
  // set cannot run it ("" when it can).
  { o.context_parallel_refusal(l) } -> std::convertible_to<std::string>;
  // Its key/value exchange's packing (CpuOps has the contracts).
  o.cp_pack_kv(a, ca, l, i, i, i);
  o.cp_unpack_kv(a, ca, ca, i, i, rows, i, i, i, i, i);
  o.cp_pack_kv_grad(f, ca, i, i, rows, i, i, i, i);
  o.cp_unpack_kv_grad(a, cf, ca, i, i, rows, i, i, i, i, i);
  o.crossentropy_forward(f, ca, cids, i, i, i);
  o.crossentropy_forward_backward(f, a, cids, 1.0f, i, i, i);
  // The rows a rank holds (tensor parallelism).
  o.add_bias(a, cp, i, i);
  o.bias_backward(f, ca, i, i);
  o.vocab_rows_forward(a, cids, cp, l, l, i, i);
  o.vocab_rows_backward(f, ca, ctokens, l, l, i, i);
  o.add_positions(a, cp, i, i, i, i, rows);
  o.positions_backward(f, ca, i, i, i, i, rows);
  o.ce_row_max(f, ca, i, l, i);
  o.ce_partials(f, ca, cf, cids, l, i, l, i);
  o.ce_losses(f, f, cf, cids, i);
  o.ce_tp_backward(a, cf, cf, 1.0f, cids, l, i, l, i);
  // A mixture of experts' layer (the CPU op set's comments say what each computes).
  { o.moe_refusal() } -> std::convertible_to<std::string>;
  o.router_forward(f, ca, cp, i, i, i);
  o.router_backward(a, f, cf, ca, cp, i, i, i);
  { o.route(router, ids, f, ids, ids, cf, cp, i) } -> std::convertible_to<Routing>;
  o.route_backward(router, f, cf, cf, cids, 1.0f, i, RouteTotals{});
  o.gather_rows(a, ca, cids, i, i, i);
  o.gather_rows_backward(a, ca, cids, i, i, i);
  o.grouped_linear_act_forward(m, a, a, ca, cp, counts, i, i, i);
  o.grouped_linear_forward(a, ca, cp, counts, i, i, i);
  o.grouped_linear_backward(m, a, f, ca, ca, cp, ca, counts, i, i, i);
  o.combine_forward(a, ca, cf, cids, i, i, i, b);
  o.combine_backward(a, f, ca, ca, cf, cids, i, i, i);
};

}  // namespace myriad
