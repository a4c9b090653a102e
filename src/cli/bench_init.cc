// `myriad bench-init`: the control-plane part of Myriad's set-up, for N simulated ranks on one
// machine.
//
// Each simulated rank opens its own store connection (as a real rank does) and runs exactly the
// store conversation of the real communicator set-up (comm::IdExchange, which make_groups runs
// through exchange_ids) for its groups of a 3D layout: world, then its tp, pp and dp groups. A few
// threads multiplex all the ranks' connections (comm::run_conversations), each rank a state
// machine, so thousands of ranks fit on a few cores; the Redis server (or the store directory) is
// the shared resource being measured. Every rank checks the ids it received. Prints one JSON line:
// the wall time until the last rank finished, and the store operations per rank.
//
// Without --url it starts its own redis-server (maxclients above N) on a free loopback port, or
// for the file store uses a fresh directory under /dev/shm (tmpfs; creating files on a disk file
// system costs far more), and removes either afterwards.
//
//   myriad bench-init --ranks N [--store redis|file] [--url URL] [--threads T] [--tp 8] [--pp P]
//                     [--timeout S]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/args.h"
#include "comm/local_redis.h"
#include "comm/rendezvous.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/log.h"

namespace myriad::cli {
namespace {

// The groups of world rank r in a tp x pp x dp layout with tp fastest, then dp, then pp
// (parallel.order = "tp-dp-pp"), in the global order world, tp, pp, dp.
std::vector<comm::GroupSpec> layout_groups(int r, int world, int tp, int pp) {
  const int dp = world / (tp * pp);
  const int t = r % tp, d = (r / tp) % dp, p = r / (tp * dp);
  return {{"world", r, world},
          {cat("tp", r / tp), t, tp},
          {cat("pp", t + tp * d), p, pp},
          {cat("dp", t + tp * p), d, dp}};
}

// What a leader publishes: the size of an ncclUniqueId (128 bytes), different per group.
std::string fake_id(const std::string& group) {
  std::string id(128, '\0');
  uint64_t h = 1469598103934665603ull;
  for (char c : group) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  for (char& c : id) {
    h ^= h << 13, h ^= h >> 7, h ^= h << 17;
    c = static_cast<char>(h);
  }
  return id;
}

// The exchange of one simulated rank, which also checks that it received every leader's id.
class CheckedExchange final : public comm::Conversation {
 public:
  explicit CheckedExchange(std::vector<comm::GroupSpec> groups)
      : groups_(groups), exchange_(groups, ids_of(groups, true)) {}
  std::vector<comm::StoreOp> next(const std::vector<comm::StoreResult>& results) override {
    std::vector<comm::StoreOp> ops = exchange_.next(results);
    if (ops.empty() && exchange_.ids() != ids_of(groups_, false))
      throw Error(ErrorClass::kInternal, "bench-init: a rank received a wrong group id");
    return ops;
  }

 private:
  // Every group's id, or only those this rank publishes (the others empty).
  static std::vector<std::string> ids_of(const std::vector<comm::GroupSpec>& groups,
                                         bool leading_only) {
    std::vector<std::string> ids;
    for (const comm::GroupSpec& g : groups)
      ids.push_back(!leading_only || g.rank == 0 ? fake_id(g.name) : "");
    return ids;
  }
  std::vector<comm::GroupSpec> groups_;
  comm::IdExchange exchange_;
};

std::string without_password(const std::string& url) {
  const size_t scheme = url.find("://"), at = url.rfind('@');
  if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
  return url.substr(0, scheme + 3) + "***" + url.substr(at);
}

// Raises the open-file limit to what `ranks` connections need (inherited by a local server).
void raise_file_limit(int ranks) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t need = static_cast<rlim_t>(ranks) + 256;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < need)
    throw_input("bench-init: ", ranks, " ranks need ", need, " open files; the limit is ",
                lim.rlim_cur, " (raise the hard limit: ulimit -Hn)");
}

}  // namespace

