// Tensor- and sequence-parallel communication regions, kept apart from the layers.
//
// Each region is a pair: what the forward does to an activation and what the backward does to
// its gradient. A tensor-parallel layer is a local GEMM on the shard of the weights between two
// regions:
//
//   column-parallel (weight rows split; local output features):
//       replicated x  -> CopyToTp               -> x W_r^T  -> (output split by features)
//       seq-sharded x -> GatherFromSequence     -> x W_r^T
//   row-parallel (weight columns split; local input features):
//       y_r W_r^T     -> ReduceFromTp           -> replicated output (+ bias once)
//       y_r W_r^T     -> ReduceScatterToSequence-> sequence-sharded output (+ bias once)
//
//   region                      forward                       backward
//   CopyToTp                    identity                      all-reduce
//   ReduceFromTp                all-reduce                    identity
//   GatherFromSequence          all-gather along the tokens   reduce-scatter along the tokens
//   ReduceScatterToSequence     reduce-scatter along tokens   all-gather along the tokens
//
// "Along the tokens": the (rows, width) activation is split into size() contiguous chunks of
// rows, chunk r on rank r. Every function takes the tensor-parallel communicator; nullptr or a
// group of one is the identity (a copy when the buffers differ), and the stream of the buffers'
// device (nullptr for host memory). The collectives are issued and waited for in place: a
// layer's GEMM needs their result at once. Sums are Gloo's,
// whose order is fixed by the algorithm (not by timing), and every rank receives the same bits.
#pragma once

#include <cstdint>

namespace myriad::comm {
class Communicator;
using Stream = void*;
}

namespace myriad::parallel {

using comm::Communicator;
using comm::Stream;

// The groups of one rank of a 3D-parallel job; nullptr (or a group of one) where that dimension
// is 1. All null is a single process holding the whole model.
struct ParallelContext {
  Communicator* tp = nullptr;  // tensor (+ sequence) parallel group
  Communicator* pp = nullptr;  // pipeline group: rank = stage (loss broadcast, tied embedding)
  Communicator* dp = nullptr;  // data-parallel group
  // Expert parallelism (parallel.ep > 1, folded into dp: core/parallel_layout.h): the expert
  // group (tokens go to their experts' rank and back) and the experts' data-parallel group (their
  // gradients are reduced over it). Null with ep = 1: no expert group, and the experts' data-
  // parallel group is dp.
  Communicator* ep = nullptr;
  Communicator* edp = nullptr;
  // Context parallelism (parallel.cp > 1): the ranks splitting each sequence (attention gathers
  // keys and values over them), and the dp x cp ranks holding the same weights, over which the
  // gradients are reduced and the optimizer's state is sharded. Null with cp = 1: then that
  // group is dp.
  Communicator* cp = nullptr;
  Communicator* dcp = nullptr;
  // Pipeline links (pp > 1): two-rank groups in which one rank only sends and the other only
  // receives (runtime/pipeline.h says why); this rank sends on *_to_*, receives on *_from_*.
  Communicator *act_to_next = nullptr, *act_from_prev = nullptr;
  Communicator *grad_to_prev = nullptr, *grad_from_next = nullptr;
  int tp_rank() const;
  int tp_size() const;
  int pp_rank() const;
  int pp_size() const;
  int dp_rank() const;
  int dp_size() const;
  int ep_rank() const;
  int ep_size() const;
  int cp_rank() const;
  int cp_size() const;
  // The ranks holding the same weights: the gradients' and the optimizer shards' group.
  Communicator* weights_dp() const { return dcp ? dcp : dp; }
  Communicator* expert_dp() const { return ep ? edp : weights_dp(); }
};

// Number of ranks, 1 for nullptr.
int group_size(const Communicator* c);
int group_rank(const Communicator* c);

struct CopyToTp {
  static void forward(Communicator*, float*, int64_t, Stream = nullptr) {}
  static void backward(Communicator* tp, float* grad, int64_t count, Stream s = nullptr);  // all-reduce in place
};

struct ReduceFromTp {
  static void forward(Communicator* tp, float* x, int64_t count, Stream s = nullptr);  // all-reduce in place
  static void backward(Communicator*, float*, int64_t, Stream = nullptr) {}
};

// local (chunk) <-> full (size() * chunk); local may be full + rank() * chunk (in place).
struct GatherFromSequence {
  static void forward(Communicator* tp, const float* local, float* full, int64_t chunk, Stream s = nullptr);
  static void backward(Communicator* tp, const float* dfull, float* dlocal, int64_t chunk, Stream s = nullptr);
};

struct ReduceScatterToSequence {
  static void forward(Communicator* tp, const float* full, float* local, int64_t chunk, Stream s = nullptr);
  static void backward(Communicator* tp, const float* dlocal, float* dfull, int64_t chunk, Stream s = nullptr);
};

// Sum of one double per rank, identical bits on every rank and independent of timing: every
// rank's value travels exactly (its 8 bytes as two floats, which a gather only copies) and the
// values are added in rank order.
// For norms whose parts live on different ranks.
double sum_over_group(Communicator* c, double local);
// The same for each of x[count] (doubles), in place.
void sum_over_group(Communicator* c, double* x, int64_t count);

// Sum over the ranks of x[i], for each i, in place (x[count]): an all-reduce whose order of
// additions is fixed by the algorithm, the same bits on every rank. x may be device memory
// (then on `stream`).
void sum_over_group(Communicator* c, float* x, int64_t count, Stream stream = nullptr);

// The largest of x[i] over the ranks, for each i, in place (x[count], host memory): all-gather
// then max in rank order.
void max_over_group(Communicator* c, float* x, int64_t count);

}  // namespace myriad::parallel
