// A mixture of experts' layer on the CPU (cpu_ops.h says what each op computes; the routing is
// docs/notes/moe.md's "Routing, exactly"). The oracle the CUDA op set and every expert-parallel
// layout are checked against, itself checked against PyTorch (tools/torch_reference.py).
//
// Every loop runs in a fixed order (tokens, then slots), so results do not depend on threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/ops.h"

namespace myriad::cpu {

namespace {

// Scores of one token's logits (E): softmax (with its log-sum-exp, for the z-loss) or sigmoid.
double scores_of(const Router& r, const float* logits, float* scores) {
  const int E = r.experts;
  double mx = -INFINITY;
  for (int e = 0; e < E; ++e) mx = std::max(mx, double(logits[e]));
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += std::exp(double(logits[e]) - mx);
  const double lse = mx + std::log(sum);
  for (int e = 0; e < E; ++e)
    scores[e] = r.score == RouterScore::kSoftmax ? static_cast<float>(std::exp(double(logits[e]) - lse))
                                                 : static_cast<float>(1 / (1 + std::exp(-double(logits[e]))));
  return lse;
}

// The experts a token may choose (allowed, E): all, or with groups those of the top_groups
// groups whose two best keys sum highest (ties to the lower group).
void allowed_experts(const Router& r, const float* key, char* allowed) {
  const int E = r.experts, G = std::max(r.groups, 1), per = E / G;
  std::fill(allowed, allowed + E, G == 1);
  if (G == 1) return;
  std::vector<float> group_key(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) {
    float a = -INFINITY, b = -INFINITY;  // the best two of the group
    for (int e = g * per; e < (g + 1) * per; ++e)
      if (key[e] > a) b = a, a = key[e];
      else if (key[e] > b) b = key[e];
    group_key[g] = per > 1 ? a + b : a;
  }
  std::vector<char> taken(static_cast<size_t>(G), 0);
  for (int t = 0; t < r.top_groups; ++t) {
    int best = -1;
    for (int g = 0; g < G; ++g)
      if (!taken[g] && (best < 0 || group_key[g] > group_key[best])) best = g;
    taken[best] = 1;
    std::fill(allowed + best * per, allowed + (best + 1) * per, 1);
  }
}

// With a capacity, each expert keeps its M slots' rows of the highest weights (ties to the lower
// slot): which slots are dropped (M); out's counts and dropped updated.
std::vector<char> drop_past_capacity(const Router& r, const int32_t* choice, const float* weights, int64_t M,
                                     Routing& out) {
  const int E = r.experts;
  std::vector<char> dropped(static_cast<size_t>(M), 0);
  if (r.capacity_factor <= 0) return dropped;
  const int64_t cap = static_cast<int64_t>(std::ceil(double(r.capacity_factor) * double(M) / E));
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));
  for (int64_t s = 0; s < M; ++s) slots[choice[s]].push_back(s);
  for (int e = 0; e < E; ++e) {
    if (int64_t(slots[e].size()) <= cap) continue;
    std::stable_sort(slots[e].begin(), slots[e].end(), [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
    for (size_t i = static_cast<size_t>(cap); i < slots[e].size(); ++i) dropped[slots[e][i]] = 1;
    out.dropped += int64_t(slots[e].size()) - cap;
    out.counts[e] = cap;
  }
  return dropped;
}

}  // namespace

void CpuOps::router_forward(float* logits, const Act* x, const Param* w, int N, int C, int E) const {
  cpu::linear_forward(logits, x, w, static_cast<const float*>(nullptr), N, C, E);
}

void CpuOps::router_backward(Act* dx, float* dw, const float* dlogits, const Act* x, const Param* w, int N, int C,
                             int E) const {
  cpu::linear_backward(dx, dw, static_cast<float*>(nullptr), dlogits, x, w, N, C, E);
}

Routing CpuOps::route(const Router& r, int32_t* choice, float* weights, int32_t* order, int32_t* pos,
                      const float* logits, const Param* bias, int N) const {
  const int E = r.experts, k = r.top_k, G = std::max(r.groups, 1), per = E / G;
  MYRIAD_CHECK(E > 0 && k >= 1 && k <= E && E % G == 0 && r.top_groups >= 1 && r.top_groups <= G &&
                   k <= r.top_groups * per,
               "route: top ", k, " of ", E, " experts in ", r.top_groups, " of ", G, " groups");
  Routing out;
  out.counts.assign(static_cast<size_t>(E), 0);
  std::vector<double> mean_score(static_cast<size_t>(E), 0.0);
  std::vector<float> scores(static_cast<size_t>(E)), key(static_cast<size_t>(E));
  std::vector<char> allowed(static_cast<size_t>(E));
  for (int n = 0; n < N; ++n) {
    const double lse = scores_of(r, logits + int64_t(n) * E, scores.data());
    out.z += lse * lse;
    for (int e = 0; e < E; ++e) {
      mean_score[e] += scores[e];
      key[e] = bias ? scores[e] + bias[e] : scores[e];
    }
    allowed_experts(r, key.data(), allowed.data());
    // The k best keys, best first; a tie goes to the lower expert (strictly greater replaces).
    int32_t* c = choice + int64_t(n) * k;
    float* wt = weights + int64_t(n) * k;
    double sum = 0;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = !allowed[e];
        for (int i = 0; i < j; ++i) taken |= c[i] == e;
        if (!taken && (best < 0 || key[e] > key[best])) best = e;
      }
      c[j] = best;
      wt[j] = scores[best];
      sum += scores[best];
      ++out.counts[best];
    }
    for (int j = 0; j < k; ++j)
      wt[j] = static_cast<float>((r.norm_topk ? double(wt[j]) / sum : double(wt[j])) * r.scale);
  }
  // Switch's balance over the choice: E sum_e f_e P_e, f_e the share of the N k slots, P_e the
  // mean score.
  for (int e = 0; e < E; ++e)
    out.aux += double(E) * (double(out.counts[e]) / (double(N) * k)) * (mean_score[e] / N);
  out.score_sums = mean_score;
  out.z /= N;
  const int64_t M = int64_t(N) * k;
  const std::vector<char> dropped = drop_past_capacity(r, choice, weights, M, out);
  // The stable counting sort of the kept slots by expert.
  std::vector<int64_t> next(static_cast<size_t>(E), 0);
  for (int e = 1; e < E; ++e) next[e] = next[e - 1] + out.counts[e - 1];
  for (int64_t s = 0; s < M; ++s) {
    if (dropped[s]) {
      pos[s] = -1;
      continue;
    }
    const int64_t at = next[choice[s]]++;
    order[at] = static_cast<int32_t>(s);
    pos[s] = static_cast<int32_t>(at);
  }
  return out;
}