int cmd_bench_init(int argc, char** argv) {
  Args args("bench-init", argc, argv, {"ranks", "store", "url", "threads", "tp", "pp", "timeout"});
  const long long ranks = args.get_int("ranks", 0);
  if (ranks < 1 || ranks > 1'000'000)
    throw_input("bench-init: --ranks must be 1..1000000, got ", ranks);
  const int n = static_cast<int>(ranks);
  const int tp = static_cast<int>(args.get_int("tp", std::min(8, n)));
  if (tp < 1 || n % tp != 0) throw_input("bench-init: --tp ", tp, " must divide --ranks ", n);
  const int pp = static_cast<int>(args.get_int("pp", std::min(8, n / tp)));
  if (pp < 1 || (n / tp) % pp != 0)
    throw_input("bench-init: --pp ", pp, " must divide --ranks / --tp = ", n / tp);
  const int dp = n / (tp * pp);
  const double timeout_s = args.get_double("timeout", 60);
  if (!(timeout_s > 0)) throw_input("bench-init: --timeout must be > 0");

  std::string url = args.get("url");
  std::string kind =
      args.get("store", url.empty() ? "redis" : (url.rfind("redis://", 0) == 0 ? "redis" : "file"));
  if (kind != "redis" && kind != "file")
    throw_input("bench-init: --store must be redis or file, got '", kind, "'");
  if (!url.empty() && (url.rfind("redis://", 0) == 0) != (kind == "redis"))
    throw_input("bench-init: --url ", without_password(url), " is not a ", kind, " store");
  // By default one thread per core, less one core for a redis-server of our own.
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const bool own_server = url.empty() && kind == "redis";
  const int threads =
      static_cast<int>(args.get_int("threads", own_server ? std::max(1, hw - 1) : hw));
  if (threads < 1) throw_input("bench-init: --threads must be >= 1");

  raise_file_limit(n);
  const std::string job = cat("bench-init-", ::getpid());
  std::unique_ptr<comm::LocalRedis> server;
  std::string temp_dir;
  if (own_server) {
    server = std::make_unique<comm::LocalRedis>(std::vector<std::string>{
        "--maxclients", std::to_string(n + 1000), "--tcp-backlog", "4096"});
    url = server->url(job);
  } else if (url.empty()) {  // tmpfs when there is one: creating files is what a file store costs
    const bool shm = std::filesystem::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0;
    temp_dir =
        ((shm ? std::filesystem::path("/dev/shm") : std::filesystem::temp_directory_path()) / job)
            .string();
    url = "file://" + temp_dir + "/" + job;
  }
  // A fresh attempt, so that runs against a shared store never meet each other's counters.
  const std::string attempt = cat("b", std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count());
  log::info("bench-init: ", n, " ranks (tp ", tp, " x pp ", pp, " x dp ", dp, "), store ",
            without_password(url), ", ", threads, " threads");

  comm::MuxReport rep;
  try {
    rep = comm::run_conversations(
        n, threads, [&](int) { return comm::make_store(url, attempt, timeout_s); },
        [&](int r) { return std::make_unique<CheckedExchange>(layout_groups(r, n, tp, pp)); },
        timeout_s);
  } catch (...) {
    if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
    throw;
  }
  if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
  server.reset();
  if (rep.failed > 0)
    throw Error(ErrorClass::kComm, cat("bench-init: ", rep.failed, " of ", n,
                                       " ranks failed; first: ", rep.first_error));
  nlohmann::json out = {{"ranks", n},
                        {"tp", tp},
                        {"pp", pp},
                        {"dp", dp},
                        {"store", kind},
                        {"url", without_password(url)},
                        {"threads", threads},
                        {"wall_s", rep.wall_s},
                        {"open_s", rep.open_s},
                        {"ops_per_rank", static_cast<double>(rep.ops) / n},
                        {"round_trips_per_rank", static_cast<double>(rep.round_trips) / n},
                        {"max_ops_per_rank", rep.max_ops},
                        {"store_ops", rep.ops},
                        {"store_ops_per_s", rep.wall_s > 0 ? rep.ops / rep.wall_s : 0.0}};
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace myriad::cli
