#include "parallel/schedule.h"

#include <algorithm>
#include <climits>
#include <optional>

#include "core/error.h"

namespace myriad::parallel {

ScheduleKind schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  throw_input("pipeline schedule \"", name, "\" is not one of gpipe, 1f1b, interleaved");
}

std::string to_string(const Action& a) {
  const char* name = "?";
  switch (a.kind) {
    case ActionKind::kForward: name = "forward"; break;
    case ActionKind::kBackward: name = "backward"; break;
    case ActionKind::kRecvActivation: name = "recv activation"; break;
    case ActionKind::kSendActivation: name = "send activation"; break;
    case ActionKind::kRecvGrad: name = "recv grad"; break;
    case ActionKind::kSendGrad: name = "send grad"; break;
  }
  return cat(name, "(mb ", a.microbatch, ", chunk ", a.chunk, ")");
}

int action_peer(const Action& a, int rank, int p) {
  switch (a.kind) {
    case ActionKind::kRecvActivation:
    case ActionKind::kSendGrad: return (rank + p - 1) % p;
    case ActionKind::kSendActivation:
    case ActionKind::kRecvGrad: return (rank + 1) % p;
    default: return -1;
  }
}

namespace {

using K = ActionKind;

bool first_stage(int s, int c) { return s == 0 && c == 0; }
bool last_stage(int s, int c, int p, int v) { return s == p - 1 && c == v - 1; }

// The k-th forward / backward of a rank in the interleaved order (1F1B's when v == 1):
// micro-batches go through the chunks in groups of p, backwards through the chunks reversed.
Action interleaved_compute(K kind, int k, int p, int v) {
  const int mb = (k / (p * v)) * p + k % p, c = (k / p) % v;
  return {kind, mb, kind == K::kForward ? c : v - 1 - c};
}

std::vector<Action> compute_order(ScheduleKind kind, int p, int v, int m, int s) {
  std::vector<Action> out;
  if (kind == ScheduleKind::kGPipe) {
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) out.push_back({K::kForward, mb, c});
    for (int i = m * v - 1; i >= 0; --i)
      out.push_back({K::kBackward, out[i].microbatch, out[i].chunk});
    return out;
  }
  // The extra warm-up of the interleaved schedule (Megatron's) keeps every rank busy while the
  // first backward travels back through p*v virtual stages instead of p.
  const int total = m * v;
  const int warmup = v == 1 ? std::min(p - s - 1, m)
                            : std::min((p - s - 1) * 2 + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) out.push_back(interleaved_compute(K::kForward, k, p, v));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(interleaved_compute(K::kForward, warmup + k, p, v));
    out.push_back(interleaved_compute(K::kBackward, k, p, v));
  }
  for (int k = total - warmup; k < total; ++k)
    out.push_back(interleaved_compute(K::kBackward, k, p, v));
  return out;
}

// The send that follows a compute on rank s, if its result leaves the rank.
std::optional<Action> send_after(const Action& a, int s, int p, int v) {
  if (p == 1) return std::nullopt;  // one rank: the chunks pass activations in memory
  if (a.kind == K::kForward && !last_stage(s, a.chunk, p, v))
    return Action{K::kSendActivation, a.microbatch, a.chunk};
  if (a.kind == K::kBackward && !first_stage(s, a.chunk))
    return Action{K::kSendGrad, a.microbatch, a.chunk};
  return std::nullopt;
}

// The receive on the peer that matches a send on rank s: the chunk becomes the peer's chunk
// (crossing from the last rank to rank 0 moves one chunk up, and back down for gradients).
Action matching_recv(const Action& send, int s, int p) {
  if (send.kind == K::kSendActivation)
    return {K::kRecvActivation, send.microbatch, send.chunk + (s == p - 1 ? 1 : 0)};
  return {K::kRecvGrad, send.microbatch, send.chunk - (s == 0 ? 1 : 0)};
}

