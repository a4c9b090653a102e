// The GPT decoder: the one layer schedule, hand-written forward and backward over flat buffers,
// written against an op set (ops/cpu/cpu_ops.h says what an op set is) so that every device
// runs the same layers, tensor-parallel regions and micro-batch slots. GptModel<Ops> is the
// schedule; `Gpt` is it on the CPU op set (fp32, the oracle).
//
// One schedule, every block variant: the model keys choose ops at fixed places of it, never a
// second schedule. GPT-2's block and Llama's differ in
//   the norm         LayerNorm or RMSNorm (Norm, passed to every norm op)
//   positions        wpe added at the embedding, or RoPE on q and k right after the QKV GEMM
//                    (rope_forward; its backward right after attention's)
//   attention        H query heads over Hkv key/value heads (GQA): the QKV width and the
//                    attention op's head counts
//   the MLP          the first GEMM's activation, GELU or SwiGLU (Mlp, passed to the fused
//                    GEMM + activation ops; SwiGLU's GEMM is twice as wide); or, in the layers
//                    model.layer_is_moe picks, a mixture of experts (mlp_forward, mlp_output,
//                    mlp_backward): the router's fp32 logits, the routes (Router: top-k, ties to
//                    the lower expert), the token rows gathered into expert order (a stable
//                    counting sort), every expert's SwiGLU as grouped GEMMs over its rows, the
//                    weighted combine in slot order, and the shared experts as a dense SwiGLU;
//                    the routers' balance and z losses enter the gradients (docs/notes/moe.md)
//   the LM head      wte (tied) or lm_head
// and the layout (params.h) holds the tensors each variant has. train.precision chooses the
// arithmetic of the block's linear GEMMs (Gemm, passed to every linear op of a layer), bf16 or
// FP8; the LM head, attention, the norms and the update stay as they are.
//
// One object owns this rank's parameters and their gradients, and the activations of the
// micro-batches in flight, up to (micro_batch, seq_len) tokens each. Not thread-safe: one
// forward or backward at a time (the ops inside use their own threads).
//
// Pipeline parallelism: the object holds a ModelPart, one or more chunks of consecutive layers
// (virtual stages); the first chunk of the model also embeds, the last also runs the final norm,
// the LM head and the loss. The head never holds the whole (N, vocab) logits: its GEMM, the loss
// and, in a training forward, its backward (the logits' gradient, the head's weight gradient
// and the final norm's output gradient) run row chunk by row chunk (train.logits_mib), so that the
// logits of one chunk live at a time. A chunk's forward keeps what its backward needs in a slot per
// micro-batch (slots are reused, so memory follows the schedule's in-flight bound). Without
// pipeline parallelism there is one chunk of every layer and forward_backward() runs it.
//
// Tensor parallelism (Megatron-style), when built with a ParallelContext whose tp group has
// t > 1 ranks: this object holds rank r's shard of every tensor (params.h says which are split
// and how) and runs its share of every layer; the collectives sit in the regions of
// parallel/mappings.h, around the layers:
//   embedding   vocab-parallel: each rank looks up the tokens of its Vp/t rows of wte (zero
//               for the others), ReduceFromTp (SP: ReduceScatterToSequence) sums the partial
//               rows, then wpe is added once (replicated)
//   attention   LN1 (replicated) -> CopyToTp (SP: GatherFromSequence) -> QKV column-parallel
//               (this rank's Hkv/t key/value heads with their H/t query heads; tp must divide
//               Hkv: they are never replicated) -> attention over its heads -> proj row-parallel ->
//               ReduceFromTp (SP: ReduceScatterToSequence) -> + proj bias -> + residual
//   MLP         the same shape: fc column-parallel (F/t features; SwiGLU's gate and up rows of a
//               feature on the same rank), the activation, proj row-parallel
//   LM head     LNf -> CopyToTp (SP: GatherFromSequence) -> logits of this rank's Vp/t
//               vocabulary rows (N, Vp/t) -> vocab-parallel cross-entropy: the row max and the
//               sum of exps combined over the ranks, the target logit from the rank that owns it
//               (padded columns never enter)
// Without sequence parallelism the residual stream (B*T, C) is replicated on every rank. With
// it (parallel.sequence_parallel) the LayerNorms and residual adds run on this rank's block of
// B*T/t consecutive tokens of the micro-batch (tokens [r N/t, (r+1) N/t) of the (B, T) order),
// gathered before each column-parallel GEMM and reduce-scattered after each row-parallel one.
// Attention and the LM head always see every token (of their heads / vocabulary rows).
// Replicated tensors then get partial gradients (from this rank's tokens): finish_grads()
// all-reduces them once per step. A forward whose B*T is not divisible by t (generation)
// runs without SP; the weights are the same.
//
// Context parallelism, when the ParallelContext's cp group has c > 1 ranks (parallel.cp): every
// sequence of T = model.seq_len splits into 2c chunks and this rank holds chunks r and 2c-1-r
// (context_rows, core/parallel_layout.h), T/c rows of each sequence, in that order. Everything
// per token runs on those rows (the residual stream, norms, GEMMs, the loss; with SP they split
// over tp as before); positions (RoPE, wpe) are the rows' places in the sequence. Attention
// all-gathers the layer's qkv over cp into the whole sequence's (B, T, Ql), computes this rank's
// query rows against every key (the document mask and window in global positions), and in the
// backward gathers again and reduce-scatters the whole-sequence dqkv back to each rank's rows.
// A micro-batch's mean loss divides by the whole rows' counted targets, so the ranks' losses
// and gradients sum over cp to one process's (the engine sums them: dp x cp reduces gradients).
// The rows passed in are always whole (B, T+1): each rank reads its own positions of them.
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "core/config.h"
#include "model/memory_plan.h"
#include "model/params.h"
#include "model/rows.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/op_set.h"
#include "parallel/mappings.h"

