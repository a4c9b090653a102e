#include "driver/job_board.h"

#include "core/error.h"

namespace myriad::driver {

JobBoard::JobBoard(const std::string& url, double timeout_s)
    : store_(comm::make_store(url, "driver", timeout_s)) {}

std::optional<nlohmann::json> JobBoard::json_at(const std::string& key) {
  const std::optional<std::string> v = store_->try_get(key);
  if (!v) return std::nullopt;
  return nlohmann::json::parse(*v, nullptr, /*allow_exceptions=*/false);
}

void JobBoard::beat(const std::string& name, const nlohmann::json& state, double ttl_s) {
  store_->set("agent/" + name, state.dump(), ttl_s);
}

std::optional<nlohmann::json> JobBoard::heartbeat(const std::string& name) { return json_at("agent/" + name); }

nlohmann::json JobBoard::stop(int64_t attempt, const nlohmann::json& cause) {
  const std::optional<std::string> held = store_->compare_set(cat("stop/", attempt), std::nullopt, cause.dump());
  return held ? nlohmann::json::parse(*held) : cause;
}

std::optional<nlohmann::json> JobBoard::stopped(int64_t attempt) { return json_at(cat("stop/", attempt)); }

void JobBoard::diagnosed(int64_t attempt, int node, const nlohmann::json& result) {
  store_->set(cat("diag/", attempt, "/", node), result.dump());
}

std::optional<nlohmann::json> JobBoard::diagnosis(int64_t attempt, int node) {
  return json_at(cat("diag/", attempt, "/", node));
}

nlohmann::json JobBoard::decide(int64_t attempt, const nlohmann::json& outcome) {
  const std::optional<std::string> held = store_->compare_set(cat("outcome/", attempt), std::nullopt, outcome.dump());
  return held ? nlohmann::json::parse(*held) : outcome;
}

std::optional<nlohmann::json> JobBoard::outcome(int64_t attempt) { return json_at(cat("outcome/", attempt)); }

int64_t JobBoard::join_as_spare() { return store_->add("spares", 1) - 1; }

std::optional<int64_t> JobBoard::assign_spare(int node, int64_t attempt) {
  const int64_t n = store_->add("spares", 0);
  const std::string want = cat(node, " ", attempt);
  for (int64_t k = 0; k < n; ++k) {
    if (!heartbeat(cat("spare", k))) continue;  // gone
    if (store_->compare_set(cat("spare/", k, "/node"), std::nullopt, want) == want) return k;
  }
  return std::nullopt;
}

std::optional<std::pair<int, int64_t>> JobBoard::assignment(int64_t k) {
  const std::optional<std::string> v = store_->try_get(cat("spare/", k, "/node"));
  if (!v) return std::nullopt;
  const size_t space = v->find(' ');
  return std::make_pair(std::stoi(v->substr(0, space)), std::stoll(v->substr(space + 1)));
}

void JobBoard::block(const std::string& host, const std::string& why) { store_->set("evicted/" + host, why); }

std::optional<std::string> JobBoard::blocked(const std::string& host) { return store_->try_get("evicted/" + host); }

}  // namespace myriad::driver