// What a message is, seen from the receiver: "activation(mb 2, chunk 1)".
std::string message_name(const Action& recv) {
  return cat(recv.kind == K::kRecvActivation ? "activation" : "grad", "(mb ", recv.microbatch,
             ", chunk ", recv.chunk, ")");
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int p, int v, int m) {
  if (p < 1) throw_input("pipeline schedule: pp must be at least 1, got ", p);
  if (v < 1) throw_input("pipeline schedule: virtual_stages must be at least 1, got ", v);
  if (m < 1) throw_input("pipeline schedule: micro-batches per step must be at least 1, got ", m);
  if (kind == ScheduleKind::kOneFOneB && v > 1)
    throw_input("the 1f1b schedule needs virtual_stages = 1, got ", v,
                " (use the interleaved schedule)");
  if (kind == ScheduleKind::kInterleaved && m % p != 0)
    throw_input("the interleaved schedule needs the micro-batches per step (", m,
                ") to be divisible by pp (", p, ")");

  std::vector<std::vector<Action>> computes(p);
  for (int s = 0; s < p; ++s) computes[s] = compute_order(kind, p, v, m, s);

  // slots[b][j]: the receives rank b posts just before its compute j.
  std::vector<std::vector<std::vector<Action>>> slots(p);
  for (int b = 0; b < p; ++b) slots[b].resize(computes[b].size());
  auto consumer_key = [&](const Action& recv) {
    return (recv.kind == K::kRecvGrad ? m * v : 0) + recv.microbatch * v + recv.chunk;
  };
  for (int b = 0; b < p && p > 1; ++b) {
    std::vector<int> position(2 * m * v);  // compute index on b by consumer_key
    for (int j = 0; j < static_cast<int>(computes[b].size()); ++j) {
      const Action& a = computes[b][j];
      position[(a.kind == K::kBackward ? m * v : 0) + a.microbatch * v + a.chunk] = j;
    }
    const int prev = (b + p - 1) % p, next = (b + 1) % p;
    for (int a : prev == next ? std::vector<int>{prev} : std::vector<int>{prev, next}) {
      std::vector<Action> recvs;  // a's sends to b, in a's order, as b's receives
      for (const Action& c : computes[a])
        if (auto send = send_after(c, a, p, v); send && action_peer(*send, a, p) == b)
          recvs.push_back(matching_recv(*send, a, p));
      // One compute ahead of the consumer, but never after a receive that must precede it.
      std::vector<int> slot(recvs.size());
      for (int i = static_cast<int>(recvs.size()) - 1, later = INT_MAX; i >= 0; --i)
        later = slot[i] = std::min(std::max(position[consumer_key(recvs[i])] - 1, 0), later);
      for (size_t i = 0; i < recvs.size(); ++i) slots[b][slot[i]].push_back(recvs[i]);
    }
  }

  Schedule sched{p, v, m, kind, std::vector<std::vector<Action>>(p)};
  for (int s = 0; s < p; ++s)
    for (size_t j = 0; j < computes[s].size(); ++j) {
      auto& list = sched.ranks[s];
      list.insert(list.end(), slots[s][j].begin(), slots[s][j].end());
      list.push_back(computes[s][j]);
      if (auto send = send_after(computes[s][j], s, p, v)) list.push_back(*send);
    }
  return sched;
}