namespace myriad {

template <OpSet Ops>
class GptModel {
 public:
  using Act = typename Ops::Act;      // activations and their gradients
  using Param = typename Ops::Param;  // the weights the kernels read
  template <class T>
  using Buffer = typename Ops::template Buffer<T>;

  // par: the tensor-parallel group; nullptr (or a group of one) = the whole model here. The tp
  // group's size must equal parallel.tp. part: the layers (in chunks) this pipeline rank holds,
  // default the whole model. flat_size: elements of the parameter and gradient buffers, at
  // least layout().total(): data parallelism pads them so that its buckets divide evenly.
  explicit GptModel(const Config& cfg, const parallel::ParallelContext* par = nullptr,
                    const ModelPart* part = nullptr, int64_t flat_size = 0, Ops ops = {});
  const Ops& ops() const { return ops_; }

  const ParamLayout& layout() const { return layout_; }
  // This rank's share of the routed experts in `par` (expert parallelism), and where the layout
  // puts them: after the data-parallel group's buckets (params.h, runtime/data_parallel.h).
  static ExpertShard expert_shard(const parallel::ParallelContext* par) {
    if (!par) return {};
    return {par->ep_rank(), par->ep_size(), parallel::group_size(par->weights_dp())};
  }
  const ModelPart& part() const { return part_; }
  Param* params() { return params_.data(); }  // (flat_size) this rank's layout, then padding
  float* grads() { return grads_.data(); }    // (flat_size) same layout as params, fp32
  int64_t num_params() const { return layout_.total(); }
  void zero_grads();

  // ---- a training step's weights ----
  // Holds the weights fixed until the guard ends: the engine's train_step holds it over the step's
  // micro-batches, before the update. Meanwhile, where the step would cast an FP8 weight more than
  // twice (model::casts_block_weights_once, casts_head_once: micro-batches, full recompute, the LM
  // head's row chunks), each layer casts its weights once, at its first GEMM of the step, and every
  // GEMM of the step reads those casts (fp8::WeightCast): the bytes each call would have made.
  class FixedWeights {
   public:
    explicit FixedWeights(bool* fixed) : fixed_(fixed) { *fixed_ = true; }
    ~FixedWeights() { *fixed_ = false; }
    FixedWeights(const FixedWeights&) = delete;
    FixedWeights& operator=(const FixedWeights&) = delete;

   private:
    bool* fixed_;
  };
  [[nodiscard]] FixedWeights fix_weights() {
    ++weights_epoch_;
    return FixedWeights(&weights_fixed_);
  }

  // ---- one micro-batch through one chunk (what a pipeline schedule runs) ----
  // Forward of local chunk c for micro-batch mb of B <= micro_batch rows. rows.tokens (B, T+1),
  // host memory, feed the embedding (the model's first chunk) and the loss (its last); input
  // (R, C) is the previous virtual stage's output otherwise. rows.doc_starts (B, T+1), when set,
  // keeps every chunk's attention inside documents. The chunk keeps what its backward needs
  // until backward_chunk(c, mb) (or drop_chunk). On the model's last chunk the mean loss over
  // the B*T tokens (those counted: data.document_end_loss) is added to the loss that
  // take_loss() reads. grad_scale: the backward's that
  // follows (> 0; the loss's gradient is then made in the same pass), or 0 for a forward only.
  void forward_chunk(int c, int mb, int B, Rows rows, const Act* input, float grad_scale);
  // The sum of the mean losses added since the last call, read from the op set's memory (on a
  // GPU the one wait for the device of a training step), then cleared.
  double take_loss();
  // The chunk's output (R, C) for the next virtual stage; valid until its backward.
  const Act* chunk_output(int c, int mb) const;
  // Backward of chunk c for micro-batch mb: doutput (R, C) is the gradient of its output (null
  // on the last chunk: the loss makes it, as grad_scale * mean-token-loss, grad_scale the
  // forward's); the gradient of its input goes to dinput (R, C) (null on the first chunk).
  // Parameter gradients are ADDED.
  void backward_chunk(int c, int mb, const Act* doutput, Act* dinput, float grad_scale);
  // Forgets a forward-only micro-batch.
  void drop_chunk(int c, int mb);
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  // Elements of one activation passed between stages: R x C.
  int64_t boundary_elems(int B) const;

