// Pipeline-parallel schedules as pure data: what each stage does, in which order, for one step.
//
// p ranks (stages) s each hold v model chunks c; local chunk c on rank s is global virtual stage
// g = c*p + s (Megatron's interleaving), and the forward runs g = 0 .. p*v-1. A schedule is one
// action list per rank; an executor walks it, a simulator checks it, and nothing here touches a
// model or a communicator, so every schedule is tested without either (Megatron, torchtitan).
//
// Messages between two ranks are matched in the order they are posted, without tags, and an
// activation and a gradient have the same size. make_schedule therefore lists every rank's
// receives from a peer in exactly the order that peer lists its sends to it:
//   - each send comes right after the compute that produced it;
//   - the receives b posts from a are a's sends to b, in a's order; each is placed one compute
//     before the compute that consumes it (so the transfer overlaps that compute), or earlier
//     when a message a sent before it must be received first.
// Sends and receives never block the executor; only a Forward/Backward whose input has not
// arrived does.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace myriad::parallel {

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved };
// "gpipe", "1f1b", "interleaved"; anything else is an input error.
ScheduleKind schedule_kind(const std::string& name);

enum class ActionKind {
  kForward,
  kBackward,
  kRecvActivation,
  kSendActivation,
  kRecvGrad,
  kSendGrad
};

// chunk is local to the rank. A receive names the chunk that consumes the message, a send the
// chunk that produced it.
struct Action {
  ActionKind kind;
  int microbatch;
  int chunk;
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);  // "backward(mb 3, chunk 0)", for messages and tests

// The rank a send/recv action on `rank` talks to: the previous stage for activations in and
// gradients out, the next for activations out and gradients in (ring order: the last rank feeds
// rank 0's next chunk). -1 for a compute.
int action_peer(const Action& a, int rank, int p);

struct Schedule {
  int p, v, m;
  ScheduleKind kind;
  std::vector<std::vector<Action>> ranks;  // ranks[s]: rank s's actions in execution order
};

// GPipe: all forwards chunk by chunk, then all backwards in reverse. 1F1B (v == 1): p-s-1
// warm-up forwards, then one forward one backward, so rank s holds at most p-s activations.
// Interleaved (m % p == 0): micro-batches move through the chunks in groups of p, cutting the
// bubble by v at the price of more warm-up activations; v == 1 is 1F1B.
// Throws an input error for p, v or m < 1, 1F1B with v > 1, interleaved with m % p != 0.
Schedule make_schedule(ScheduleKind kind, int p, int v, int m);

// Per chunk per micro-batch; send is the latency from a send to its arrival.
struct SimCosts {
  double forward = 1, backward = 2, send = 0;
};
struct SimResult {
  bool deadlock = false;
  std::string problem;             // the first violated rule; empty when the schedule is sound
  double makespan = 0;             // the latest time any rank finishes its list
  double ideal = 0;                // m*v*(forward + backward): one rank's compute
  double bubble = 0;               // (makespan - ideal) / ideal
  std::vector<int> max_in_flight;  // per rank: most forwards done whose backward is not
};
// Runs all ranks' lists together: a compute starts when its rank is free and its input has
// arrived (matching send done + latency, receive posted); sends and receives take no time.
// Checks the matching of every pair's sends and receives, that each (mb, chunk) is forwarded
// and backwarded exactly once per rank in that order, and that no result is sent before it is
// computed. Stops at the first problem.
SimResult simulate(const Schedule& s, const SimCosts& c = {});

// Layers per virtual stage (stages = p*v, in global virtual-stage order), each >= 1, minimizing
// the most expensive stage: every layer costs layer_cost, the first stage also pays embed_cost
// (embedding) and the last head_cost (final norm, LM head, loss). Among equally good splits the
// counts are kept even, extra layers going to earlier stages.
std::vector<int> partition_layers(int layers, int stages, double layer_cost, double embed_cost,
                                  double head_cost);

// The layers [begin, end) of each virtual stage (global order): parallel.stage_layers when
// given (p*v counts, each >= 1, summing to layers: input error otherwise), else
// partition_layers. Input error when layers < p*v.
std::vector<std::pair<int, int>> stage_layer_ranges(const std::vector<int64_t>& stage_layers,
                                                    int layers, int p, int v, double layer_cost,
                                                    double embed_cost, double head_cost);

}  // namespace myriad::parallel