void CpuOps::route_backward(const Router& r, float* dlogits, const float* dweights, const float* logits,
                            const int32_t* choice, float grad_scale, int N, RouteTotals totals) const {
  const int E = r.experts, k = r.top_k;
  std::vector<float> scores(static_cast<size_t>(E));
  std::vector<double> ds(static_cast<size_t>(E));
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);  // the choice's, before any drop
  for (int64_t s = 0; s < int64_t(N) * k; ++s) ++counts[choice[s]];
  // The micro-batch's tokens and choice: these N, or the whole of which they are a part.
  const double tokens = totals.chosen ? double(totals.tokens) : double(N);
  if (totals.chosen) counts.assign(totals.chosen, totals.chosen + E);
  for (int n = 0; n < N; ++n) {
    const float* l = logits + int64_t(n) * E;
    const double lse = scores_of(r, l, scores.data());
    std::fill(ds.begin(), ds.end(), 0.0);
    // The weights' gradient into the chosen scores: w_j = scale s_j (/ S, S = sum of the k).
    const int32_t* c = choice + int64_t(n) * k;
    const float* dw = dweights + int64_t(n) * k;
    if (r.norm_topk) {
      double S = 0, dot = 0;
      for (int j = 0; j < k; ++j) S += scores[c[j]];
      for (int j = 0; j < k; ++j) dot += double(dw[j]) * scores[c[j]];
      for (int j = 0; j < k; ++j) ds[c[j]] += r.scale / S * (dw[j] - dot / S);
    } else {
      for (int j = 0; j < k; ++j) ds[c[j]] += double(r.scale) * dw[j];
    }
    // The balance loss: d/ds_ne of E sum_e f_e P_e is E f_e / N, the shares held constant.
    // (A dropped slot's weight has a zero gradient: it passes through the renormalization.)
    if (r.aux_loss > 0)
      for (int e = 0; e < E; ++e)
        ds[e] += double(grad_scale) * r.aux_loss * E * (double(counts[e]) / (tokens * k)) / tokens;
    float* dl = dlogits + int64_t(n) * E;
    if (r.score == RouterScore::kSoftmax) {
      double dot = 0;
      for (int e = 0; e < E; ++e) dot += ds[e] * scores[e];
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(scores[e] * (ds[e] - dot));
    } else {
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(ds[e] * scores[e] * (1.0 - scores[e]));
    }
    // The z-loss, mean over tokens of lse^2: 2 lse softmax_e / N.
    if (r.z_loss > 0)
      for (int e = 0; e < E; ++e)
        dl[e] += static_cast<float>(double(grad_scale) * r.z_loss * 2 * lse * std::exp(double(l[e]) - lse) / tokens);
  }
}