  // ---- the whole model in this process (pp = 1) ----
  // Forward and backward of one micro-batch. tokens (B, T+1): inputs are [:, :T], targets the
  // next tokens [:, 1:]. Gradients of grad_scale * mean-token-loss are ADDED to grads(), so a
  // step over k micro-batches passes grad_scale = 1/k. Returns the mean loss over B*T tokens
  // (those counted).
  // With TP every rank passes the same tokens and gets the same loss.
  float forward_backward(Rows rows, int B, float grad_scale);
  // Forward only: the mean loss over the B*T tokens (those counted) of rows.tokens (B, T+1).
  float loss(Rows rows, int B);
  // Logits of the last position of each row of tokens (B, T) -> (B, Vp) into out, for sampling
  // (T <= seq_len). With TP the vocabulary shards are gathered: every rank gets all Vp.
  void last_logits(const int32_t* tokens, int B, int T, float* out);
  // The logits (B, T, Vp) of the last forward; with TP this rank's (B, T, Vp/t) columns.
  // Null when the head ran in several row chunks (train.logits_mib smaller than the logits).
  const Act* logits() const { return last_logits_; }

  // With sequence parallelism the replicated tensors' gradients are partial sums of this
  // rank's tokens: sums them over the tp group on [begin, end) of the flat buffer (the engine
  // calls it on the ranges it updates). A no-op otherwise.
  void finish_grads(int64_t begin, int64_t end);
  bool partial_replicated_grads() const { return sp_cfg_; }

  // Model FLOPs per token of a training step, 6N + 12 L d T_att (MFU's numerator), global.
  double flops_per_token() const;

  // The routing of the training forwards (those with a backward to follow; a recompute's refill
  // is not counted again) since the last call, per MoE layer held here, in layer order: rows per
  // expert, and the balance and z losses summed over the micro-batches. Cleared by the call.
  struct RouteStats {
    int64_t layer = 0;
    std::vector<int64_t> counts;  // (E)
    double aux = 0, z = 0;
    int64_t dropped = 0;  // rows past an expert's capacity
    int64_t micro_batches = 0;
  };
  std::vector<RouteStats> take_route_stats();

  int tp_rank() const { return tpr_; }
  int tp_size() const { return tps_; }

