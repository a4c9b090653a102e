// The GPT's parameters: names, global shapes and their places in one flat buffer.
//
// Canonical global layout (what checkpoints store and every parallel layout slices). C =
// d_model, H = heads, D = C / H, Hkv = kv_heads (GQA), G = H / Hkv, F = the MLP's features:
//   wte          (Vp, C)    token embedding (and the LM head when tied); rows >= vocab_size are
//                           padding, zero at init, never in the loss
//   wpe          (P, C)     learned positions (P = model.positions, or seq_len); absent with rope
//   h.<l>.ln1.w / ln1.b           (C)      (no .b for RMSNorm)
//   h.<l>.attn.qkv.w  ((H+2Hkv)D, C)  rows ordered (Hkv, G+2, D): key/value head g owns the rows
//   h.<l>.attn.qkv.b  ((H+2Hkv)D)     of its G query heads, then its k, then its v, so a split
//                                     by key/value heads is contiguous (G = 1: (H, 3, D))
//   h.<l>.attn.q_norm.w, k_norm.w  with model.qk_norm: (D) each ("head"), or (H D) and (Hkv D)
//                                  in the canonical head order ("all")
//   h.<l>.attn.proj.w (C, H D)    input columns ordered (H, D)
//   h.<l>.attn.proj.b (C)
//   h.<l>.ln2.w / ln2.b           (C)      absent with the parallel block (one norm feeds both)
//   h.<l>.mlp.fc.w    (F, C), SwiGLU (2F, C) rows ordered (F, 2): feature f's gate, then its up
//   h.<l>.mlp.fc.b    (F or 2F)
//   h.<l>.mlp.proj.w  (C, F)    h.<l>.mlp.proj.b (C)
//   an MoE layer (model.layer_is_moe(l)) holds instead, without biases (E experts of Fe
//   features, shared experts of Fs in all):
//   h.<l>.mlp.router.w        (E, C)
//   h.<l>.mlp.router.bias     (E)         with model.router_bias: added to the scores for the choice
//                                         only; not trained (ParamSpec::trained), moved by moe.bias_rate
//   h.<l>.mlp.experts.fc.w    (E 2Fe, C)  expert e's rows [2Fe e, 2Fe (e+1)), ordered (Fe, 2) as fc's
//   h.<l>.mlp.experts.proj.w  (E C, Fe)   expert e's rows [C e, C (e+1))
//   h.<l>.mlp.shared.fc.w     (2Fs, C)    h.<l>.mlp.shared.proj.w (C, Fs)   (when Fs > 0)
//   Stacked by expert along the rows, so a split by whole experts (expert parallelism) is a
//   row split, as the tensor-parallel ones are.
//   lnf.w / lnf.b     (C)
//   lm_head      (Vp, C)    the LM head when untied (model.tied_embeddings = false); padded as wte
// Biases (".b") exist only with model.bias = true. Linear weights are (out, in) as in PyTorch.
// Each layer's tensors are contiguous in the flat buffer, in layer order, so that a pipeline
// stage or a gradient bucket is one slice; an MoE model's routed experts excepted: they come
// after every other tensor (in layer order, the expert region), so that the experts, reduced
// over their own data-parallel group, are one slice too.
//
// Expert parallelism (degree e, rank q): experts.fc.w and experts.proj.w hold experts
// [q E/e, (q+1) E/e), rows split by whole experts (split_dim 0), in any tp layout.
//
// Tensor parallelism (TP degree t, rank r): a rank's layout holds the same tensors in the same
// order, each either whole (replicated) or its r-th of t equal contiguous blocks along one
// dimension (split_dim):
//   rows (0):    wte and lm_head (vocab-parallel, Vp/t rows), attn.qkv.w/.b (by key/value
//                heads: Hkv/t groups' (G+2, D) rows), mlp.fc.w/.b (F/t features' rows, a
//                SwiGLU feature's gate and up together)                column-parallel
//   columns (1): attn.proj.w (H/t heads' (D) columns), mlp.proj.w (F/t columns)   row-parallel
//   whole:       wpe, the LayerNorms, attn.proj.b, mlp.proj.b (added once after the reduction)
// `shape` and `numel` are the local shard's, `offset` its place in the rank's flat buffer;
// `global_shape` and `global_offset` place the shard in the canonical tensor (what checkpoints
// store). With t = 1 the shard is the whole tensor and the layout is the canonical one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace myriad {

// A range [begin, end) of element offsets in a rank's flat buffer (parameters, gradients and
// optimizer state share the layout). Here, with the layout, because every layer above slices it:
// gradient buckets and the sharded optimizer (optim/), checkpoints, the engines.
struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  // Spelled out: this header is also compiled as CUDA C++17.
  bool operator==(const FlatRange& o) const { return begin == o.begin && end == o.end; }
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // of this rank's shard (the global shape without TP)
  int64_t offset = 0;          // in the flat buffer (elements)
  int64_t numel = 0;           // of the shard
  bool decay = false;          // weight decay applies (matrices and embeddings, not biases/norms)
  double init_std = 0;         // normal(0, init_std) when > 0, else the constant init_value
  double init_value = 0;
  int64_t layer = -1;          // transformer layer, -1 for embeddings and the final norm
  std::vector<int64_t> global_shape;   // of the canonical tensor
  std::vector<int64_t> global_offset;  // of the shard inside it, per dimension
  int split_dim = -1;                  // the dimension TP splits; -1 = replicated on every rank
  // false: model state that no gradient moves and the optimizers leave alone, updated by a rule
  // of its own (an MoE router's expert bias); checkpointed as the weights are.
  bool trained = true;
  // A routed expert tensor of an MoE layer: split over the expert-parallel ranks by whole experts
  // (split_dim 0), held in the layout's expert region, reduced over the experts' data-parallel
  // group (core/parallel_layout.h).
  bool expert = false;

  bool replicated() const { return split_dim < 0; }
  // The canonical (row-major) element index of the shard's element i.
  int64_t global_index(int64_t i) const;
};

