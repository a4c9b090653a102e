#include "core/fault.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace myriad::fault {
namespace {

std::atomic<int> g_delay_ms{0};

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

std::string action(const std::string& point) {
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

std::string trigger(const std::string& point) {
  const std::string a = action(point);
  if (a == "kill") raise(SIGKILL);
  if (a == "hang") raise(SIGSTOP);  // a hung process: alive, holding its sockets, silent
  if (a == "stall")  // a stuck kernel: this thread never returns, the process's others run on
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (a == "throw" || a == "fail")
    throw_runtime("injected fault at ", point, ": write failed (No space left on device)");
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

int delay_ms() { return g_delay_ms.load(); }

}  // namespace myriad::fault