SimResult simulate(const Schedule& sched, const SimCosts& cost) {
  const int p = sched.p, v = sched.v, m = sched.m;
  SimResult r;
  r.ideal = m * v * (cost.forward + cost.backward);
  r.max_in_flight.assign(std::max(p, 0), 0);
  if (p < 1 || v < 1 || m < 1 || static_cast<int>(sched.ranks.size()) != p) {
    r.problem =
        cat("schedule has ", sched.ranks.size(), " rank lists for p ", p, ", v ", v, ", m ", m);
    return r;
  }

  struct Message {
    Action recv;  // the message as the receiver names it
    double time;  // when it was sent (a send) or posted (a receive)
  };
  struct Channel {
    std::vector<Message> sends, recvs;  // matched by position
  };
  std::vector<Channel> channels(p * p);  // [from * p + to]
  const int n = m * v;
  auto key = [&](int mb, int c) { return mb * v + c; };
  struct Rank {
    size_t pc = 0;
    double time = 0;  // when the rank is free
    int in_flight = 0;
    std::vector<char> forwarded, backwarded, sent_activation, sent_grad;
    std::vector<int> posted_activation, posted_grad;  // index in the channel's recvs; -1: none
    std::string waiting;                              // why the rank is blocked
  };
  std::vector<Rank> ranks(p);
  for (Rank& rk : ranks) {
    rk.forwarded = rk.backwarded = rk.sent_activation = rk.sent_grad = std::vector<char>(n, 0);
    rk.posted_activation = rk.posted_grad = std::vector<int>(n, -1);
  }

  // The first mismatch of a channel shows once both ends of message i exist.
  auto check_match = [&](int from, int to, size_t i) {
    const Channel& ch = channels[from * p + to];
    if (i < ch.sends.size() && i < ch.recvs.size() && !(ch.sends[i].recv == ch.recvs[i].recv))
      r.problem = cat("rank ", from, " -> ", to, ": send #", i + 1, " is ",
                      message_name(ch.sends[i].recv), " but recv #", i + 1, " is ",
                      message_name(ch.recvs[i].recv));
  };

  // Runs rank s's next action; false when it must wait (or a problem was found).
  auto step = [&](int s) -> bool {
    Rank& rk = ranks[s];
    const Action& a = sched.ranks[s][rk.pc];
    const std::string where = cat("rank ", s, ": ", to_string(a));
    if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= v) {
      r.problem = cat(where, " is out of range (m ", m, ", v ", v, ")");
      return false;
    }
    const int k = key(a.microbatch, a.chunk);
    const bool first = first_stage(s, a.chunk), last = last_stage(s, a.chunk, p, v);
    const bool is_recv = a.kind == K::kRecvActivation || a.kind == K::kRecvGrad;
    const bool is_send = a.kind == K::kSendActivation || a.kind == K::kSendGrad;

    if (is_recv || is_send) {
      const bool activation = a.kind == K::kRecvActivation || a.kind == K::kSendActivation;
      const bool no_peer = (a.kind == K::kRecvActivation || a.kind == K::kSendGrad) ? first : last;
      if (p == 1 || no_peer) {
        const char* why = p == 1 ? "a single rank"
                          : first ? "the first virtual stage"
                                  : "the last virtual stage";
        r.problem = cat(where, " has no peer (", why, ")");
        return false;
      }
      const int peer = action_peer(a, s, p);
      if (is_recv) {
        int& posted = activation ? rk.posted_activation[k] : rk.posted_grad[k];
        if (posted >= 0) {
          r.problem = cat(where, " posted twice");
          return false;
        }
        Channel& ch = channels[peer * p + s];
        posted = static_cast<int>(ch.recvs.size());
        ch.recvs.push_back({a, rk.time});
        check_match(peer, s, ch.recvs.size() - 1);
      } else {
        char& sent = activation ? rk.sent_activation[k] : rk.sent_grad[k];
        if (!(activation ? rk.forwarded[k] : rk.backwarded[k])) {
          r.problem = cat(where, " before its ", activation ? "forward" : "backward");
          return false;
        }
        if (sent) {
          r.problem = cat(where, " sent twice");
          return false;
        }
        sent = 1;
        Channel& ch = channels[s * p + peer];
        ch.sends.push_back({matching_recv(a, s, p), rk.time});
        check_match(s, peer, ch.sends.size() - 1);
      }
      return r.problem.empty();
    }

    const bool forward = a.kind == K::kForward;
    if (forward ? rk.forwarded[k] : rk.backwarded[k]) {
      r.problem = cat(where, " is duplicated");
      return false;
    }
    if (!forward && !rk.forwarded[k]) {
      r.problem = cat(where, " before its forward");
      return false;
    }
    // When the input is ready: made here (first/last stage), computed by the previous/next
    // chunk of this rank (p == 1), or received.
    double ready = 0;
    if (forward ? !first : !last) {
      if (p == 1) {
        const int from = key(a.microbatch, a.chunk + (forward ? -1 : 1));
        if (!(forward ? rk.forwarded[from] : rk.backwarded[from])) {
          r.problem = cat(where, " before its input is computed");
          return false;
        }
      } else {
        const int posted = forward ? rk.posted_activation[k] : rk.posted_grad[k];
        if (posted < 0) {
          r.problem = cat(where, " without its receive posted before it");
          return false;
        }
        const int peer = action_peer({forward ? K::kRecvActivation : K::kRecvGrad, 0, 0}, s, p);
        const Channel& ch = channels[peer * p + s];
        if (posted >= static_cast<int>(ch.sends.size())) {
          rk.waiting = cat(where, " waits for send #", posted + 1, " of rank ", peer);
          return false;
        }
        ready = ch.sends[posted].time + cost.send;
      }
    }
    rk.time = std::max(rk.time, ready) + (forward ? cost.forward : cost.backward);
    (forward ? rk.forwarded : rk.backwarded)[k] = 1;
    rk.in_flight += forward ? 1 : -1;
    r.max_in_flight[s] = std::max(r.max_in_flight[s], rk.in_flight);
    return true;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s)
      while (ranks[s].pc < sched.ranks[s].size() && step(s)) {
        ++ranks[s].pc;
        progress = true;
      }
    if (!r.problem.empty()) return r;
  }

  for (int s = 0; s < p; ++s)
    if (ranks[s].pc < sched.ranks[s].size()) {
      r.deadlock = true;
      r.problem += (r.problem.empty() ? "deadlock: " : "; ") + ranks[s].waiting;
    }
  if (r.deadlock) return r;

  for (int s = 0; s < p; ++s)
    for (int mb = 0; mb < m; ++mb)
      for (int c = 0; c < v; ++c)
        for (K kind : {K::kForward, K::kBackward})
          if (!(kind == K::kForward ? ranks[s].forwarded : ranks[s].backwarded)[key(mb, c)]) {
            r.problem = cat("rank ", s, ": ", to_string({kind, mb, c}), " is missing");
            return r;
          }
  for (int from = 0; from < p; ++from)
    for (int to = 0; to < p; ++to) {
      const Channel& ch = channels[from * p + to];
      const size_t matched = std::min(ch.sends.size(), ch.recvs.size());
      if (ch.sends.size() > matched)
        r.problem = cat("rank ", from, " -> ", to, ": send #", matched + 1, " (",
                        message_name(ch.sends[matched].recv), ") has no receive");
      else if (ch.recvs.size() > matched)
        r.problem = cat("rank ", from, " -> ", to, ": recv #", matched + 1, " (",
                        message_name(ch.recvs[matched].recv), ") has no send");
      if (!r.problem.empty()) return r;
    }

  for (const Rank& rk : ranks) r.makespan = std::max(r.makespan, rk.time);
  r.bubble = (r.makespan - r.ideal) / r.ideal;
  return r;
}

