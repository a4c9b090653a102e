// Who holds a stalled job up, from the workers' heartbeats (runtime/heartbeat.h): each reports,
// per group, the last operation it issued (its match number, what the group's members share)
// and whether it finished. A rank whose last operation in group G is #m and still pending waits
// on every member of G that has issued fewer than m operations there. The ranks waited on that
// themselves wait on nobody hold the job up: a stuck training thread, a stuck kernel. A cycle
// (a true deadlock, operations issued in different orders) has no such rank.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace myriad::driver {

struct Holdup {
  int rank = -1;
  std::string detail;  // "rank 1 holds the job up: rank 0 waits for it in tp0's all_reduce #61, ..."
};

// `workers`: an array of heartbeats, each with "rank" and "groups" ([{group, op, match, state}]),
// and optionally "step" and "phase". nullopt when no single rank is waited on by the others.
std::optional<Holdup> find_holdup(const nlohmann::json& workers);

}  // namespace myriad::driver
