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
//   outcome/<A>           JSON {evict: [nodes], spares: {node: spare}, error}: the leader's decision
//   spares                how many spares ever joined; spare/<k> their heartbeats;
//   spare/<k>/node        "<node> <attempt>": what spare k takes over, from when (set once, by the leader)
//   evicted/<host>        the block list: why that host left the job
//
// One Store connection per board: one thread at a time, as Store.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "comm/store.h"

namespace myriad::driver {

class JobBoard {
 public:
  // Opens the store of the job's rendezvous URL; fails like comm::make_store.
  JobBoard(const std::string& url, double timeout_s);

  void beat(const std::string& name, const nlohmann::json& state, double ttl_s);
  std::optional<nlohmann::json> heartbeat(const std::string& name);

  // Records why attempt A stopped unless a node did first; returns the record that stands.
  nlohmann::json stop(int64_t attempt, const nlohmann::json& cause);
  std::optional<nlohmann::json> stopped(int64_t attempt);

  void diagnosed(int64_t attempt, int node, const nlohmann::json& result);
  std::optional<nlohmann::json> diagnosis(int64_t attempt, int node);

  // The leader's decision after attempt A stopped (set once; returns the one that stands).
  nlohmann::json decide(int64_t attempt, const nlohmann::json& outcome);
  std::optional<nlohmann::json> outcome(int64_t attempt);

  // A spare joins: its number k (from 0), under which it beats as "spare<k>".
  int64_t join_as_spare();
  // Gives node `node` from attempt `attempt` on to a live spare that has none yet; its number,
  // or nullopt when none is live.
  std::optional<int64_t> assign_spare(int node, int64_t attempt);
  // The node spare k takes over and the attempt it starts, once assigned.
  std::optional<std::pair<int, int64_t>> assignment(int64_t k);

  void block(const std::string& host, const std::string& why);
  std::optional<std::string> blocked(const std::string& host);

  const std::string& url() const { return store_->url(); }

 private:
  std::optional<nlohmann::json> json_at(const std::string& key);
  std::unique_ptr<comm::Store> store_;
};

}  // namespace myriad::driver
