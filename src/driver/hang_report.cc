#include "driver/hang_report.h"

#include <map>
#include <set>
#include <vector>

#include "core/error.h"

namespace myriad::driver {

std::optional<Holdup> find_holdup(const nlohmann::json& workers) {
  // group -> rank -> its last operation there
  std::map<std::string, std::map<int, const nlohmann::json*>> by_group;
  for (const nlohmann::json& w : workers) {
    if (!w.contains("rank") || !w.contains("groups")) continue;
    for (const nlohmann::json& g : w["groups"]) by_group[g.value("group", "")][w["rank"].get<int>()] = &g;
  }
  std::map<int, std::set<int>> waits_on;      // rank -> the ranks it waits on
  std::map<int, std::vector<std::string>> waiters;  // rank waited on -> "rank 0 in tp0's all_reduce #61"
  for (const auto& [group, members] : by_group)
    for (const auto& [rank, op] : members) {
      if (op->value("state", "") == "done") continue;
      const uint64_t m = op->value("match", uint64_t(0));
      for (const auto& [peer, theirs] : members)
        if (peer != rank && theirs->value("match", uint64_t(0)) < m) {
          waits_on[rank].insert(peer);
          waiters[peer].push_back(cat("rank ", rank, " in ", group, "'s ", op->value("op", "?"), " #", m));
        }
    }
  std::vector<int> held_by;
  for (const auto& [rank, list] : waiters)
    if (waits_on[rank].empty()) held_by.push_back(rank);
  if (held_by.size() != 1) return std::nullopt;
  const int r = held_by[0];
  std::string who;
  for (const std::string& w : waiters[r]) who += (who.empty() ? "" : ", ") + w;
  std::string where;
  for (const nlohmann::json& w : workers)
    if (w.value("rank", -1) == r)
      where = cat(" (its last step ", w.value("step", int64_t(-1)), ", phase ", w.value("phase", std::string("?")), ")");
  return Holdup{r, cat("rank ", r, where, " holds the job up: ", who, " waits for it")};
}

}  // namespace myriad::driver
