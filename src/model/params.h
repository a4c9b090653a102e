// The GPT's parameters: names, global shapes and their places in one flat buffer.
//
// Canonical global layout (what checkpoints store and every parallel layout slices):
//   wte          (Vp, C)    token embedding, tied with the LM head; rows >= vocab_size are
//                           padding, zero at init, never in the loss
//   wpe          (P, C)     learned positions (P = model.positions, or seq_len)
//   h.<l>.ln1.w / ln1.b           (C)
//   h.<l>.attn.qkv.w  (3C, C)     rows ordered (H, 3, D): head h owns rows [3Dh, 3D(h+1)) =
//   h.<l>.attn.qkv.b  (3C)        its q, k, v, so a split by heads is contiguous
//   h.<l>.attn.proj.w (C, C)      input columns ordered (H, D)
//   h.<l>.attn.proj.b (C)
//   h.<l>.ln2.w / ln2.b           (C)      absent with the parallel block (one LN feeds both)
//   h.<l>.mlp.fc.w    (4C, C)   h.<l>.mlp.fc.b (4C)
//   h.<l>.mlp.proj.w  (C, 4C)   h.<l>.mlp.proj.b (C)
//   lnf.w / lnf.b     (C)
// Biases (".b") exist only with model.bias = true. Linear weights are (out, in) as in PyTorch.
// Each layer's tensors are contiguous in the flat buffer, in layer order, so that a pipeline
// stage or a gradient bucket is one slice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace myriad {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // global shape
  int64_t offset = 0;          // in the flat buffer (elements)
  int64_t numel = 0;
  bool decay = false;          // weight decay applies (matrices and embeddings, not biases/norms)
  double init_std = 0;         // normal(0, init_std) when > 0, else the constant init_value
  double init_value = 0;
  int64_t layer = -1;          // transformer layer, -1 for embeddings and the final norm
};

class ParamLayout {
 public:
  explicit ParamLayout(const Config& cfg);
  const std::vector<ParamSpec>& tensors() const { return tensors_; }
  const ParamSpec& find(const std::string& name) const;  // internal error when absent
  const ParamSpec* get(const std::string& name) const;   // null when absent
  int64_t total() const { return total_; }
  // Weights of every matmul counted once (QKV, attention out, MLP, and the LM head = the tied
  // embedding), the N of MFU's 6N: no biases, norms or position table.
  int64_t matmul_params() const { return matmul_params_; }
  int64_t vocab_size() const { return vocab_size_; }  // unpadded

 private:
  std::vector<ParamSpec> tensors_;
  int64_t total_ = 0;
  int64_t matmul_params_ = 0;
  int64_t vocab_size_ = 0;
};

// Fills the flat buffer: element i of tensor `name` is drawn from a counter-based generator
// keyed by (seed, name, i), so every layout materializes the same global model.
void init_params(float* params, const ParamLayout& layout, int64_t seed);

}  // namespace myriad
