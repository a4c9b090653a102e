// Node-level batch sharing (MegaScale's tree-based loader, one level): the ranks of a node that
// train on the same batch (a tensor-parallel group) get it from one reader through shared
// memory instead of each reading and shuffling the token files.
//
// The reader publishes step s's tokens into slot s % 2 of a POSIX shared-memory segment; the
// other members copy them out and count themselves done; the reader reuses a slot only after
// every member has taken what it held. Blocking calls give up after `timeout_s` with a
// communication error (a member that died is a lost peer). The reader unlinks the name as soon
// as every member has mapped the segment, so a kill after start-up leaks nothing; before that,
// the launcher's remove_node_segments cleans up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad::data {

// Segment names: "/myriad-<job>-<store>-<attempt>-n<node>-" then what the job adds, <store> a
// hash of the job's store URL (two jobs of one name, on different stores, may share a host).
// Every segment of a node's workers starts so, which lets the launcher remove what killed
// workers leave behind.
std::string node_segment_prefix(const std::string& job, const std::string& store, const std::string& attempt,
                                int node);
// Unlinks the node's segments of that job and attempt (only once its workers have ended);
// returns how many there were.
int remove_node_segments(const std::string& job, const std::string& store, const std::string& attempt, int node);

class SharedBatch {
 public:
  // `name` identifies the segment on the node (job, attempt and group); `members` counts the
  // reader too; `ints` is the size of one batch in int32 tokens.
  SharedBatch(const std::string& name, bool reader, int members, int64_t ints, double timeout_s);
  ~SharedBatch();
  SharedBatch(const SharedBatch&) = delete;
  SharedBatch& operator=(const SharedBatch&) = delete;

  // Reader: makes `tokens` (ints values) the batch of 1-based `step`.
  void publish(int64_t step, const int32_t* tokens);
  // Other members: the batch of `step` into `tokens` (ints values).
  void take(int64_t step, int32_t* tokens);

 private:
  struct Header;
  Header* header() const;
  int32_t* slot(int64_t step) const;

  std::string name_;
  bool reader_;
  int members_;
  int64_t ints_;
  double timeout_s_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  bool linked_ = false;  // the reader's name is still in /dev/shm
};

}  // namespace myriad::data
