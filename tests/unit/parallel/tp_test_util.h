// Helpers of the parallel tests: ranks as threads, each with its own Gloo communicator over a
// file store in a temporary directory (as separate processes would have).
#pragma once

#include <omp.h>

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/store.h"
#include "unit/comm/comm_test_util.h"

namespace myriad::parallel::testing {

using comm::testing::run_ranks;
using comm::testing::TempDir;
using comm::testing::unique_job;

// Runs fn(rank, tp) on n threads, tp a fresh group of n ranks named "tp" of a new job; each
// thread uses one OpenMP thread (the test's ranks share the machine's cores).
inline void run_group(TempDir& dir, int n, const std::function<void(int, comm::Communicator&)>& fn) {
  const std::string job = unique_job("tp");
  run_ranks(n, [&](int r) {
    omp_set_num_threads(1);
    comm::CommOptions o;
    o.backend = "gloo";
    o.timeout_s = 60;
    auto store = comm::make_store("file://" + dir.path() + "/" + job, "0", 60);
    auto tp = comm::make_group(std::shared_ptr<comm::Store>(std::move(store)), "tp", r, n, o);
    fn(r, *tp);
  });
}

}  // namespace myriad::parallel::testing
