#include "runtime/heartbeat.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/worker_report.h"

namespace myriad {
namespace {

std::atomic<const char*> g_phase{"start"};
volatile sig_atomic_t g_dump_requested = 0;  // SIGUSR1: the launcher asks for the flight record
void request_dump(int) { g_dump_requested = 1; }

nlohmann::json record_json(const comm::OpRecord& r) {
  nlohmann::json j = {{"seq", r.seq}, {"match", r.match}, {"op", comm::op_name(r.op)}, {"bytes", r.bytes},
                      {"state", comm::state_name(r.state)}, {"queued_us", r.queued_us}};
  if (r.peer >= 0) j["peer"] = r.peer;
  if (r.step >= 0) j["step"] = r.step;
  if (r.started_us) j["started_us"] = r.started_us;
  if (r.ended_us) j["ended_us"] = r.ended_us;
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}


}  // namespace

void set_phase(const char* phase) { g_phase.store(phase, std::memory_order_relaxed); }

Heartbeat::Heartbeat(double startup_s) {
  allowance_s_ = startup_s;
  set_phase("start");
  const char* p = std::getenv("MYRIAD_HEARTBEAT");
  if (!p || !*p) return;
  path_ = p;
  // heartbeat_rank_<R> -> flight_rank_<R>.json
  const size_t slash = path_.rfind('/') + 1, at = path_.find("heartbeat_", slash);
  flight_path_ = at == std::string::npos ? path_ + ".flight.json"
                                         : path_.substr(0, at) + "flight_" + path_.substr(at + 10) + ".json";
  signal(SIGUSR1, request_dump);
  beat();
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      for (int i = 0; i < 10 && !stop_.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (g_dump_requested) g_dump_requested = 0, dump_flight_record();
      }
      beat();
    }
  });
}

Heartbeat::~Heartbeat() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::set(int64_t step, double allowance_s) {
  step_ = step, allowance_s_ = allowance_s, allowance_from_s_ = comm::wall_us() * 1e-6;
}

void Heartbeat::watch(std::vector<comm::Communicator*> groups) {
  std::lock_guard<std::mutex> lock(groups_mu_);
  groups_ = std::move(groups);
}

void Heartbeat::set_batch(const std::string& group, const std::vector<int>& members, int64_t step, const char* op,
                          bool done) {
  std::lock_guard<std::mutex> lock(groups_mu_);
  if (batch_.group != group) batch_.group = group, batch_.members = members;
  batch_.step = step, batch_.op = op, batch_.done = done;
}

void Heartbeat::dump_flight_record() {
  if (flight_path_.empty()) return;
  nlohmann::json j = {{"step", step_.load()}, {"phase", g_phase.load(std::memory_order_relaxed)},
                      {"time_us", comm::wall_us()}};
  if (const char* r = std::getenv("MYRIAD_RANK")) j["rank"] = std::atoi(r);
  nlohmann::json groups = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    for (comm::Communicator* g : groups_) {
      nlohmann::json records = nlohmann::json::array();
      for (const comm::OpRecord& r : g->records()) records.push_back(record_json(r));
      groups.push_back({{"group", g->name()}, {"members", g->members()}, {"records", std::move(records)}});
    }
    if (!batch_.group.empty())
      groups.push_back({{"group", batch_.group}, {"members", batch_.members},
                        {"records", {{{"seq", batch_.step}, {"match", batch_.step}, {"op", batch_.op}, {"bytes", 0},
                                      {"state", batch_.done ? "done" : "running"}}}}});
  }
  j["groups"] = std::move(groups);
  write_record(flight_path_, j);  // whole, renamed into place
}

void Heartbeat::step_done(int64_t step) {
  if (steps_run_++ > 0) return;
  first_step_unix_s_ = comm::wall_us() * 1e-6;
  first_step_ = step;
}

void Heartbeat::set_resumed_from(const std::string& checkpoint) {
  std::lock_guard<std::mutex> lock(groups_mu_);
  resumed_from_ = checkpoint;
}

namespace {
OpRef op_ref(const std::string& group, const comm::OpRecord& r) {
  return {group, comm::op_name(r.op), r.seq, r.match, r.step, r.peer};
}
}  // namespace

// A failed write only skips a beat: the launcher waits several before it calls a worker frozen.
void Heartbeat::beat() {
  if (path_.empty()) return;
  HeartbeatRecord h;
  h.beat = ++beats_, h.step = step_.load(), h.phase = g_phase.load(std::memory_order_relaxed);
  h.allowance_s = allowance_s_.load(), h.allowance_from_s = allowance_from_s_.load(), h.own_ms = own_ms_.load();
  h.step_ms = step_ms_.load(), h.tokens_per_s = tokens_per_s_.load();
  h.steps_run = steps_run_.load(), h.first_step = first_step_.load(), h.first_step_unix_s = first_step_unix_s_.load();
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    h.resumed_from = resumed_from_;
    int64_t started_us = 0, ended_us = 0;
    for (comm::Communicator* g : groups_) {
      const std::vector<comm::OpRecord> recs = g->records();
      if (recs.empty()) continue;
      const comm::OpRecord& last = recs.back();
      h.groups.push_back({g->name(), comm::op_name(last.op), comm::state_name(last.state), last.match});
      for (const comm::OpRecord& r : recs) {
        if (r.started_us > started_us) started_us = r.started_us, h.started = op_ref(g->name(), r);
        if (r.state == comm::OpState::kDone && r.ended_us > ended_us) ended_us = r.ended_us, h.finished = op_ref(g->name(), r);
      }
    }
    if (!batch_.group.empty())
      h.groups.push_back({batch_.group, batch_.op, batch_.done ? "done" : "running", static_cast<uint64_t>(batch_.step)});
  }
  write_record(path_, encode(h));
}

}  // namespace myriad