 private:
  // Activations saved for backward (per layer, each (B,T,·) unless noted; widths are this
  // rank's: Ql = (Hl + 2 Hkvl) D, Cl = Hl D, Fl features, Pl = Fl or 2 Fl). train.recompute
  // decides which a slot keeps per layer and which live once in shared_, refilled by recompute()
  // just before a layer's backward:
  //   none: all per layer (in FP8 the norms' outputs as their casts, LayerActs::ln1_fp8, their
  //   bf16 a transient in shared_);  norms: all but the norms' outputs;  selective: neither those nor fc
  //   (the fc GEMM runs again);  full: only `in` per layer (LN1 and the layer up to the fc GEMM
  //   run again).
  // The norms' outputs (ln1, ln2: the QKV and fc GEMMs' inputs) are refilled by every mode but
  // none: their statistics are kept, and the norm runs again from in and mid (the same bits as
  // the forward's fused residual + norm), gathered over tp with sp; two (B,T,C) for the model,
  // not two per layer and micro-batch in flight, for two memory-bound passes a layer.
  // A dense MLP's activation output is kept by none: it lives in act_ (step scratch), which the
  // projection reads at once; the backward recomputes it from fc.
  enum class Recompute { kNone, kNorms, kSelective, kFull };
  struct LayerActs {
    Act *in;              // (B,T,C) the layer's input: the residual stream (R rows)
    Act *ln1;             // (B,T,C) (all N rows, gathered with SP)
    float *ln1_mean, *ln1_rstd;  // (R), (R) (the mean LayerNorm's only)
    Act *qkv;             // (B,T,Ql) laid out (Hkvl,G+2,D), q and k normed (qk_norm) and rotated with RoPE
    Act *qkv_raw;         // (B,T,Ql) with model.qk_norm: the QKV GEMM's output, before the norm
    float *qk_rstd;       // (B,T,Hl+Hkvl) or (B,T,2): the norm's rstds
    float *saved;         // what attention keeps for backward (Ops::attention_saved floats)
    Act *atty;            // (B,T,Cl) attention output before the projection, (Hl,D)
    Act *mid;             // (B,T,C) residual after attention (sequential block only; R rows)
    Act *ln2;             // (B,T,C) (sequential block only)
    float *ln2_mean, *ln2_rstd;  // (R), (R)
    Act *fc;              // (B,T,Pl) the fc GEMM's output: before GELU, or SwiGLU's (Fl,2) pairs
    Act *act;             // (B,T,Fl) the activation's output: act_, for the forward only
    // An MoE layer's instead of fc and act (docs/notes/moe.md; M = B T k routed rows, in expert
    // order): kept with the attention half (`set`): the router's logits and weights, the routes,
    // the experts' output rows; with the MLP's (`mlp`): the experts' and shared experts' fc and act.
    float *logits;        // (B,T,E) the router's, fp32
    float *weights;       // (B,T,k) each token's experts' weights, best first
    int32_t *choice;      // (B,T,k) each token's experts, best first
    int32_t *order, *pos; // (M) the slots (n k + j) in expert order; (M) each slot's row in it
    std::vector<int64_t> counts;  // (E) rows per expert, on the host
    // Expert parallelism (ep ranks, El = E / ep experts each): the rows each rank sends this
    // rank's experts, (ep, El) on the host, and their sums per local expert (El), the grouped
    // GEMMs' counts; without it, local = counts. The experts' rows below are carved for the
    // balanced share, M of them (all there can be without ep); a step whose experts here get more
    // (expert_acts) takes them from a buffer of its own that grows (spill, kept for later steps).
    std::vector<int64_t> received, local;
    // With tp: each rank routes its part of the tokens (moe_rows); the micro-batch's choice per
    // expert over every part (E), for the balance loss's gradient.
    std::vector<int64_t> chosen;
    Act *ys;              // (M,C) the experts' outputs, back in this rank's expert order
    Act *xin;             // (M,C) the rows the local experts take, in their order (expert, then rank)
    Act *xfc, *xact;      // (M,2Fe) the experts' fc GEMMs' output, (M,Fe) their SwiGLU
    int spill = -1;       // its index in spills_ (shared by the layers that share these buffers)
    Act *sfc, *sact;      // (B,T,2Fs) the shared experts' fc, (B,T,Fs) their SwiGLU
    // train.precision = "fp8": what the forward keeps of each FP8 GEMM's input (ops/fp8.h Kept):
    // the scalars of every input's cast (the backward casts x^T without measuring it again);
    // with recompute none also the norms' outputs' transposed casts, (C, N) bytes each, in place
    // of their bf16 (ln1 and ln2 then point to one transient pair, shared_'s). The parallel
    // block's MLP reads ln1's. act's amax is measured by the activation's kernel as it writes act.
    fp8::Kept ln1_fp8, atty_fp8, ln2_fp8, act_fp8;
  };
  // One micro-batch in flight through one chunk: what its backward needs.
  struct Slot {
    int mb = -1, B = 0;   // the micro-batch held (-1: free) and its rows
    Buffer<Act> storage;  // the layers' activations, out and lnf
    Buffer<float> stats;  // the LayerNorms' means and rstds, attention's saved floats, the routers'
    Buffer<int32_t> ids;  // the MoE layers' routes
    Buffer<float> fp8_scalars;  // fp8: the layers' kept casts' scalars (fp8::kept_floats each, 4 a layer)
    Buffer<uint8_t> fp8_bytes;  // fp8 with recompute none: the layers' ln1 and ln2 casts, (C, N) bytes each
    std::vector<LayerActs> layers;  // the chunk's layers, in order
    Act* out;                       // (B,T,C) the chunk's output, R rows
    Act* lnf;                       // head: (B,T,C) (all N rows); after a training forward its
                                    // gradient (head_forward ran the head's backward)
    float *lnf_mean, *lnf_rstd;     // head: (R), (R)
    Buffer<Act> logits;             // head: (head_rows_, Vp/t), one row chunk at a time
    Buffer<float> losses, ce_max, ce_sum, ce_parts;  // head: (B,T) each, parts (B,T,2) (TP)
    float head_scale = 0;  // head: the grad_scale of the gradients its forward made (0: none)
    typename Ops::Tokens inputs, targets;  // (B,T) contiguous copies
    typename Ops::Tokens doc_starts;       // (B,T) the rows' document starts, when `documents`
    bool documents = false;
    std::vector<ContextRows> cp_ranks;     // cp: every rank's rows of the micro-batch (context_assignment)
    int counted = 0;  // head: the positions the mean loss is over (data.document_end_loss)
  };
  struct Chunk {
    int l0, l1;              // layers [l0, l1)
    bool embedding, head;    // holds the model's first / last virtual stage
    std::vector<std::unique_ptr<Slot>> slots;  // grows to the schedule's in-flight bound
  };
  Slot& acquire(Chunk& ch, int mb, int B);
  // Points l into activations `a` and floats `st`, advancing them: what a slot keeps per layer
  // (`set`: everything but `in`, fc and the norms' outputs; `mlp`: fc; `norms`: ln1 and ln2).
  // Counts only when a and st are null (a slot's size).
  // This rank's shapes as the memory plan (model/memory_plan.h) takes them.
  model::GptMemoryShape memory_shape() const;
  // `dense` and `moe`: the dense MLP's and the MoE MLP's tensors (a layer holds one; the
  // recompute set both when the model has both). ints and id: the routes.
  void carve_layer(LayerActs& l, int64_t& acts, int64_t& floats, int64_t& ints, Act* a, float* st, int32_t* id,
                   bool set, bool mlp, bool dense, bool moe, bool norms) const;
  Slot& held(int c, int mb) const;
  // The shape of the forward or backward about to run: N = B*T rows, R of them here.
  void set_shape(int B, int T);
  // Runs chunk ch on slot s: rows.tokens (row stride `stride`) for the embedding and targets,
  // input (R, C) otherwise; the head's logits (B, T, Vp/t) and, with targets, its losses.
  void forward(Chunk& ch, Slot& s, Rows rows, int64_t stride, const Act* input, bool targets, float grad_scale);
  // Where slot s's positions' documents start (B,T), in the op set's memory; null: one each.
  static const int32_t* doc_starts(const Slot& s) { return s.documents ? s.doc_starts.data() : nullptr; }
  // The rows' document starts into s.doc_starts (B,Tw), and s.documents.
  void load_documents(Slot& s, Rows rows, int64_t stride);
  // The head's targets into s.targets (B,T), and s.counted.
  void load_targets(Slot& s, Rows rows, int64_t stride);
  // Layer l from its LN1 output (local rows written) up to the MLP's GELU: every activation its
  // backward reads. The MLP projection and the residual add that follow make the next input.
  void layer_forward(const Slot& s, int64_t l, LayerActs& a);
  // Refills what train.recompute dropped of slot s's layer l (l - ch.l0 of its layers).
  void recompute(const Chunk& ch, Slot& s, int64_t l);
  void backward(Chunk& ch, Slot& s, const Act* doutput, Act* dinput, float grad_scale);
  // The MLP of layer l on its input `in` (all N rows), dense or MoE:
  //   mlp_forward   up to what its output needs: the dense fc GEMM and activation; an MoE
  //                 layer's routing and experts (`route`: false refills fc and act only, for
  //                 selective recompute) and the shared experts' fc and activation
  //   mlp_output    the branch's output (R,C) into out (=): the dense projection (row-parallel);
  //                 the MoE's shared projection plus the routed experts' weighted combine
  //   mlp_backward  from dout (all rows; dlocal its R local rows) the parameter gradients (+=)
  //                 and the gradient of `in` into dln_ (=)
  void mlp_forward(int64_t l, LayerActs& a, const Act* in, bool route);
  void mlp_output(int64_t l, const LayerActs& a, Act* out);
  void mlp_backward(int64_t l, const LayerActs& a, const Act* in, const Act* dout, const Act* dlocal, float grad_scale);

