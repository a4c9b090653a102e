#include "driver/policy.h"

#include <algorithm>

namespace myriad::driver {

const char* action_name(Action a) {
  switch (a) {
    case Action::kRestart: return "restart";
    case Action::kSkipStep: return "skip step";
    case Action::kRerunCheck: return "rerun check";
    case Action::kEvict: return "evict";
    case Action::kReplace: return "replace";
    case Action::kShrink: return "shrink";
    case Action::kStop: return "stop";
  }
  return "?";
}

nlohmann::json encode(const Decision& d) {
  return {{"action", action_name(d.action)}, {"why", d.why}, {"node", d.node}, {"step", d.step}, {"rank", d.rank}};
}

Decision decode_decision(const nlohmann::json& j) {
  Decision d;
  if (!j.is_object()) return d;
  for (Action a : {Action::kRestart, Action::kSkipStep, Action::kRerunCheck, Action::kEvict, Action::kReplace,
                   Action::kShrink, Action::kStop})
    if (j.value("action", "") == action_name(a)) d.action = a;
  d.why = j.value("why", ""), d.node = j.value("node", -1);
  d.step = j.value("step", int64_t(-1)), d.rank = j.value("rank", -1);
  return d;
}

namespace {

// How many faults in a row, this one included, the same node caused, counted back to the last
// change of the job's nodes, up to evict_after. A loss fault, or a fault of no rank (a lost
// agent), ends the run.
int64_t in_a_row(const JobHistory& h, const FaultRecord& f) {
  auto counts = [&](const FaultRecord& r) { return r.node == f.node && r.rank >= 0 && r.kind != FaultKind::kLoss; };
  if (!counts(f)) return 0;
  int64_t n = 1;
  for (auto it = h.past.rbegin(); n < h.evict_after && it != h.past.rend() && !it->nodes_changed && counts(it->fault);
       ++it)
    ++n;
  return n;
}

}  // namespace

std::string persistent_corruption(const JobHistory& h, const FaultRecord& f) {
  if (f.kind != FaultKind::kSdc || h.past.empty()) return "";
  const JobHistory::Past& last = h.past.back();
  if (last.nodes_changed || last.fault.kind != FaultKind::kSdc || last.fault.step != f.step || last.fault.rank != f.rank)
    return "";
  return cat("persistent: the rerun of step ", f.step, " corrupted it again",
             h.nnodes == 1 ? "; replace this node's faulty device" : "");
}

Decision decide(const JobHistory& h, const FaultRecord& f) {
  if (f.cls == ErrorClass::kInput || f.cls == ErrorClass::kInternal)
    return {Action::kStop, cat("a ", class_name(f.cls), " fails the same way on every restart")};
  const std::string persistent = persistent_corruption(h, f);
  if (!persistent.empty() && h.nnodes == 1) return {Action::kStop, persistent};
  if (h.restarts >= h.max_restarts)
    return {Action::kStop, cat("the job made its ", h.max_restarts, " restart(s) (--max-restarts)")};
  // A node leaves: its device corrupts replicas, it failed its check or was lost, or it named
  // itself (a straggler), or it caused the last fault.evict_after faults.
  if (!persistent.empty()) return {Action::kEvict, persistent, f.node};
  if (f.kind == FaultKind::kDiag || f.kind == FaultKind::kLost || f.evict) return {Action::kEvict, f.detail, f.node};
  if (h.nnodes > 1 && f.node >= 0)
    if (const int64_t n = in_a_row(h, f); n >= h.evict_after)
      return {Action::kEvict, cat("it caused the last ", n, " faults (fault.evict_after = ", h.evict_after, ")"), f.node};
  if (f.kind == FaultKind::kSdc)
    return {Action::kRerunCheck, cat("rerun step ", f.step, " and check rank ", f.rank, "'s replica again"), -1, f.step,
            f.rank};
  if (f.kind == FaultKind::kLoss && f.step >= 0 && f.step == h.last_loss_step &&
      std::find(h.skipped.begin(), h.skipped.end(), f.step) == h.skipped.end())
    return {Action::kSkipStep,
            cat("the loss fault at step ", f.step, " recurred on the replay: the data, not a machine; the next "
                "attempt skips that step's batch (train.skip_steps)"),
            -1, f.step};
  return {Action::kRestart, "resuming from the latest committed checkpoint"};
}

Decision fill(const JobHistory& h, int leaving) {
  if (leaving <= 0) return {Action::kRestart, "no node leaves"};
  if (h.idle_spares >= leaving) return {Action::kReplace, cat(leaving, " spare(s) take the places")};
  // Spares for every place or none: a job shrinks around no spare.
  const std::string refused = h.shrink_refused ? h.shrink_refused(leaving) : std::string("the job cannot shrink");
  if (refused.empty()) return {Action::kShrink, cat("no spare: the job goes on without ", leaving, " node(s)")};
  return {Action::kStop, cat("no spare (myriad launch --spare) is there to take its place; ", refused)};
}

nlohmann::json encode(const Settlement& s) {
  nlohmann::json j = {{"spares", nlohmann::json::object()}, {"nnodes", s.nnodes}, {"dp", s.dp}};
  for (const auto& [node, k] : s.spares) j["spares"][std::to_string(node)] = k;
  if (s.shrinks()) j["shrink"] = {{"nodes", s.stay}, {"dp", s.dp}};
  if (!s.error.empty()) j["error"] = s.error;
  return j;
}

Settlement decode_settlement(const nlohmann::json& j) {
  Settlement s;
  try {
    for (const auto& [node, k] : j.at("spares").items()) s.spares[std::stoi(node)] = k.get<int64_t>();
    s.nnodes = j.at("nnodes").get<int>();
    s.dp = j.at("dp").get<int64_t>();
    if (j.contains("shrink")) s.stay = j["shrink"].at("nodes").get<std::vector<int>>();
    s.error = j.value("error", "");
  } catch (const std::exception& e) {
    throw_input("the job's plan ", j.dump().substr(0, 200), " is not a settlement (", e.what(), ")");
  }
  return s;
}

Settlement settle_places(const std::map<int, std::string>& leave, const Decision& filled,
                         const std::map<int, int64_t>& assigned, const Decision& without, int nnodes, int64_t dp,
                         const std::function<int64_t(int nodes)>& dp_on) {
  Settlement p;
  p.nnodes = nnodes, p.dp = dp;
  if (leave.empty()) return p;
  if (filled.action == Action::kReplace) p.spares = assigned;
  // The spares went meanwhile (none took a place): the places are filled as without spares.
  const Decision& how = filled.action == Action::kReplace && assigned.empty() ? without : filled;
  const auto& [node, why] = *leave.begin();
  if (how.action == Action::kReplace && p.spares.size() < leave.size()) {
    p.error = cat("node ", node, " left the job (", why, ") and no spare (myriad launch --spare) is there to take its "
                  "place; a spare left while it was being given a place");
  } else if (how.action == Action::kShrink) {
    for (int n = 0; n < nnodes; ++n)
      if (!leave.count(n)) p.stay.push_back(n);
    p.nnodes = static_cast<int>(p.stay.size());
    p.dp = dp_on(p.nnodes);
  } else if (how.action == Action::kStop) {
    p.error = cat("node ", node, " left the job (", why, ") and ", how.why);
  }
  return p;
}

}  // namespace myriad::driver
