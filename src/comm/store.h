// The key-value store that ranks meet through: communicator set-up (unique ids, addresses, arrival
// counters), and later heartbeats and hang reports.
//
// Every key is namespaced as "myriad/<job>/<attempt>/<key>": a restarted job reuses its store, and
// an attempt never sees the keys of an earlier one. Values are arbitrary bytes.
//
//   file:///dir/job  (or a plain path /dir/job)   FileStore: one file per key under
//                                                  /dir/myriad/<job>/<attempt>/; one node
//   redis://[[user]:password@]host:port/job        RedisStore: one connection per Store object
//
// Errors: a bad URL is an input error; a timeout (naming the key and the store), an unreachable
// store or a lost connection is Error(kComm). Nothing waits longer than the store's timeout.
//
// Thread safety: a Store object is used by one thread at a time (it is one connection); ranks that
// run in one process (tests, bench-init) each open their own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace myriad::comm {

// One operation of a batch (Store::run). The ops of a batch run in order; a backend sends a batch
// in one round trip where it can (Redis: pipelining).
struct StoreOp {
  enum class Kind { kSet, kGet, kAdd, kCompareSet, kDel, kWait, kDropAttemptsBelow };
  Kind kind = Kind::kGet;
  std::string key;                      // without the namespace
  std::string value;                    // set: the value; compare_set: the desired value
  std::optional<std::string> expected;  // compare_set: the value required (nullopt: key absent)
  int64_t delta = 0;                    // add
  double ttl_s = 0;                     // set: expire after this many seconds; 0 = never

  static StoreOp set(std::string key, std::string value, double ttl_s = 0);
  static StoreOp get(std::string key);  // does not wait: found = false when absent
  static StoreOp add(std::string key, int64_t delta);
  static StoreOp compare_set(std::string key, std::optional<std::string> expected,
                             std::string desired);
  static StoreOp del(std::string key);
  static StoreOp wait(std::string key);  // until the key exists (within the batch's timeout)
  // Every key of this job in a numbered attempt below `attempt` (the keys a finished or failed
  // launch left behind); the result's number counts the keys dropped. Never touches the store's own attempt.
  static StoreOp drop_attempts_below(int64_t attempt);
};

struct StoreResult {
  bool found = false;  // get: the key exists; del: it existed; compare_set: the key exists after
  std::string value;   // get: the value; compare_set: the value held after the operation
  int64_t number = 0;  // add: the new value
};

const char* op_kind_name(StoreOp::Kind kind);

class Store {
 public:
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // The store for messages: "redis://host:port/job" (never the password) or "file:///dir/job".
  const std::string& url() const { return url_; }
  // "myriad/<job>/<attempt>/": what every key is prefixed with.
  const std::string& prefix() const { return prefix_; }
  // "myriad/<job>/": the prefix shared by every attempt of the job.
  const std::string& job_prefix() const { return job_prefix_; }
  std::string full_key(const std::string& key) const { return prefix_ + key; }
  double timeout_s() const { return timeout_s_; }
  void set_timeout(double seconds) { timeout_s_ = seconds; }

  // Runs `ops` in order and returns one result per op. The waits of a batch share one timeout
  // (the store's unless `timeout_s` >= 0), counted from the call.
  std::vector<StoreResult> run(const std::vector<StoreOp>& ops, double timeout_s = -1);

  // The single operations, each one round trip (two for get when the key is absent at first).
  void set(const std::string& key, const std::string& value, double ttl_s = 0);
  std::string get(const std::string& key);  // waits up to the timeout for the key
  std::optional<std::string> try_get(const std::string& key);
  int64_t add(const std::string& key, int64_t delta = 1);  // atomic; an absent key counts as 0
  // Atomically: when the key holds `expected` (nullopt: when it is absent), sets it to `desired`.
  // Returns what the key holds afterwards (nullopt: absent), so success is result == desired.
  std::optional<std::string> compare_set(const std::string& key,
                                         const std::optional<std::string>& expected,
                                         const std::string& desired);
  void wait(const std::vector<std::string>& keys, double timeout_s = -1);
  bool del(const std::string& key);  // whether the key existed
  int64_t drop_attempts_below(int64_t attempt);  // see StoreOp::drop_attempts_below

  // Non-blocking use, for one thread that drives many stores (run_conversations in rendezvous.h):
  // start() sends a batch without waiting; poll() advances it without blocking and returns true
  // once `out` holds its results. fd() becomes readable when poll() may progress; -1 means "call
  // poll() periodically". One batch at a time. Timeouts and lost stores throw from poll().
  void start(const std::vector<StoreOp>& ops, double timeout_s = -1);
  virtual bool poll(std::vector<StoreResult>* out) = 0;
  virtual int fd() const { return -1; }

  // Operations and round trips (batches) this object has issued.
  struct Stats {
    int64_t ops = 0;
    int64_t round_trips = 0;
  };
  const Stats& stats() const { return stats_; }

 protected:
  Store(std::string url, const std::string& job, const std::string& attempt, double timeout_s);
  // Blocking execution of one batch; `deadline_s` is a steady-clock time (seconds).
  virtual std::vector<StoreResult> run_batch(const std::vector<StoreOp>& ops,
                                             double deadline_s) = 0;
  // Non-blocking: sends the batch (see start()).
  virtual void start_batch(const std::vector<StoreOp>& ops, double deadline_s) = 0;
  [[noreturn]] void throw_timeout(const std::string& key, double waited_s) const;
  double deadline_for(double timeout_s) const;

  Stats stats_;

 private:
  std::string url_;
  std::string prefix_, job_prefix_;
  double timeout_s_;
};

// Opens the store of `url` for attempt `attempt` (digits, letters, '.', '_', '-'). A Redis store
// connects (and authenticates) here, retrying until `timeout_s`.
std::unique_ptr<Store> make_store(const std::string& url, const std::string& attempt,
                                  double timeout_s);

// Seconds on the steady clock (for deadlines).
double steady_now_s();

}  // namespace myriad::comm