// The part of the model one pipeline rank holds: the layers of its chunks (virtual stages) and
// whether it holds the embedding (virtual stage 0: wte, wpe) and the head (the last virtual
// stage: lnf and the LM head, lm_head or the tied wte: then a second copy when the first and
// last stages are different ranks, kept equal by summing their gradients).
struct ModelPart {
  std::vector<std::pair<int, int>> chunks;  // [begin, end) layers of each local chunk, ascending
  bool embedding = true;
  bool head = true;
  static ModelPart whole(const Config& cfg);  // one chunk of every layer, embedding and head
  bool has_layer(int64_t layer) const;
};

// A rank's share of an MoE model's routed experts: expert-parallel rank `rank` of `size` holds
// experts [rank E/size, (rank+1) E/size) of every MoE layer. Their tensors form the flat
// buffer's expert region, after every other tensor, from the first multiple of `align` (the
// size of the group whose ZeRO buckets cover the region before it, so that their padding ends
// where the experts begin).
struct ExpertShard {
  int rank = 0, size = 1;
  int64_t align = 1;
};

class ParamLayout {
 public:
  // The layout of TP rank tp_rank of tp_size; (0, 1) is the canonical global layout.
  // tp_size must divide model.heads and the padded vocabulary. part: the tensors of those
  // layers (and embedding/head) only, in the same canonical order; null = the whole model.
  // experts: this rank's routed experts (an MoE model's expert tensors come last, in layer
  // order, in the expert region).
  explicit ParamLayout(const Config& cfg, int tp_rank = 0, int tp_size = 1,
                       const ModelPart* part = nullptr, ExpertShard experts = {});
  const std::vector<ParamSpec>& tensors() const { return tensors_; }
  const ParamSpec& find(const std::string& name) const;  // internal error when absent
  const ParamSpec* get(const std::string& name) const;   // null when absent
  int64_t total() const { return total_; }  // elements of this rank's flat buffer
  // [begin, total): the routed experts' tensors (empty at total for a dense model); the rest
  // of the buffer before it, up to the alignment's gap, holds every other tensor.
  FlatRange expert_region() const { return {expert_begin_, total_}; }
  int64_t dense_total() const { return dense_total_; }  // elements before the gap
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  // Weights of every matmul counted once (QKV, attention out, MLP, and the LM head: lm_head or
  // the tied embedding), the N of MFU's 6N: no biases, norms, position table or untied
  // embedding (a lookup); of an MoE layer's routed experts the k of E a token uses. Of the
  // global model.
  int64_t matmul_params() const { return matmul_params_; }
  int64_t vocab_size() const { return vocab_size_; }  // unpadded

  // The part of a shard that checkpoints store, placed in the stored tensor. The embedding (and
  // lm_head) is stored with its vocab_size real rows only: the padding depends on tp (a multiple of 128 x
  // tp), is zero and never trained, so leaving it out lets any layout load any other. `rows`
  // of the shard's leading dimension are stored (0: nothing to store).
  struct Stored {
    std::vector<int64_t> global_shape, offset, shape;
    bool empty() const;
  };
  Stored stored(const ParamSpec& p) const;

  // A rectangular piece of the stored tensor whose data is contiguous in the local shard,
  // starting at element local_begin (of the shard, row-major).
  struct StoredRegion {
    std::vector<int64_t> global_shape, offset, shape;
    int64_t local_begin = 0;
  };
  // The elements [begin, end) of p's local shard as pieces of the stored tensor: for a matrix a
  // partial first row, the whole rows, a partial last row (each omitted when empty); for a
  // vector one piece. The embedding's padding rows are dropped, so the pieces may hold fewer
  // than end - begin elements. A column shard's local row is a run of a global row at column
  // global_offset[1]. stored_regions(p, 0, p.numel) is {stored(p)}, or {} when that is empty.
  std::vector<StoredRegion> stored_regions(const ParamSpec& p, int64_t begin, int64_t end) const;

 private:
  std::vector<ParamSpec> tensors_;
  int64_t total_ = 0, dense_total_ = 0, expert_begin_ = 0;
  int64_t matmul_params_ = 0;
  int64_t vocab_size_ = 0;
  int tp_rank_ = 0, tp_size_ = 1;
};

// Fills the flat buffer: element i (canonical index) of tensor `name` is drawn from a
// counter-based generator keyed by (seed, name, i), so every layout, TP shards included,
// materializes its slice of the same global model.
void init_params(float* params, const ParamLayout& layout, int64_t seed);

// Whether p's rows are the padded vocabulary (wte, lm_head): checkpoints store vocab_size of them.
bool vocab_rows(const ParamSpec& p);

}  // namespace myriad
