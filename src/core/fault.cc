#include "core/fault.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <algorithm>
#include <optional>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace myriad::fault {
namespace {

std::atomic<int> g_delay_ms{0};
std::atomic<double> g_delay_factor{1};  // slow:xK: every step takes K times its own time,
std::atomic<int> g_delay_floor_ms{0};   // and (slow:xK:MS) at least MS longer

// K and MS of "slow:xK[:MS]" (K above 1, at most 100; MS 0 when absent), or nullopt when the
// argument is not of that form.
std::optional<std::pair<double, int>> slower_by(const std::string& arg) {
  if (arg.size() < 2 || arg[0] != 'x') return std::nullopt;
  char* end = nullptr;
  const double k = std::strtod(arg.c_str() + 1, &end);
  if (end == arg.c_str() + 1 || !(k > 1 && k <= 100)) return std::nullopt;
  if (*end == '\0') return std::pair{k, 0};
  const std::string ms = end + 1;
  if (*end != ':' || ms.empty() || ms.size() > 7 || ms.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::pair{k, std::stoi(ms)};
}

// Armed live items ("POINT:ACTION"), each taken when it fires.
std::mutex g_live_mu;
std::vector<std::string> g_live;
std::atomic<bool> g_any_live{false};  // lets the points reached every micro-batch skip the lock

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

// The armed live item at `point`, taken ("" when none).
std::string take_live(const std::string& point) {
  if (!g_any_live.load(std::memory_order_relaxed)) return "";
  std::lock_guard<std::mutex> lock(g_live_mu);
  for (auto it = g_live.begin(); it != g_live.end(); ++it)
    if (it->size() > point.size() && it->rfind(point + ":", 0) == 0) {
      std::string a = it->substr(point.size() + 1);
      g_live.erase(it);
      g_any_live = !g_live.empty();
      return a;
    }
  return "";
}

std::string action(const std::string& point) {
  if (std::string live = take_live(point); !live.empty()) return live;
  const char* env = std::getenv("MYRIAD_INJECT_FAULT");
  if (!env) return "";
  std::stringstream ss(env);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.size() <= point.size() || item.rfind(point + ":", 0) != 0) continue;
    std::string a = item.substr(point.size() + 1);
    std::string rank, node, attempt = "0";
    for (size_t at; (at = a.rfind('@')) != std::string::npos;) {
      const std::string q = a.substr(at + 1);
      a = a.substr(0, at);
      const size_t eq = q.find('=');
      const std::string key = q.substr(0, eq), value = eq == std::string::npos ? "" : q.substr(eq + 1);
      if (key == "rank") rank = value;
      else if (key == "node") node = value;
      else if (key == "attempt") attempt = value;
      else throw_input("environment: MYRIAD_INJECT_FAULT item '", item, "': unknown qualifier @", key,
                       " (use @rank=R, @node=N, @attempt=A)");
    }
    if (!rank.empty() && rank != env_or("MYRIAD_RANK", "0")) continue;
    if (!node.empty() && node != env_or("MYRIAD_NODE_RANK", "0")) continue;
    if (attempt != env_or("MYRIAD_ATTEMPT", "0")) continue;
    return a;
  }
  return "";
}

std::string trigger(const std::string& point) { return carry_out(action(point), point); }

std::string carry_out(const std::string& a, const std::string& point) {
  if (a == "kill") raise(SIGKILL);
  if (a == "hang") raise(SIGSTOP);  // a hung process: alive, holding its sockets, silent
  if (a == "stall")  // a stuck kernel: this thread never returns, the process's others run on
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (a == "throw" || a == "fail")
    throw_runtime("injected fault at ", point, ": write failed (No space left on device)");
  if (a.rfind("slow:x", 0) == 0) {
    const auto k = slower_by(a.substr(5));
    if (!k)
      throw_input("environment: MYRIAD_INJECT_FAULT: '", point, ":", a, "' needs slow:xK[:MS], K a number above 1 (at "
                  "most 100), MS an integer");
    g_delay_factor = k->first, g_delay_floor_ms = k->second;
    return "";
  }
  for (const char* timed : {"slow:", "pause:"}) {
    if (a.rfind(timed, 0) != 0) continue;
    int ms = 0;
    try {
      ms = std::stoi(a.substr(std::strlen(timed)));
    } catch (...) {
      throw_input("environment: MYRIAD_INJECT_FAULT: '", point, ":", a, "' needs ", timed, "MS, MS an integer");
    }
    if (timed[0] == 's') g_delay_ms = ms;
    else std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return "";
  }
  return a;
}

int delay_ms(double step_ms) {
  const double k = g_delay_factor.load();
  const int slower = k > 1 ? std::max(g_delay_floor_ms.load(), static_cast<int>((k - 1) * std::max(0.0, step_ms))) : 0;
  return g_delay_ms.load() + slower;
}