  // Pointers into a flat buffer (params or grads) for each tensor; null where absent (layers
  // of other pipeline ranks too).
  template <class T>
  struct LayerTensors {
    T *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
    T *q_norm_w, *k_norm_w;  // model.qk_norm's
    T *router_w, *router_bias, *experts_fc_w, *experts_proj_w, *shared_fc_w, *shared_proj_w;  // an MoE layer's
  };
  template <class T>
  struct Tensors {
    T *wte, *wpe, *lnf_w, *lnf_b;
    T *head;  // the LM head: lm_head, or wte when tied
    std::vector<LayerTensors<T>> layers;
  };
  template <class T>
  Tensors<T> tensors_in(T* base) const;

  // The TP pieces (used only when tp_ is set); N = B*T rows, R = rows of the residual stream
  // here (N, or N/t with SP).
  // Where a LayerNorm writes its R rows of a (N, C) buffer that is then gathered.
  Act* local_rows(Act* full, int64_t width) const;
  // The input of a column-parallel GEMM: gathers `full`'s local rows (SP); returns full.
  void column_input_forward(Act* full, int64_t width);
  // Its gradient: dfull (N, width) holds this rank's partial sum; all-reduced (replicated) or
  // reduce-scattered into local_rows(dfull) (SP). Returns the gradient of the R local rows.
  Act* column_input_backward(Act* dfull, int64_t width);
  // out (R, OC) = reduction over the ranks of inp (N, IC) @ w^T, + bias.
  // keep: what an FP8 GEMM keeps of inp's cast (kept() of a LayerActs field); wcast: w's
  // (weight_cast).
  void row_parallel_forward(Act* out, const Act* inp, const Param* w, const Param* b, int IC, int OC,
                            const fp8::Kept* keep, const fp8::WeightCast* wcast);
  // The gradient of the row-parallel output as the GEMM needs it: dout (R, OC) itself, or
  // gathered into full_ (SP).
  const Act* row_parallel_dout(const Act* dout, int OC);
  // Backward of row_parallel_forward: dout_full from row_parallel_dout, dout the local rows;
  // dinp (=), through the MLP's activation when pre (its input, the fc GEMM's output) is given.
  void row_parallel_backward(Act* dinp, float* dw, float* db, const Act* dout_full, const Act* dout,
                             const Act* inp, const Param* w, int IC, int OC, const Act* pre, const fp8::Kept* kept,
                             const fp8::WeightCast* wcast, const fp8::Kept* dinp_amax = nullptr);
  // A LayerActs' kept cast as the linears take it: null when the block's GEMMs are not FP8.
  static const fp8::Kept* kept(const fp8::Kept& k) { return k.scalars ? &k : nullptr; }
  // Layer l's weight i (model::fp8_layer_weights' order: 0 QKV, 1 the attention's projection,
  // 2 and 3 the MLP's or the shared experts') as its GEMMs take it, where the model holds its
  // casts: made at the layer's first call of the step (weights fixed), else for this call alone
  // (an evaluation's forward: so the op set's cast buffers never take a weight the plan leaves
  // out of them). Null (the op set casts per call) without held casts or FP8 GEMMs.
  const fp8::WeightCast* weight_cast(int64_t l, int i);
  // The LM head's weight cast for a head_forward's row chunks (null as above): made once for the
  // step, or, the weights not fixed, once for this call.
  const fp8::WeightCast* head_cast();
  // Lays out the weights' casts (model::weight_cast_bytes) of the layers held here and the head.
  void carve_weight_casts();
  // Where FP8's amaxes meet under tensor parallelism (fp8::AmaxGroup): the tp group's all-gather.
  fp8::AmaxGroup amax_group() const;
  // Runs a region of parallel/mappings.h (fp32 buffers) on activations: `in` (n_in elements)
  // and `out` (n_out) themselves when Act is float, else fp32 copies of them in wide_ (out
  // narrowed back after), laid out alike when one lies inside the other. region(in, out).
  template <class Region>
  void tp_region(const Act* in, int64_t n_in, Act* out, int64_t n_out, Region region);
  // partial (N, width), this rank's partial sum -> out: the sum over the ranks, all N rows
  // (ReduceFromTp; in place) or this rank's R (ReduceScatterToSequence).
  void reduce_partial(Act* partial, Act* out, int64_t width);
  // dlocal (R, width) of every rank -> dfull (N, width) (ReduceScatterToSequence's backward).
  void gather_rows(const Act* dlocal, Act* dfull, int64_t width);
  void* stream() const { return ops_.comm_stream(); }
  // The lookup by vocabulary rows: tensor-parallel, or without a position table (RoPE).
  void embedding_forward_tp(const Slot& s, Act* out);
  void embedding_backward_tp(const Slot& s, const Act* dresid);
  // The LM head, the loss and (grad_scale > 0) the head's backward, over row chunks of s.lnf.
  void head_forward(Slot& s, float grad_scale);
  // The losses of rows [r, r + n) from their logits (n, Vl) and, when dloss > 0, the logits'
  // gradient in place: fused (one pass), or vocab-parallel over tp (the row maxima and the sums of
  // exps combined over the ranks, the target logit from the rank that owns it).
  void crossentropy(Slot& s, Act* logits, int r, int n, float dloss);