void CpuOps::gather_rows(Act* xs, const Act* x, const int32_t* order, int M, int k, int C) const {
#pragma omp parallel for schedule(static) if (int64_t(M) * C >= (1 << 16))
  for (int i = 0; i < M; ++i)
    std::memcpy(xs + int64_t(i) * C, x + int64_t(order[i] / k) * C, sizeof(Act) * C);
}

void CpuOps::gather_rows_backward(Act* dx, const Act* dxs, const int32_t* pos, int N, int k, int C) const {
#pragma omp parallel for schedule(static) if (int64_t(N) * k * C >= (1 << 16))
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < k; ++j) {
      if (pos[int64_t(n) * k + j] < 0) continue;  // dropped
      const Act* src = dxs + int64_t(pos[int64_t(n) * k + j]) * C;
      Act* dst = dx + int64_t(n) * C;
      for (int c = 0; c < C; ++c) dst[c] += src[c];
    }
}

// The experts run side by side, one thread each: each expert's GEMMs are small, and a thread
// team per GEMM spent more in its start than in the product (the MoE demo's first 30 steps:
// 6,400 -> 8,500 tokens/s on 2 cores). OpenBLAS runs single-threaded inside the parallel loop, so an expert's
// bits depend neither on which thread takes it nor on the thread count. Each expert writes its
// own rows and its own weights' gradient.
namespace {
std::vector<int64_t> first_rows(const int64_t* counts, int E) {
  std::vector<int64_t> first(static_cast<size_t>(E) + 1, 0);
  for (int e = 0; e < E; ++e) first[e + 1] = first[e] + counts[e];
  return first;
}
}  // namespace

void CpuOps::grouped_linear_act_forward(Mlp m, Act* out, Act* pre, const Act* inp, const Param* w,
                                        const int64_t* counts, int E, int IC, int F) const {
  const int64_t P = int64_t(F) * pre_width(m);
  const std::vector<int64_t> first = first_rows(counts, E);
#pragma omp parallel for schedule(dynamic, 1)
  for (int e = 0; e < E; ++e) {
    const int rows = static_cast<int>(counts[e]);
    if (rows == 0) continue;
    Act* p = pre + first[e] * P;
    cpu::linear_forward(p, inp + first[e] * IC, w + e * P * IC, static_cast<const Param*>(nullptr), rows, IC,
                        static_cast<int>(P));
    if (m == Mlp::kSwiGlu)
      cpu::swiglu_forward(out + first[e] * F, p, rows, F);
    else
      cpu::gelu_forward(out + first[e] * F, p, int64_t(rows) * F);
  }
}