// One item of MYRIAD_INJECT_FAULT's grammar (`source` names where it came from), or an input error.
void check_item(const std::string& item, const char* source) {
  auto refuse = [&](const std::string& why) {
    throw_input(source, " item '", item, "': ", why, " (docs/RELIABILITY.md, fault injection)");
  };
  std::string a = item.substr(0, item.find('@'));
  for (size_t at = item.find('@'); at != std::string::npos; at = item.find('@', at + 1)) {
    const std::string q = item.substr(at + 1, item.find('@', at + 1) - at - 1);
    const size_t eq = q.find('=');
    const std::string key = q.substr(0, eq);
    if (key != "rank" && key != "node" && key != "attempt") refuse("unknown qualifier @" + key + " (use @rank=R, @node=N, @attempt=A)");
    if (eq == std::string::npos || q.size() == eq + 1 || q.find_first_not_of("0123456789", eq + 1) != std::string::npos)
      refuse("@" + key + " needs a number");
  }
  // POINT: a per-step point with its step, or a named one.
  std::string point;
  for (const char* stepped : {"step:", "fwd:", "bwd:", "dp_gather:", "pp_recv:"})
    if (a.rfind(stepped, 0) == 0) {
      const size_t end = a.find(':', std::strlen(stepped));
      const std::string s = a.substr(std::strlen(stepped), end - std::strlen(stepped));
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) refuse(cat(stepped, "S needs a step number"));
      point = std::string(stepped, std::strlen(stepped) - 1);
      a = end == std::string::npos ? "" : a.substr(end + 1);
    }
  if (point.empty())
    for (const char* named : {"checkpoint_write", "shared_batch_created", "comm_check", "diag"})
      if (a.rfind(cat(named, ":"), 0) == 0) point = named, a = a.substr(point.size() + 1);
  if (point.empty()) refuse("unknown point (step:S, fwd:S, bwd:S, dp_gather:S, pp_recv:S, checkpoint_write, "
                            "shared_batch_created, comm_check, diag)");
  const std::string action = a.substr(0, a.find(':'));
  const bool step_only = action == "nan" || action == "spike" || action == "flip" || action == "slow";
  const bool timed = action == "slow" || action == "pause";
  const bool sleeps = action == "sleep" || action == "sleep_ignore_term";  // the communication check's
  if (!step_only && !timed && !sleeps && action != "kill" && action != "hang" && action != "stall" &&
      action != "throw" && action != "fail")
    refuse("unknown action '" + action + "' (kill, hang, stall, throw, fail, nan, spike, flip, slow:MS, pause:MS; "
           "at comm_check sleep, sleep_ignore_term)");
  if (step_only && point != "step") refuse(action + " acts on a training step: use it at step:S");
  if (sleeps && point != "comm_check") refuse(action + " is the communication check's: use it at comm_check");
  if (point == "comm_check" && !sleeps && action != "kill" && action != "fail" && action != "throw")
    refuse("the communication check takes kill, fail, throw, sleep or sleep_ignore_term");
  const std::string ms = a.find(':') == std::string::npos ? "" : a.substr(a.find(':') + 1);
  if (action == "slow" && ms.rfind("x", 0) == 0) {
    if (!slower_by(ms)) refuse("slow:xK[:MS] needs K, a number above 1 (at most 100), and MS an integer");
    return;
  }
  if (timed && (ms.empty() || ms.find_first_not_of("0123456789") != std::string::npos)) refuse(action + ":MS needs MS, a number");
  if (!timed && !ms.empty()) refuse(action + " takes no argument");
}

void check_injection() {
  const char* env = std::getenv("MYRIAD_INJECT_FAULT");
  if (!env) return;
  std::stringstream ss(env);
  for (std::string item; std::getline(ss, item, ',');) check_item(item, "environment: MYRIAD_INJECT_FAULT");
}

std::string poll_live(long long next_step) {
  const char* path = std::getenv("MYRIAD_INJECT_LIVE");
  if (!path || !*path) return "";
  std::ifstream in(path);
  if (!in) return "";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  std::replace(text.begin(), text.end(), '\n', ',');
  std::stringstream ss(text);
  std::string armed;
  for (std::string item; std::getline(ss, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t\r"));
    item.erase(item.find_last_not_of(" \t\r") + 1);
    if (item.empty()) continue;
    if (item.rfind("step:next:", 0) == 0) item = cat("step:", next_step, item.substr(9));
    try {
      if (item.find('@') != std::string::npos) throw_input("a live item takes no qualifier");
      check_item(item, "live injection");
    } catch (const Error& e) {
      log::warn("fault injection: ", path, ": item '", item, "' dropped: ", e.what());
      continue;
    }
    std::lock_guard<std::mutex> lock(g_live_mu);
    g_live.push_back(item);
    g_any_live = true;
    armed += (armed.empty() ? "" : ",") + item;
  }
  if (!armed.empty()) log::warn("fault injection: armed ", armed, " (", path, ")");
  return armed;
}

}  // namespace myriad::fault
