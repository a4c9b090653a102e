// The job's shared state in the store, for the node agents of a supervised launch (`myriad launch
// --max-restarts N`): each agent's heartbeat, why each attempt stopped (the first node to say so
// wins), what each node's self-check found, the spares and the node each takes over, and the
// nodes evicted. The keys live in the job's "driver" namespace, which outlives the attempts
// (claim_attempt drops numbered attempts only).
//
//   agent/<name>          JSON heartbeat (host, node, pid, attempt, workers' steps and phases,
//                         recent error lines), expiring after 5 beats: absent = lost
//   stop/<A>              JSON {node, rank, class, detail}: why attempt A stopped
//   diag/<A>/<node>       JSON {ok, detail}: the node's self-check after attempt A stopped
//   leave/<A>             JSON {node: why}: the nodes that leave the job after attempt A (the
//                         first agent's view to be written stands, for every agent)
//   plan/<A>              JSON {spares: {node: k}, shrink: {nodes, dp}, nnodes, dp, error}: how
//                         the leader fills their places, and the layout attempt A+1 runs
//   end                   JSON {attempt, status}: the job ended (spares waiting leave)
//   spares                how many spares ever joined; spare/<k> their heartbeats;
//   spare/<k>/node        "<node> <attempt>": what spare k takes over, from when (set once, by the leader)
//   evicted/<name>        the block list: why the node of that --node-name left the job
//   flight/<A>/<rank>     JSON {record, beat}: a rank's flight record (null when it wrote none: a
//                         stopped process) and last heartbeat, after attempt A hung, for the
//                         job's hang report (node 0's agent writes it)
//
// One Store connection per board: one thread at a time, as Store.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/store.h"
#include "driver/policy.h"

namespace myriad::driver {

// A heartbeat's life (agent/<name>, spare/<k>): 5 beats of `heartbeat_s` (at least 1 s: the
// agent's loop turns about once a second, whatever is asked). An agent not seen for that long is
// lost; a key of a starting or ended agent expires after it too.
inline double beat_ttl_s(double heartbeat_s) { return 5 * (heartbeat_s > 1 ? heartbeat_s : 1.0); }

class JobBoard {
 public:
  // Opens the store of the job's rendezvous URL; fails like comm::make_store. Each call retries
  // a store that does not answer for up to `patience_s` (a Redis server restarting), then throws.
  JobBoard(const std::string& url, double timeout_s, double patience_s = 0);

  void beat(const std::string& name, const nlohmann::json& state, double ttl_s);
  std::optional<nlohmann::json> heartbeat(const std::string& name);
  // Whether a heartbeat is a running agent's: not ended ("done", "ended") and within its life.
  static bool live(const nlohmann::json& beat);
  // A starting agent takes agent/<name> (writing `state`), unless a live agent holds it: returns
  // that agent's heartbeat then, and writes nothing. Atomic: of two launches that start together,
  // one gets the place.
  std::optional<nlohmann::json> claim(const std::string& name, const nlohmann::json& state, double ttl_s);

  // Records why attempt A stopped unless a node did first; returns the record that stands.
  nlohmann::json stop(int64_t attempt, const nlohmann::json& cause);
  std::optional<nlohmann::json> stopped(int64_t attempt);

  void diagnosed(int64_t attempt, int node, const nlohmann::json& result);
  std::optional<nlohmann::json> diagnosis(int64_t attempt, int node);

  // Who leaves after attempt A: set once, by the first agent to propose; returns what stands.
  nlohmann::json leave(int64_t attempt, const nlohmann::json& proposal);
  // How their places are filled (the leader's, set once) and the layout of attempt A+1; returns
  // what stands.
  Settlement settle(int64_t attempt, const Settlement& plan);
  std::optional<Settlement> settled(int64_t attempt);

  // The job's end, for the spares still waiting.
  void end(const nlohmann::json& how);
  std::optional<std::string> ended();

  // A spare joins: its number k (from 0), under which it beats as "spare<k>".
  int64_t join_as_spare();
  // The live spares that have no node yet.
  std::vector<int64_t> idle_spares();
  // Gives node `node` from attempt `attempt` on to spare k, unless it has one already.
  bool assign_spare(int64_t k, int node, int64_t attempt);
  // The node spare k takes over and the attempt it starts, once assigned.
  std::optional<std::pair<int, int64_t>> assignment(int64_t k);

  // A rank's flight record and last heartbeat after attempt A hung (see above).
  void flight(int64_t attempt, int rank, const nlohmann::json& entry);
  std::optional<nlohmann::json> flight_of(int64_t attempt, int rank);

  // The block list: why the node named `name` (its --node-name, by default its host) left the
  // job. An agent or spare of that name may not join the job again.
  void block(const std::string& name, const std::string& why);
  std::optional<std::string> blocked(const std::string& name);

 private:
  std::optional<nlohmann::json> json_at(const std::string& key);
  // fn(store), retried while the store does not answer, up to patience_.
  template <class F>
  auto patiently(F fn) -> decltype(fn(std::declval<comm::Store&>()));
  std::unique_ptr<comm::Store> store_;
  double patience_;
};

}  // namespace myriad::driver