  Ops ops_;
  Config cfg_;
  parallel::Communicator* tp_ = nullptr;  // null without TP (t = 1)
  int tpr_ = 0, tps_ = 1;
  bool sp_cfg_ = false;  // sequence parallelism requested (and t > 1)
  ModelPart part_;
  ParamLayout layout_;
  int64_t L_, C_, H_, maxT_, maxB_, V_, Vp_, window_;
  int64_t head_rows_ = 0;  // rows of logits the head holds at once (train.logits_mib; at most maxB_ maxT_)
  bool documents_;          // data.document_mask: slots hold the rows' document starts
  bool document_end_loss_;  // data.document_end_loss
  int64_t D_, G_;  // head size; query heads per key/value head
  // This rank's query heads, key/value heads, attention width (Hl D), QKV width, MLP features,
  // MLP pre-activation width, vocab rows, and its first vocab row.
  int64_t Hl_, Hkvl_, Cl_, Ql_, Fl_, Pl_, Vl_, v0_;
  Norm norm_;
  QkNorm qk_norm_;  // the queries' and keys' norm (kNone: none)
  Mlp mlp_;
  // Expert parallelism: rows in this rank's expert order (rows, width) to the ranks of their
  // experts, arriving in the local experts' order (dispatch), and the reverse (collect); the
  // layer's `received` and `local` counts say how many go where. Through xr_.
  // Each in two halves: start (the exchange issued, returned), then finish (waited for, and the
  // arrivals ordered); moe.overlap_dispatch runs the shared experts' GEMMs in between.
  comm::WorkPtr dispatch_start(const LayerActs& a, const Act* rows, int64_t width);
  void dispatch_finish(const LayerActs& a, comm::WorkPtr& sent, Act* out, int64_t width);
  comm::WorkPtr collect_start(const LayerActs& a, const Act* rows, Act* out, int64_t width);
  void collect_finish(comm::WorkPtr& sent) { if (sent) sent->wait(); }
  // With moe.overlap_dispatch off, each exchange is waited for as soon as it is issued.
  void overlap_or_wait(comm::WorkPtr& w) { if (!overlap_dispatch_ && w) w->wait(); }
  bool overlap_dispatch_ = true;
  // The permutation between the rows as they arrive (rank, then expert) and the experts' order
  // (expert, then rank), into perm_: [0, n) to the experts' order, [n, 2n) back (n: arrivals);
  // loaded by dispatch_finish, read back by the collect that follows it.
  void load_exchange_order(const LayerActs& a);
  // The buffers of the rows a's experts take this step (xin, xfc, xact): a's carved ones when
  // they hold them, else its spill buffer, grown to fit; and the exchange's scratch grown alike.
  // Resolved at each use: a spill buffer moves when it grows.
  struct ExpertActs {
    Act *xin, *xfc, *xact;
  };
  ExpertActs expert_acts(const LayerActs& a);
  int64_t arrivals(const LayerActs& a) const {
    return std::accumulate(a.local.begin(), a.local.end(), int64_t(0));
  }
  // After a route: the counts of the rows each rank sends this one (LayerActs::received, local).
  void exchange_counts(LayerActs& a);
  // With tp, an MoE layer's routed experts work on this rank's part of the N rows, [first, end):
  // the router, the route, the exchange and the combine see only those; the shared experts are
  // split over tp as the dense MLP (all rows, a share of the features), and the layer's output
  // is one partial sum reduced over tp as a row-parallel GEMM's.
  std::pair<int, int> moe_rows() const {
    return {static_cast<int>(int64_t(N_) * tpr_ / tps_), static_cast<int>(int64_t(N_) * (tpr_ + 1) / tps_)};
  }
  // With tp or cp, the route's balance and z losses over the micro-batch, from every rank's part:
  // the choice's counts (into a.chosen) and score sums, and the z-loss's sum, summed over tp and cp.
  void balance_over_parts(LayerActs& a, Routing& r, int rows);
  // The tensors whose gradient each tp rank sums over its own tokens or heads only, completed by
  // finish_grads(): with sequence parallelism every replicated tensor; always the query and key
  // norms (model.qk_norm = "head": each rank's heads) and an MoE layer's router (and its routed
  // experts when they are not split over ep).
  bool partial_over_tp(const ParamSpec& p) const;
  // A mixture of experts: the router, the experts per layer E, per token k, each expert's
  // features Fe and the shared experts' Fs (0: none).
  Router router_;
  int64_t E_, k_, Fe_, Fs_;  // Fs_: this rank's shared features (split over tp as the dense MLP's)
  bool rope_;
  Gemm gemm_;       // the block's linears (train.precision)
  Gemm head_gemm_;  // the LM head's: bf16 unless train.fp8_lm_head
  // FP8 with recompute none keeps the norms' outputs as their casts (LayerActs::ln1_fp8 ...), not
  // bf16: per-tensor scaling only (model::keeps_norm_casts, the memory plan's rule).
  bool norm_casts_ = false;
  int64_t micro_batches_ = 1;  // a step's on this rank (the memory plan's, for the weights' casts)
  // The GEMMs in the current forward or backward: gemm_ (head_gemm_), except where its tokens are
  // not a multiple of 16 (sampling a prompt), which cuBLASLt's FP8 GEMMs cannot take: bf16 there.
  // Training shapes are checked when the model is built.
  Gemm block_gemm() const { return N_ % 16 == 0 ? gemm_ : Gemm::kBf16; }
  Gemm head_gemm() const { return N_ % 16 == 0 ? head_gemm_ : Gemm::kBf16; }
  bool parallel_block_;
  Recompute recompute_;

