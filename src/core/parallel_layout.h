// The parallel layout of a run: how its ranks split the model and the batch, and every rule that
// ties those sizes to the model's shape, the batch and the precision, in this one place.
//
//   tp  tensor parallelism: each rank of a group holds 1/tp of every layer's query heads,
//       key/value heads and MLP features (and, with sequence_parallel, 1/tp of the residual
//       stream's tokens);
//   pp  pipeline stages, each running `virtual_stages` chunks of layers (interleaved 1F1B when
//       more than one), on the schedule parallel.schedule names ("auto": interleaved with
//       chunks, else 1F1B);
//   dp  data-parallel replicas, each taking micro_batches micro-batches of micro_batch rows of
//       every global batch;
//   ep  expert parallelism (MoE models): each MoE layer's routed experts split over ep ranks,
//       folded into a stage's tp x cp x dp ranks (no ranks of its own): they form tp cp dp / ep
//       expert groups of ep consecutive ranks ((dp, cp, tp) order, tp fastest), and the ranks
//       holding the same experts (one per expert group) are the experts' data-parallel group
//       (edp), over which their gradients are reduced. Under tp (and cp) each rank routes its
//       share of the tokens, the balance loss taken over the whole micro-batch;
//   cp  context parallelism: each sequence of seq_len tokens splits over cp ranks, in 2 cp chunks
//       (context_rows below); the cp ranks of a replica take the same rows of the batch, each
//       computing its chunks' tokens, with attention gathering the sequence's keys and values
//       over them (docs/notes/cp.md). Gradients and the optimizer's shards are reduced over the
//       dp x cp ranks of a stage's tensor rank (they all hold the same weights).
//
// Built by ParallelLayout::of (a config and its data parallelism) or for_world (a config and a
// world size), which validate it: an input error names the keys and values of the first rule
// broken ("config: model.kv_heads (3) must be divisible by parallel.tp (2) ..."). The config
// check, the model, the engine, the planner, the driver and the trainer read it instead of
// deriving the sizes again. Device limits (FP8 on a GPU without it) are the engine's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace myriad {

// The positions of a sequence that one context-parallel rank holds: its query rows, as ranges
// [begin, end) of positions in the sequence, in order. Under cp, a sequence of T splits into 2 cp
// chunks of T / (2 cp) and each rank holds two of them (context_assignment: without documents,
// rank r holds chunks r and 2 cp - 1 - r, so that every rank has as much of the causal
// triangle's work as any other: a late chunk sees many keys, an early one few).
// Without cp: one range, the whole sequence.
struct ContextRows {
  int n = 1;  // ranges: 1, or 2 under cp
  int64_t begin[2] = {0, 0}, end[2] = {0, 0};
  int64_t count() const { return end[0] - begin[0] + (n > 1 ? end[1] - begin[1] : 0); }
  // The position in the sequence of the rank's row i (0 <= i < count()).
  int64_t position(int64_t i) const { return i < end[0] - begin[0] ? begin[0] + i : begin[1] + i - (end[0] - begin[0]); }
};
// Rank r's rows of a sequence of T under cp ranks without documents (0 <= r < cp; T divisible by
// 2 cp when cp > 1): chunks r and 2 cp - 1 - r, Llama 3's assignment.
ContextRows context_rows(int64_t T, int64_t cp, int64_t r);
// The (query, key) pairs `rows` attend, a rank's share of attention's work on one sequence: query
// i sees keys max(i - window + 1, starts[i]) .. i (starts: each position's document start, null
// for one document; window 0: none). Without documents every rank of context_rows gets the same.
int64_t context_pairs(const ContextRows& rows, const int32_t* starts, int64_t window);
// Every rank's rows (element q: rank q's) of a micro-batch of `rows` sequences of T, whose
// document starts are starts[b * stride + i] (null: one document a sequence): the 2 cp chunks
// sorted by their (query, key) pairs over the micro-batch, most first (ties: the later chunk
// first), rank r takes the r-th most and the r-th fewest, which pairs the heaviest with the
// lightest and minimizes the busiest rank's pairs for two chunks a rank. Without documents a
// chunk's pairs never fall with its place (window or not), and this is context_rows exactly.
// Every rank computes it alike from the rows it holds whole.
std::vector<ContextRows> context_assignment(int64_t T, int64_t cp, const int32_t* starts, int64_t rows,
                                            int64_t stride, int64_t window);

struct ParallelLayout {
  int64_t tp = 1;
  bool sequence_parallel = false;
  int64_t pp = 1;
  int64_t virtual_stages = 1;
  std::string schedule = "1f1b";  // "gpipe", "1f1b" or "interleaved": parallel.schedule, "auto" resolved
  int64_t dp = 1;
  int64_t ep = 1;                 // expert-parallel ranks (a divisor of tp x dp)
  int64_t cp = 1;                 // context-parallel ranks per sequence
  int64_t micro_batch = 1;        // rows per micro-batch
  int64_t micro_batches = 1;      // per data-parallel rank and step: global_batch / (micro_batch x dp)

  // The processes the layout runs on.
  int64_t ranks() const { return tp * pp * dp * cp; }
  // Ranks of one model replica (a data-parallel rank's tensor x pipeline x context group) of a
  // config's parallel section, before a world size decides dp (whole replicas fill a world).
  static int64_t replica_of(const ParallelConfig& p) { return p.tp * p.pp * p.cp; }
  // Ranks holding the same experts of a stage: the experts' data-parallel degree.
  int64_t edp() const { return tp * cp * dp / ep; }
  bool interleaved() const { return schedule == "interleaved"; }

  // The layout `cfg` asks for with `dp` data-parallel replicas (0: parallel.dp, or 1 where that
  // is 0 too: a world size decides it at start, where the layout is built again), validated.
  static ParallelLayout of(const Config& cfg, int64_t dp = 0);
  // The layout of `cfg` on `world` ranks (dp = world / (tp x pp x cp)), validated; an input error
  // too when world is not a whole number of tensor x pipeline x context groups, or when
  // parallel.dp (set) says another number.
  static ParallelLayout for_world(const Config& cfg, int64_t world);
};

// parallel.order's dimensions, fastest first, as four names: "tp", "cp", "dp", "pp" in the
// order given; an order naming three of them (the default "tp-dp-pp") has cp right after tp, so
// that a sequence's ranks sit beside its tensor-parallel group. An input error names the key.
std::vector<std::string> parallel_order(const std::string& order);

}  // namespace myriad
