// The store side of creating communicators, shared by every backend and by bench-init.
//
// For each group a rank joins, under the keys "group/<name>/":
//   the leader (rank 0 of the group) sets          id       = its payload (NCCL: the unique id;
//                                                              Gloo: a fresh token for the group)
//   every other member waits for and gets          id
//   every member, holding the id, adds 1 to        arrived
//   the member that brings `arrived` to size sets  release
//   every member waits for                         release
//
// All the groups of one rank go through one exchange of two batches: (1) the ids it leads, the
// wait+get of every other id, the adds; (2) the releases it completed, the waits for every
// release. Two round trips and about four operations per group, whatever the number of groups; a
// group of n costs the store O(n) (one counter), never an n-by-n barrier; a rank touches only the
// keys of its own groups. Leaders' sets come first in a batch, so no rank waits for an id before
// publishing its own: the exchange cannot deadlock, whatever the groups.
//
// Waiting for the release means that, once set-up returns, every member holds the id: a rank that
// never arrives shows up here, as a store timeout naming the group and how many arrived, rather
// than as a hang inside ncclCommInitRank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/store.h"

namespace myriad::comm {

struct GroupSpec {
  std::string name;  // unique within the job attempt: "world", "tp0", "dp3"
  int rank = 0;      // this rank's position in the group
  int size = 1;
};

// A conversation with a store: the batches to run, each chosen from the results of the last.
class Conversation {
 public:
  virtual ~Conversation();
  // The first batch (called with no results), then each next one; empty when finished.
  virtual std::vector<StoreOp> next(const std::vector<StoreResult>& results) = 0;
};

// The exchange described above, as a conversation. payloads[i] is published when this rank leads
// groups[i] (rank 0) and ignored otherwise.
class IdExchange final : public Conversation {
 public:
  IdExchange(std::vector<GroupSpec> groups, std::vector<std::string> payloads);
  std::vector<StoreOp> next(const std::vector<StoreResult>& results) override;
  bool done() const { return phase_ == 3; }
  // The leader's payload of every group, once done.
  const std::vector<std::string>& ids() const { return ids_; }

 private:
  std::vector<GroupSpec> groups_;
  std::vector<std::string> payloads_;
  std::vector<std::string> ids_;
  int phase_ = 0;
};

// Runs the exchange on one store, blocking; returns the ids. On a timeout the Error(kComm) names
// the group and how many of its members had arrived.
std::vector<std::string> exchange_ids(Store& store, const std::vector<GroupSpec>& groups,
                                      const std::vector<std::string>& payloads);

struct MuxReport {
  int conversations = 0;
  int failed = 0;
  std::string first_error;           // of the first failure, if any
  double wall_s = 0;                 // from the first open to the last conversation finished
  double open_s = 0;                 // until every store was open
  int64_t ops = 0, round_trips = 0;  // summed over the stores
  int64_t max_ops = 0, max_round_trips = 0;  // of one store
};

// Drives `count` conversations at once on `threads` threads, each with its own store (opened by
// `open(i)` on the thread that drives it): a thread multiplexes its stores' connections with
// epoll (stores without a descriptor are polled), so thousands of ranks fit on a few cores.
// Conversation i is `make(i)`. A failed conversation is counted, not thrown; conversations not
// finished within timeout_s count as failed.
MuxReport run_conversations(int count, int threads,
                            const std::function<std::unique_ptr<Store>(int)>& open,
                            const std::function<std::unique_ptr<Conversation>(int)>& make,
                            double timeout_s);

}  // namespace myriad::comm