  // The current forward's or backward's shape: N = B*T rows, R rows of the residual stream
  // here, the first of them at row r0 of the micro-batch; sp_ when it runs sequence-parallel.
  // T is this rank's tokens of each row, Tw the row's whole length (T x cp).
  int B_ = 0, T_ = 0, Tw_ = 0, N_ = 0, R_ = 0, r0_ = 0;
  bool sp_ = false;

  // Context parallelism: the group (null: cp = 1), this rank's place in it, the whole sequence's
  // length (maxT_ = seqT_ / cps_ are this rank's), and the current micro-batch's rows of a
  // sequence: every rank's (ranks_, its slot's cp_ranks, chosen by the micro-batch's documents
  // at its forward) and this rank's (rows_).
  parallel::Communicator* cp_ = nullptr;
  int cpr_ = 0, cps_ = 1;
  int64_t seqT_;
  ContextRows rows_;
  const ContextRows* ranks_ = nullptr;
  const ContextRows* cp_rows() const { return cp_ ? &rows_ : nullptr; }
  // Slot s's micro-batch's rows into rows_ and ranks_ (cp only).
  void use_rows(const Slot& s) {
    if (cp_) ranks_ = s.cp_ranks.data(), rows_ = s.cp_ranks[cpr_];
  }
  Buffer<Act> cp_qkv_, cp_dqkv_;  // (B,Tw,Ql) the whole sequence's qkv and its gradient
  // (cp,B,T,Hkvl,2,D) each rank's rows' keys and values as the collectives move them: Act in the
  // gather (its first half when Act is bf16), fp32 in the gradients' reduce-scatter.
  Buffer<float> cp_pack_;
  // local (B,T,Ql), this rank's rows of layer l of slot s's qkv -> cp_qkv_: its rows whole, the
  // other ranks' rows' keys and values (their queries are not read here). In two halves: start
  // packs this rank's keys and values and issues the all-gather; finish waits and places every
  // rank's rows. Nothing happens when cp_qkv_ holds that layer already (cp_holds_: a backward
  // right after its forward, or after full recompute's refill); every chunk's forward forgets it.
  comm::WorkPtr gather_start(const Slot& s, int64_t l, const Act* local);
  void gather_finish(const Slot& s, int64_t l, const Act* local, comm::WorkPtr& sent);
  void gather_sequence(const Slot& s, int64_t l, const Act* local) {
    comm::WorkPtr w = gather_start(s, l, local);
    gather_finish(s, l, local, w);
  }
  std::tuple<const Slot*, int, int64_t> cp_holds_{nullptr, -1, -1};
  // parallel.overlap_cp: the backward starts a layer's gather before its MLP's backward, waited
  // for before its attention's (off: at once; the same bits).
  bool overlap_cp_ = true;
  // cp_dqkv_ (B,Tw,Ql), this rank's terms for every row -> dlocal (B,T,Ql) (=): its rows' query
  // gradients, and their keys' and values' summed over the ranks.
  void scatter_sequence_grad(Act* dlocal);
  // The host's ids of rows `host` (B rows `stride` apart) at this rank's positions, shifted by
  // `shift` (1: the targets): `host` + shift itself without cp (row stride `stride`), else packed
  // into buf (row stride T_). Returns the pointer and its row stride.
  std::pair<const int32_t*, int64_t> rank_ids(const int32_t* host, int64_t stride, int shift,
                                             std::vector<int32_t>& buf) const;

