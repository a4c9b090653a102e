#include "core/parallel_layout.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "core/error.h"

namespace myriad {

ContextRows context_rows(int64_t T, int64_t cp, int64_t r) {
  MYRIAD_CHECK(cp >= 1 && r >= 0 && r < cp && (cp == 1 || T % (2 * cp) == 0), "context_rows: T ", T, ", cp ", cp,
               ", rank ", r);
  ContextRows rows;
  if (cp == 1) {
    rows.end[0] = T;
    return rows;
  }
  const int64_t chunk = T / (2 * cp);
  rows.n = 2;
  rows.begin[0] = r * chunk, rows.end[0] = (r + 1) * chunk;
  rows.begin[1] = (2 * cp - 1 - r) * chunk, rows.end[1] = (2 * cp - r) * chunk;
  return rows;
}
int64_t context_pairs(const ContextRows& rows, const int32_t* starts, int64_t window) {
  int64_t pairs = 0;
  for (int64_t i = 0; i < rows.count(); ++i) {
    const int64_t p = rows.position(i);
    int64_t first = starts ? starts[p] : 0;
    if (window > 0) first = std::max(first, p - window + 1);
    pairs += p - first + 1;
  }
  return pairs;
}
std::vector<ContextRows> context_assignment(int64_t T, int64_t cp, const int32_t* starts, int64_t rows,
                                            int64_t stride, int64_t window) {
  std::vector<ContextRows> out;
  for (int64_t r = 0; r < cp; ++r) out.push_back(context_rows(T, cp, r));
  if (cp == 1) return out;
  const int64_t chunks = 2 * cp, L = T / chunks;
  std::vector<std::pair<int64_t, int64_t>> work;  // (pairs, chunk)
  for (int64_t c = 0; c < chunks; ++c) {
    ContextRows one;
    one.begin[0] = c * L, one.end[0] = (c + 1) * L;
    int64_t pairs = 0;
    for (int64_t b = 0; b < rows; ++b) pairs += context_pairs(one, starts ? starts + b * stride : nullptr, window);
    work.emplace_back(pairs, c);
  }
  std::sort(work.begin(), work.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  for (int64_t r = 0; r < cp; ++r) {
    const int64_t a = std::min(work[r].second, work[chunks - 1 - r].second),
                  b = std::max(work[r].second, work[chunks - 1 - r].second);
    ContextRows& q = out[r];
    q.n = 2, q.begin[0] = a * L, q.end[0] = (a + 1) * L, q.begin[1] = b * L, q.end[1] = (b + 1) * L;
  }
  return out;
}

std::vector<std::string> parallel_order(const std::string& order) {
  std::vector<std::string> names;
  for (size_t pos = 0;;) {
    const size_t dash = order.find('-', pos);
    names.push_back(order.substr(pos, dash == std::string::npos ? std::string::npos : dash - pos));
    if (dash == std::string::npos) break;
    pos = dash + 1;
  }
  auto has = [&](const char* n) { return std::count(names.begin(), names.end(), n) == 1; };
  const bool ok = has("tp") && has("dp") && has("pp") &&
                  (names.size() == 3 || (names.size() == 4 && has("cp")));
  if (!ok)
    throw_input("config: parallel.order = \"", order, "\" must name tp, dp and pp once each (and cp, optionally), "
                "fastest first, joined by '-' (e.g. \"tp-dp-pp\" or \"tp-cp-dp-pp\")");
  if (names.size() == 3) names.insert(std::find(names.begin(), names.end(), "tp") + 1, "cp");
  return names;
}

namespace {

void positive(const char* key, int64_t v) {
  if (v <= 0) throw_input("config: ", key, " must be positive, got ", v);
}

// The micro-batches each of `dp` replicas takes per step: global_batch / (micro_batch x dp), a
// whole number that suits the schedule (the interleaved one needs a multiple of pp); else an
// input error naming the keys and the nearest valid global batches.
int64_t batch_split(const Config& cfg, int64_t dp, bool interleaved) {
  const int64_t G = cfg.train.global_batch, mb = cfg.train.micro_batch, pp = cfg.parallel.pp;
  const int64_t unit = mb * dp * (interleaved ? pp : 1);
  if (unit > 0 && G % unit == 0) return G / (mb * dp);
  std::string factors = cat("train.micro_batch (", mb, ")");
  if (dp > 1) factors += cat(" x parallel.dp (", dp, ")");
  if (interleaved) factors += cat(" x parallel.pp (", pp, ", for the interleaved schedule)");
  const int64_t below = G / unit * unit, above = below + unit;
  throw_input("config: train.global_batch (", G, ") must be a multiple of ", factors, " = ", unit,
              "; use train.global_batch = ", below > 0 ? cat(below, " or ", above) : cat(above));
}

// The rules of ParallelLayout::of, by what they tie together; each throws the input error of
// the first rule broken. l holds the sizes already taken from the config.

// Tensor parallelism against the model's heads and features.
void check_tensor_split(const ParallelLayout& l, const ModelConfig& m) {
  // Tensor parallelism splits heads (never within one) and the MLP's features evenly; with
  // sequence parallelism the tokens of a micro-batch too.
  if (m.heads % l.tp != 0)
    throw_input("config: model.heads (", m.heads, ") must be divisible by parallel.tp (", l.tp, ")");
  if (m.kv() % l.tp != 0)
    throw_input("config: model.kv_heads (", m.kv(), ") must be divisible by parallel.tp (", l.tp,
                "): each tensor-parallel rank holds whole key/value heads (they are not replicated); "
                "lower parallel.tp to a divisor of ", m.kv());
  if (m.ffn() % l.tp != 0)
    throw_input("config: the MLP's features (model.mlp_hidden, ", m.ffn(), ") must be divisible by parallel.tp (", l.tp,
                ")");
  if (m.qk_norm == "all" && l.tp > 1)
    throw_input("config: model.qk_norm = \"all\" with parallel.tp = ", l.tp,
                ": its weights span every head, which tensor parallelism would have to split with the heads (not built); "
                "use parallel.tp = 1, or model.qk_norm = \"head\" (one weight per head feature, shared by the heads)");
}

// Mixtures of experts against tp, cp and ep (dp_known: a world size has fixed l.dp).
void check_experts(const ParallelLayout& l, const Config& cfg, bool dp_known) {
  const ModelConfig& m = cfg.model;
  // An MoE layer under tp (or cp): each rank routes its share of the tokens (docs/notes/moe.md).
  if (m.moe() && l.tp > 1 && cfg.moe.capacity_factor > 0)
    throw_input("config: moe.capacity_factor = ", cfg.moe.capacity_factor, " with parallel.tp = ", l.tp,
                ": a capacity drops rows by the weights of the whole micro-batch, which the tensor-parallel ranks "
                "route in parts; use moe.capacity_factor = 0 (dropless) or parallel.tp = 1");
  if (m.moe() && l.cp > 1 && cfg.moe.capacity_factor > 0)
    throw_input("config: moe.capacity_factor = ", cfg.moe.capacity_factor, " with parallel.cp = ", l.cp,
                ": a capacity drops rows by the weights of the whole micro-batch, which the context-parallel ranks "
                "route in parts; use moe.capacity_factor = 0 (dropless) or parallel.cp = 1");
  if (m.moe() && m.shared_ffn() % l.tp != 0)
    throw_input("config: the shared experts' features (model.shared_experts x model.shared_expert_hidden = ",
                m.shared_ffn(), ") must be divisible by parallel.tp (", l.tp, ")");
  // Expert parallelism folds into a stage's tensor x context x data ranks (docs/notes/moe.md):
  // groups of ep consecutive ranks of the stage, each holding every expert once; a world size
  // decides dp, so the fit is checked where it is known.
  if (l.ep > 1 && !m.moe())
    throw_input("config: parallel.ep = ", l.ep, " splits the experts of an MoE model, but model.experts = 0 (a dense "
                "model); remove parallel.ep or set model.experts");
  if (m.moe() && m.experts % l.ep != 0)
    throw_input("config: model.experts (", m.experts, ") must be divisible by parallel.ep (", l.ep,
                "): each expert-parallel rank holds the same number of whole experts");
  const int64_t stage = l.tp * l.cp * l.dp;
  const std::string stage_sizes = l.cp > 1 ? cat(l.tp, " x ", l.cp, " x ", l.dp) : cat(l.tp, " x ", l.dp);
  if (l.ep > 1 && dp_known && stage % l.ep != 0)
    throw_input("config: parallel.ep (", l.ep, ") must divide parallel.tp x ", l.cp > 1 ? "parallel.cp x " : "",
                "the data-parallel degree (", stage_sizes, " = ", stage, "): expert parallelism regroups the ranks of a "
                "pipeline stage; use a world of pp x a multiple of ", l.ep, " ranks, or a parallel.ep that divides ", stage);
}

// Each micro-batch's tokens over tp (sequence parallelism) and cp.
void check_sequence_split(const ParallelLayout& l, const ModelConfig& m) {
  if (l.sequence_parallel && l.tp > 1 && m.seq_len % l.tp != 0)
    throw_input("config: model.seq_len (", m.seq_len, ") must be divisible by parallel.tp (", l.tp,
                ") with parallel.sequence_parallel = true: the tokens of a micro-batch are split evenly over the "
                "tensor-parallel ranks");

  // Context parallelism: 2 cp equal chunks of every sequence (context_rows), each rank's tokens
  // then split over tp by sequence parallelism.
  if (l.cp > 1) {
    if (m.seq_len % (2 * l.cp) != 0)
      throw_input("config: model.seq_len (", m.seq_len, ") must be divisible by 2 x parallel.cp (", 2 * l.cp,
                  "): each sequence splits into 2 cp equal chunks, rank r holding chunks r and 2 cp - 1 - r");
    if (l.sequence_parallel && l.tp > 1 && (m.seq_len / l.cp) % l.tp != 0)
      throw_input("config: model.seq_len / parallel.cp (", m.seq_len / l.cp, ") must be divisible by parallel.tp (",
                  l.tp, ") with parallel.sequence_parallel = true: a rank's tokens are split evenly over the "
                  "tensor-parallel ranks");
  }
}

// Every chunk of every pipeline stage holds a layer.
void check_stages(const ParallelLayout& l, const ParallelConfig& p, const ModelConfig& m) {
  // The pipeline: every chunk of every stage holds a layer (parallel.stage_layers, when given,
  // says how many).
  const int64_t chunks = l.pp * l.virtual_stages;
  const std::string stages = cat("pp x virtual_stages = ", l.pp, " x ", l.virtual_stages, " = ", chunks);
  if (m.layers < chunks)
    throw_input("config: model.layers = ", m.layers, " is fewer than ", stages,
                " pipeline stages: each needs at least one layer");
  if (!p.stage_layers.empty()) {
    if (static_cast<int64_t>(p.stage_layers.size()) != chunks)
      throw_input("config: parallel.stage_layers has ", p.stage_layers.size(), " entries; it needs one per virtual "
                  "stage: ", stages);
    int64_t sum = 0;
    for (size_t i = 0; i < p.stage_layers.size(); ++i) {
      if (p.stage_layers[i] < 1)
        throw_input("config: parallel.stage_layers[", i, "] = ", p.stage_layers[i],
                    " must be at least 1 (every stage holds a layer)");
      sum += p.stage_layers[i];
    }
    if (sum != m.layers)
      throw_input("config: parallel.stage_layers sums to ", sum, " layers, but model.layers = ", m.layers);
  }
}

// FP8's GEMM dimensions on a rank's shard.
void check_fp8(const ParallelLayout& l, const Config& cfg) {
  const ModelConfig& m = cfg.model;
  // cuBLASLt's FP8 GEMMs take leading dimensions of 16 bytes.
  const int64_t D = m.head_dim();
  const char* tokens = l.cp > 1 ? "train.micro_batch x model.seq_len / parallel.cp" : "train.micro_batch x model.seq_len";
  for (auto [what, n] : {std::pair<const char*, int64_t>{tokens, l.micro_batch * m.seq_len / l.cp},
                         {"model.d_model", m.d_model},
                         {"the attention width per tensor-parallel rank", m.heads / l.tp * D},
                         {"the QKV width per tensor-parallel rank", (m.heads + 2 * m.kv()) / l.tp * D},
                         {"the MLP's width per rank", m.ffn() / l.tp}})
    if (n % 16 != 0)
      throw_input("config: train.precision = \"fp8\" needs ", what, " (", n, ") to be a multiple of 16");
  if (cfg.train.fp8_lm_head && (cfg.padded_vocab() / l.tp) % 16 != 0)
    throw_input("config: train.fp8_lm_head needs the vocabulary rows per tensor-parallel rank (",
                cfg.padded_vocab() / l.tp, ") to be a multiple of 16");
}

}  // namespace

ParallelLayout ParallelLayout::of(const Config& cfg, int64_t dp) {
  const ParallelConfig& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  ParallelLayout l;
  positive("parallel.tp", p.tp);
  positive("parallel.pp", p.pp);
  if (p.dp < 0) throw_input("config: parallel.dp must be 0 or more, got ", p.dp);
  positive("parallel.virtual_stages", p.virtual_stages);
  require_one_of("parallel.schedule", p.schedule, {"auto", "gpipe", "1f1b", "interleaved"});
  parallel_order(p.order);
  if (p.schedule == "1f1b" && p.virtual_stages > 1)
    throw_input("config: parallel.schedule = \"1f1b\" runs one chunk per rank but parallel.virtual_stages = ",
                p.virtual_stages, "; use \"interleaved\" (or \"auto\")");
  l.tp = p.tp, l.sequence_parallel = p.sequence_parallel, l.pp = p.pp, l.virtual_stages = p.virtual_stages;
  l.schedule = p.schedule != "auto" ? p.schedule : p.virtual_stages > 1 ? "interleaved" : "1f1b";
  l.dp = dp > 0 ? dp : p.dp > 0 ? p.dp : 1;
  check_tensor_split(l, m);
  positive("parallel.cp", p.cp);
  positive("parallel.ep", p.ep);
  l.cp = p.cp, l.ep = p.ep;
  check_experts(l, cfg, dp > 0 || p.dp > 0);
  check_sequence_split(l, m);
  check_stages(l, p, m);
  // The batch: each replica's share in whole micro-batches.
  l.micro_batch = cfg.train.micro_batch;
  l.micro_batches = batch_split(cfg, l.dp, l.interleaved() && l.pp > 1);
  if (cfg.train.precision == "fp8") check_fp8(l, cfg);
  return l;
}

ParallelLayout ParallelLayout::for_world(const Config& cfg, int64_t world) {
  const int64_t tp = cfg.parallel.tp, pp = cfg.parallel.pp, cp = cfg.parallel.cp, dp = cfg.parallel.dp;
  const int64_t group = replica_of(cfg.parallel);
  const std::string sizes = cat("tp ", tp, " x pp ", pp, cp > 1 ? cat(" x cp ", cp) : std::string());
  const std::string names = cp > 1 ? "tp x pp x cp" : "tp x pp";
  if (world < 1) throw_input("world size must be at least 1, got ", world);
  if (group >= 1 && dp == 0 && world % group != 0)
    throw_input("world ", world, " is not divisible by ", sizes, " = ", group, " (dp = world / (", names, "))");
  if (group >= 1 && dp > 0 && group * dp != world)
    throw_input("world ", world, " is not ", sizes, " x dp ", dp, " = ", group * dp,
                " (set parallel.dp = 0 to derive it from the world size)");
  return of(cfg, group >= 1 ? world / group : 0);
}

}  // namespace myriad
