// A private redis-server on a free loopback port, for tests and bench-init (never for jobs: a
// job's store is given by URL). No persistence; it dies with the thread that started it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace myriad::comm {

class LocalRedis {
 public:
  // Starts redis-server ($MYRIAD_REDIS_SERVER, else redis-server on the PATH) on 127.0.0.1 with
  // `--save '' --appendonly no` plus `extra` arguments, and waits until it answers PING.
  // Throws Error(kRuntime) when it cannot.
  // `port` > 0: on that port (a server restarted where its clients look for it).
  explicit LocalRedis(const std::vector<std::string>& extra = {}, int port = 0);
  ~LocalRedis();  // stops the server
  LocalRedis(const LocalRedis&) = delete;
  LocalRedis& operator=(const LocalRedis&) = delete;

  int port() const { return port_; }
  // "redis://127.0.0.1:<port>/<job>"
  std::string url(const std::string& job) const;
  // SIGKILL now (a store that disappears); the destructor then only reaps it.
  void kill();

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace myriad::comm