void CpuOps::grouped_linear_forward(Act* out, const Act* inp, const Param* w, const int64_t* counts, int E, int IC,
                                    int OC) const {
  const std::vector<int64_t> first = first_rows(counts, E);
#pragma omp parallel for schedule(dynamic, 1)
  for (int e = 0; e < E; ++e)
    if (counts[e] > 0)
      cpu::linear_forward(out + first[e] * OC, inp + first[e] * IC, w + e * int64_t(OC) * IC,
                          static_cast<const Param*>(nullptr), static_cast<int>(counts[e]), IC, OC);
}

void CpuOps::grouped_linear_backward(Mlp m, Act* dinp, float* dw, const Act* dout, const Act* inp, const Param* w,
                                     const Act* pre, const int64_t* counts, int E, int IC, int OC) const {
  const int64_t in_width = pre ? int64_t(IC) * pre_width(m) : IC;  // dinp's row: dpre's, or the input's
  const std::vector<int64_t> first = first_rows(counts, E);
#pragma omp parallel for schedule(dynamic, 1)
  for (int e = 0; e < E; ++e) {
    const int rows = static_cast<int>(counts[e]);
    if (rows == 0) continue;
    const Act* d = dout + first[e] * OC;
    const Param* we = w + e * int64_t(OC) * IC;
    Act* di = dinp + first[e] * in_width;
    std::fill(di, di + rows * in_width, 0.0f);
    if (pre) {  // through the activation: its output's gradient first, then into dpre
      std::vector<float> dact(static_cast<size_t>(rows) * IC, 0.0f);
      cpu::linear_backward(dact.data(), static_cast<float*>(nullptr), static_cast<float*>(nullptr), d,
                           static_cast<const float*>(nullptr), we, rows, IC, OC);
      if (m == Mlp::kSwiGlu)
        cpu::swiglu_backward(di, pre + first[e] * in_width, dact.data(), rows, IC);
      else
        cpu::gelu_backward(di, pre + first[e] * in_width, dact.data(), int64_t(rows) * IC);
    } else {
      cpu::linear_backward(di, static_cast<float*>(nullptr), static_cast<float*>(nullptr), d,
                           static_cast<const float*>(nullptr), we, rows, IC, OC);
    }
    cpu::linear_backward(static_cast<float*>(nullptr), dw + e * int64_t(OC) * IC, static_cast<float*>(nullptr), d,
                         inp + first[e] * IC, static_cast<const float*>(nullptr), rows, IC, OC);
  }
}

void CpuOps::combine_forward(Act* out, const Act* ys, const float* weights, const int32_t* pos, int N, int k, int C,
                             bool accumulate) const {
#pragma omp parallel for schedule(static) if (int64_t(N) * k * C >= (1 << 16))
  for (int n = 0; n < N; ++n) {
    Act* o = out + int64_t(n) * C;
    if (!accumulate) std::fill(o, o + C, 0.0f);
    for (int j = 0; j < k; ++j) {
      if (pos[int64_t(n) * k + j] < 0) continue;  // dropped
      const float wt = weights[int64_t(n) * k + j];
      const Act* y = ys + int64_t(pos[int64_t(n) * k + j]) * C;
      for (int c = 0; c < C; ++c) o[c] += wt * y[c];
    }
  }
}

void CpuOps::combine_backward(Act* dys, float* dweights, const Act* dout, const Act* ys, const float* weights,
                              const int32_t* pos, int N, int k, int C) const {
#pragma omp parallel for schedule(static) if (int64_t(N) * k * C >= (1 << 16))
  for (int n = 0; n < N; ++n) {
    const Act* d = dout + int64_t(n) * C;
    for (int j = 0; j < k; ++j) {
      const int64_t row = pos[int64_t(n) * k + j];
      if (row < 0) {  // dropped: its weight had no use
        dweights[int64_t(n) * k + j] = 0;
        continue;
      }
      const float wt = weights[int64_t(n) * k + j];
      const Act* y = ys + row * C;
      Act* dy = dys + row * C;
      double dot = 0;
      for (int c = 0; c < C; ++c) dy[c] = wt * d[c], dot += double(d[c]) * y[c];
      dweights[int64_t(n) * k + j] = static_cast<float>(dot);
    }
  }
}

}  // namespace myriad::cpu