  Buffer<Param> params_;
  Buffer<float> grads_;
  Tensors<Param> p_;  // into params_
  Tensors<float> g_;  // into grads_
  std::vector<Chunk> chunks_;
  const Act* last_logits_ = nullptr;  // logits() of the whole-model path

  // train.recompute's shared activations (LayerActs whose kept pointers are null; in FP8 under
  // none the norms' outputs' bf16, a transient), and whose
  // they hold now: (slot, micro-batch, layer); written by every forward and recompute().
  Buffer<Act> shared_acts_;
  Buffer<float> shared_stats_;
  LayerActs shared_{};
  std::tuple<const Slot*, int, int64_t> shared_holds_{nullptr, -1, -1};

  Buffer<double> loss_;  // (1) the sum of the mean losses since take_loss()

  // Scratch shared by every forward and backward (one runs at a time).
  Buffer<Act> tmp_;     // (B,T,C) a branch's output (attention projection) before the residual add
  Buffer<Act> tmp2_;    // (B,T,C) the MLP's output (plus the attention's, parallel block)
  Buffer<Act> full_;    // (B,T,C) TP scratch: partial sums, gathered gradients
  Buffer<float> wide_;  // (2,B,T,C) TP with a narrower Act: the regions' fp32 copies
  Buffer<Act> dresid_;  // (B,T,C) gradient of the residual stream
  Buffer<Act> dln_, datty_, dqkv_, dfc_;  // (B,T,C) (B,T,Cl) (B,T,Ql) (B,T,Pl)
  // fp8: dfc_'s cast scalars, its amax written by the activation's backward as it writes dfc_
  // (fp8::kept_floats), so the fc GEMM's backward casts it without an amax pass.
  Buffer<float> dfc_scalars_;
  fp8::Kept dfc_fp8_;
  // FP8 where the step casts its weights once: each held layer's casts (indexed by layer, in
  // model::fp8_layer_weights' order) and the head's, in cast_bytes_ and cast_scales_; the epoch
  // of fix_weights() each was made in (-1: none).
  struct LayerCasts {
    std::vector<fp8::WeightCast> w;
    std::vector<std::pair<int64_t, int64_t>> shape;  // (OC, IC) each
    int64_t epoch = -1;
  };
  std::vector<LayerCasts> casts_;
  fp8::WeightCast head_cast_{};
  int64_t head_epoch_ = -1;
  Buffer<uint8_t> cast_bytes_;   // each weight's W (OC, IC) then W^T (IC, OC)
  Buffer<float> cast_scales_;    // fp8::weight_cast_floats each
  bool weights_fixed_ = false;   // fix_weights()' guard is alive
  int64_t weights_epoch_ = 0;    // fix_weights() calls so far
  Buffer<Act> act_;     // (B,T,Fl) a dense MLP's activation output, from its forward to its projection
  Buffer<Act> dout_, din_;  // (R,C) the chunks' boundary gradients of forward_backward
  // An MoE layer's scratch (M = B T k rows, Mx = ep M): the rows in this rank's expert order
  // before they go to their experts' ranks (ep > 1), their gradients, the experts' fc gradient,
  // the expert-parallel exchange's two buffers (ep > 1), the shared experts' fc gradient; the
  // exchange's row permutations (Mx each: to the experts' order and back).
  Buffer<Act> xs_, dys_, dxs_;  // (M,C) each
  Buffer<Act> dxfc_;            // (rows,2Fe), rows the most the experts here got so far (M at first)
  Buffer<Act> xr_;              // (2,rows,C): arrivals, then the rows leaving
  int64_t exchange_rows_ = 0;   // the rows dxfc_, xr_ and perm_ hold
  std::vector<Buffer<Act>> spills_;  // LayerActs::spill's buffers, (rows, C + 3 Fe) each once used
  Buffer<Act> dsfc_;            // (B,T,2Fs)
  typename Ops::Tokens perm_;   // (2,rows)
  // The expert-parallel group (null: ep = 1), this rank's place in it, and its experts per layer.
  parallel::Communicator* ep_ = nullptr;
  int epr_ = 0, eps_ = 1;
  int64_t El_ = 0;
  Buffer<float> dlogits_, dweights_;  // (B,T,E), (B,T,k)
  Buffer<int32_t> shared_ids_;        // train.recompute's shared routes
  std::vector<RouteStats> route_stats_;  // take_route_stats()'s, one per MoE layer held here
  bool count_routes_ = false;            // the forward running is a training one, not a refill
};

// The CPU GPT, fp32: the oracle every other op set and every layout is tested against.
using Gpt = GptModel<cpu::CpuOps>;
extern template class GptModel<cpu::CpuOps>;

}  // namespace myriad
