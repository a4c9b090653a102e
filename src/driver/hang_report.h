// Who holds a hung job up, from what every rank says of its groups' operations: the heartbeats'
// summaries (each group's last issued operation; runtime/heartbeat.h), or the flight records a
// rank writes when asked (each group's last 256 operations and its members).
//
// The rule: a rank whose last operation in group G is number m (the group's shared numbering:
// the n-th collective, or the n-th message of a pipeline link) and still pending waits on every
// member of G that has issued fewer than m operations there, or that left no record at all (a
// stopped process writes none). The ranks waited on that themselves wait on nobody hold the job
// up: stopped, or still computing (a stuck training thread, a stuck kernel). A cycle (operations
// issued in different orders) has no such rank. Members that issued the same operation number
// with different kinds or sizes are a mismatch, a bug in the program rather than a fault.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace myriad::driver {

struct HangReport {
  std::vector<int> culprits;            // the ranks that hold the job up (usually one)
  std::vector<std::string> findings;    // one line per culprit: who waits for it, and where it is
  std::vector<std::string> mismatches;  // "group dp0, operation #7: rank 0 all_reduce of 4096 bytes, ..."
  std::string text() const;             // the report, as printed and written to hang_report.txt
  nlohmann::json json() const;          // {"culprits": [...], "findings": [...], "mismatches": [...]}
};

// `ranks`: one object per rank: "rank", optionally "step" and "phase", and "groups": each
// {"group", "op", "match", "state"} (a heartbeat's last operation) or {"group", "members",
// "records": [{"seq", "match", "op", "bytes", "state", ...}]} (a flight record).
// `last_beats`: each rank's last heartbeat (runtime/heartbeat.h) by rank, "0", "1", ..., with
// "age_s" its age: where a culprit left no record (a stopped process writes none), its last
// step, phase and finished operation as of its last beat. Only described, never part of the
// wait-for graph: a beat can be a second old.
HangReport analyze_hang(const nlohmann::json& ranks, const nlohmann::json& last_beats = nlohmann::json::object());

struct Holdup {
  int rank = -1;
  std::string detail;  // "rank 1 (its last step 5, phase data) holds the job up: rank 0 in tp0's all_reduce #61 waits for it"
};
// The one rank that holds the job up, when there is exactly one.
std::optional<Holdup> find_holdup(const nlohmann::json& ranks);

// Reads RUN_DIR/driver/flight_rank_*.json (what the ranks wrote when the launcher asked) and
// the ranks' last heartbeats (RUN_DIR/driver/heartbeat_rank_*), writes
// RUN_DIR/hang_report.txt and RUN_DIR/hang_report.json, and returns the report. A run directory
// without flight records is an input error naming it.
HangReport write_hang_report(const std::string& run_dir);
// The same from records and beats gathered elsewhere (a job's nodes, through its store).
HangReport write_hang_report(const std::string& run_dir, const nlohmann::json& ranks, const nlohmann::json& last_beats);

}  // namespace myriad::driver
