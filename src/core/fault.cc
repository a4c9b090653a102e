#include "core/fault.h"

#include <signal.h>

#include <cstdlib>
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
  const std::string a = action(point);
  if (a == "kill") raise(SIGKILL);
  if (a == "fail") throw_runtime("injected fault at ", point, ": write failed (No space left on device)");
}

}  // namespace myriad::fault
