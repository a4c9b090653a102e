#include "core/fault.h"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <sstream>

#include "core/error.h"

namespace myriad::fault {

std::string action(const std::string& point) {
  const char* env = std::getenv("MYRIAD_INJECT_FAULT");
  if (!env) return "";
  std::stringstream ss(env);
  for (std::string item; std::getline(ss, item, ',');)
    if (item.size() > point.size() && item.rfind(point + ":", 0) == 0) return item.substr(point.size() + 1);
  return "";
}

void trigger(const std::string& point) {
  std::string a = action(point);
  // "rank=R:ACTION" acts on the process whose MYRIAD_RANK is R only.
  if (a.rfind("rank=", 0) == 0) {
    const size_t colon = a.find(':');
    const char* rank = std::getenv("MYRIAD_RANK");
    if (colon == std::string::npos || a.substr(5, colon - 5) != (rank ? rank : "0")) return;
    a = a.substr(colon + 1);
  }
  // A fault fires in one attempt of a launch: the first (MYRIAD_ATTEMPT 0), or the one named
  // by "ACTION@attempt=A", so that the restart it causes runs clean.
  std::string attempt = "0";
  if (const size_t at = a.find("@attempt="); at != std::string::npos)
    attempt = a.substr(at + 9), a = a.substr(0, at);
  const char* now = std::getenv("MYRIAD_ATTEMPT");
  if (attempt != (now && *now ? now : "0")) return;
  if (a == "kill") raise(SIGKILL);
  if (a == "stop") raise(SIGSTOP);  // a hung process: alive, holding its sockets, silent
  if (a == "stall")  // a stuck kernel: this thread never returns, the process's others run on
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (a == "fail") throw_runtime("injected fault at ", point, ": write failed (No space left on device)");
}

}  // namespace myriad::fault
