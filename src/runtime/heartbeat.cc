#include "runtime/heartbeat.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"

namespace myriad {
namespace {

std::atomic<const char*> g_phase{"start"};

nlohmann::json describe(const std::string& group, const comm::OpRecord& r) {
  nlohmann::json j = {{"group", group}, {"op", comm::op_name(r.op)}, {"seq", r.seq}, {"match", r.match}};
  if (r.step >= 0) j["step"] = r.step;
  if (r.peer >= 0) j["peer"] = r.peer;
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
  beat();
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      for (int i = 0; i < 10 && !stop_.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      beat();
    }
  });
}

Heartbeat::~Heartbeat() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::set(int64_t step, double allowance_s) { step_ = step, allowance_s_ = allowance_s; }

void Heartbeat::watch(std::vector<comm::Communicator*> groups) {
  std::lock_guard<std::mutex> lock(groups_mu_);
  groups_ = std::move(groups);
}

// Written to a temporary name and renamed, so the launcher never reads half a file. A failed
// write only skips a beat: the launcher waits several before it calls a worker frozen.
void Heartbeat::beat() {
  if (path_.empty()) return;
  nlohmann::json j = {{"beat", ++beats_}, {"step", step_.load()}, {"phase", g_phase.load(std::memory_order_relaxed)},
                      {"allowance_s", allowance_s_.load()}, {"own_ms", own_ms_.load()},
                      {"step_ms", step_ms_.load()}, {"tokens_per_s", tokens_per_s_.load()}};
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    nlohmann::json groups = nlohmann::json::array();
    int64_t started_us = 0, ended_us = 0;
    for (comm::Communicator* g : groups_) {
      const std::vector<comm::OpRecord> recs = g->records();
      if (recs.empty()) continue;
      const comm::OpRecord& last = recs.back();
      groups.push_back({{"group", g->name()}, {"op", comm::op_name(last.op)}, {"match", last.match},
                        {"state", comm::state_name(last.state)}});
      for (const comm::OpRecord& r : recs) {
        if (r.started_us > started_us) started_us = r.started_us, j["started"] = describe(g->name(), r);
        if (r.state == comm::OpState::kDone && r.ended_us > ended_us)
          ended_us = r.ended_us, j["finished"] = describe(g->name(), r);
      }
    }
    j["groups"] = std::move(groups);
  }
  const std::string tmp = path_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;
  const std::string text = j.dump() + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) == 0 && ok) std::rename(tmp.c_str(), path_.c_str());
}

}  // namespace myriad