std::vector<int> partition_layers(int layers, int stages, double layer_cost, double embed_cost,
                                  double head_cost) {
  if (stages < 1) throw_input("pipeline: the number of stages must be at least 1, got ", stages);
  if (layers < stages)
    throw_input("model.layers = ", layers, " cannot fill ", stages,
                " pipeline stages (pp x virtual_stages): each needs at least one layer");
  MYRIAD_CHECK(layer_cost > 0, "layer_cost ", layer_cost);
  auto cost = [&](int stage, int n) {
    return n * layer_cost + (stage == 0 ? embed_cost : 0) + (stage == stages - 1 ? head_cost : 0);
  };
  // Layers cost the same, so giving each next layer to the stage that stays cheapest with it
  // reaches the smallest possible maximum, whichever of equally cheap stages takes it; the one
  // holding fewer layers does, which keeps the counts even.
  std::vector<int> counts(stages, 1);
  for (int left = layers - stages; left > 0; --left) {
    int best = 0;
    for (int i = 1; i < stages; ++i) {
      const double here = cost(i, counts[i] + 1), there = cost(best, counts[best] + 1);
      if (here < there || (here == there && counts[i] < counts[best])) best = i;
    }
    ++counts[best];
  }
  return counts;
}

std::vector<std::pair<int, int>> stage_layer_ranges(const std::vector<int64_t>& stage_layers,
                                                    int layers, int p, int v, double layer_cost,
                                                    double embed_cost, double head_cost) {
  // The parallel layout checked the counts (core/parallel_layout.h).
  const int stages = p * v;
  MYRIAD_CHECK(p >= 1 && v >= 1 && layers >= stages, "pipeline: ", layers, " layers on pp ", p, " x v ", v);
  std::vector<int> counts;
  if (stage_layers.empty()) {
    counts = partition_layers(layers, stages, layer_cost, embed_cost, head_cost);
  } else {
    int64_t sum = 0;
    for (int64_t n : stage_layers) sum += n;
    MYRIAD_CHECK(static_cast<int>(stage_layers.size()) == stages && sum == layers &&
                     *std::min_element(stage_layers.begin(), stage_layers.end()) >= 1,
                 "pipeline: stage_layers do not split ", layers, " layers over ", stages, " stages");
    counts.assign(stage_layers.begin(), stage_layers.end());
  }
  std::vector<std::pair<int, int>> ranges;
  for (int begin = 0; int n : counts) {
    ranges.emplace_back(begin, begin + n);
    begin += n;
  }
  return ranges;
}

}  // namespace myriad::parallel
