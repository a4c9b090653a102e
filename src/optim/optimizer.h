// Optimizers over the flat parameter buffer: AdamW and LAMB, fp32 state, plus the learning-rate
// schedule and global-norm clipping.
//
// Every reduction (norms) runs over fixed-size chunks whose partial sums are added in chunk
// order, so results are bitwise the same whatever the number of threads.
//
// ZeRO-1/2: an optimizer may own only some ranges of the flat buffer (its data-parallel rank's
// pieces, optim/buckets.h). It keeps state for those elements only and updates only them; the
// other ranks update the rest, and the engine gathers the parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/memory.h"
#include "model/params.h"

namespace myriad {

// Learning rate at 0-based `step`: linear warmup to optim.lr over warmup_steps, then cosine or
// linear decay to min_lr at train.steps, or constant, or warmup-stable-decay (wsd): optim.lr
// until the last wsd_decay_steps steps, which go down to min_lr (reached on the last step) in
// optim.decay_shape. The schedule depends on train.steps only through the decay's place, so a
// run continued from a stable-phase checkpoint with more train.steps decays at its new end.
double lr_at(const OptimConfig& o, int64_t step, int64_t total_steps);
// WSD's decay length: optim.decay_steps, else decay_fraction x total_steps (rounded), within
// [1, total_steps - warmup_steps].
int64_t wsd_decay_steps(const OptimConfig& o, int64_t total_steps);
// What a run of `total_steps` would not see of the schedule it asks for, with the values used
// ("" when it sees all of it): a warmup that lasts the whole run (lr never reaches optim.lr's
// plateau's end, nor decays to min_lr), or a WSD decay fraction cut to the steps after warmup.
std::string schedule_warning(const OptimConfig& o, int64_t total_steps);

// Scales grads so that their global L2 norm is at most max_norm (PyTorch's clip_grad_norm_:
// coefficient max_norm / (norm + 1e-6) when below 1). Returns the norm before clipping.
double clip_grad_norm(float* grads, int64_t n, double max_norm);

// The owned elements of one tensor, [local_begin, local_end) of its local shard, whose state
// starts at `packed` in m()/v(). Checkpoints write and read each piece as
// layout.stored_regions(*tensor, local_begin, local_end), the region's data at
// m().data() + packed + (region.local_begin - local_begin).
struct OwnedPiece {
  const ParamSpec* tensor = nullptr;
  int64_t local_begin = 0, local_end = 0;
  int64_t packed = 0;
};
// `owned`: ascending, disjoint ranges inside [0, layout.total()) (empty ones are skipped). The
// pieces come in buffer order; a range may cut through tensors and span several.
std::vector<OwnedPiece> owned_pieces(const ParamLayout& layout, const std::vector<FlatRange>& owned);

// Sums, in place, LAMB's per-tensor partial sums of squares over the ranks that share the
// tensors: sums[2k] = sum of w^2, sums[2k + 1] = sum of u^2 over this rank's elements of tensor k
// (zero where it owns none). The data-parallel ranks always; the tensor-parallel ranks too for
// the split tensors (not the replicated ones, whose elements every tp rank holds). Collective:
// called once per step on every rank, whatever it owns. The sums must arrive exactly (a float
// all-reduce would not do); any order of addition is fine.
using NormReducer = std::function<void(std::vector<double>&)>;

using OptimState = CountedVector<float, MemoryKind::kOptimizerState>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update at learning rate lr of the fp32 master weights from grads: master holds the
  // owned elements only, packed like m() and v() (owning everything: the whole layout, in
  // order); grads is the full flat buffer in layout order, read on the owned elements. The
  // compute copy the optimizer was made with (if any) gets the new weights on the owned
  // ranges. Advances the step count.
  // Each gradient is multiplied by grad_scale as it is read (the clipping coefficient): the
  // same float product a separate scaling pass would store, without that pass over the buffer.
  // A device optimizer (optim/cuda) takes device pointers and keeps its state there.
  virtual void step(float* master, const float* grads, double lr, float grad_scale = 1.0f) = 0;
  // A device optimizer's m() and v() are host copies: made current, or installed on the
  // device. No-ops for the host optimizers, whose m() and v() are the state itself.
  virtual void state_to_host() {}
  virtual void state_from_host() {}

  // State, for checkpoints: first and second moments of the owned elements, packed in
  // ascending offset order (the whole layout by default: then the parameter layout), and the
  // count of steps taken (bias correction).
  OptimState& m() { return m_; }
  OptimState& v() { return v_; }
  int64_t& steps_taken() { return t_; }
  const std::vector<FlatRange>& owned() const { return owned_; }
  const std::vector<OwnedPiece>& pieces() const { return pieces_; }

 protected:
  Optimizer(const OptimConfig& cfg, const ParamLayout& layout, std::vector<FlatRange> owned);
  OptimConfig cfg_;
  const ParamLayout& layout_;
  std::vector<FlatRange> owned_;    // non-empty ranges
  std::vector<OwnedPiece> pieces_;  // owned_ cut at tensor boundaries
  OptimState m_, v_;                // (owned elements)
  int64_t t_ = 0;
};

// optim.name selects AdamW (decoupled weight decay, Loshchilov & Hutter) or LAMB (You et al.
// 2019: Adam direction scaled per tensor by the trust ratio ||w|| / ||update||). Weight decay
// applies to the tensors whose ParamSpec says so (matrices and embeddings, not biases or norms).
// `owned` empty = the whole buffer; a rank that owns nothing passes {{0, 0}}
// (GradBuckets::owned does). LAMB's trust ratio needs each tensor's norms over all its
// elements: `reduce` completes this rank's partial sums (none = they are complete). With it
// the sharded update equals the unsharded one up to the order of those additions; AdamW's is
// bitwise the same.
// `compute`: a full flat buffer whose owned ranges each step copies the new weights into (the
// CPU engine's parameters, which its kernels read), or null.
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg, const ParamLayout& layout,
                                          std::vector<FlatRange> owned = {},
                                          NormReducer reduce = {}, float* compute = nullptr);

namespace cpu {
class CpuOps;
}
// The same for the engine on the CPU op set (runtime/model_engine.h picks by op set). `compute`
// is the op set's compute copy of the parameters, which the optimizer refreshes on the owned
// ranges as it updates them (a GPU's casts them to bf16; here the copy is fp32, the same bits).
std::unique_ptr<Optimizer> make_optimizer(const cpu::CpuOps& ops, const OptimConfig& cfg,
                                          const ParamLayout& layout, std::vector<FlatRange> owned,
                                          NormReducer reduce, float* compute);

}  // namespace myriad
