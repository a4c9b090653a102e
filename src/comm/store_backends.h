// The two Store implementations, opened through make_store (store.h). Internal to src/comm.
#pragma once

#include <memory>
#include <string>

#include "comm/store.h"

namespace myriad::comm {

// Files under DIR/myriad/<job>/<attempt>/ (created): one per key, written to a temporary file and
// renamed into place; set, add, compare_set and del hold an flock on the attempt's lock file.
// Expiry is recorded in each file and honoured by readers. Waits poll the file.
std::unique_ptr<Store> open_file_store(const std::string& dir, const std::string& job,
                                       const std::string& attempt, double timeout_s);

struct RedisAddress {
  std::string host;
  int port = 6379;
  std::string user;      // empty = the default user
  std::string password;  // empty = no AUTH
};

// One TCP connection through hiredis. Waits are notifications, not polling (redis_store.cc says
// why); batches are pipelined.
std::unique_ptr<Store> open_redis_store(const RedisAddress& address, const std::string& job,
                                        const std::string& attempt, double timeout_s);

}  // namespace myriad::comm
