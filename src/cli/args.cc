#include "cli/args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/text.h"

namespace myriad::cli {

Args::Args(const std::string& command, int argc, char** argv,
           const std::vector<std::string>& allowed, const std::vector<std::string>& switches)
    : command_(command) {
  std::vector<std::string> known = allowed;
  known.insert(known.end(), switches.begin(), switches.end());
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0)
      throw_input("myriad ", command, ": unexpected argument '", a, "' (flags start with --)");
    std::string flag = a.substr(2), value;
    if (size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1), flag = flag.substr(0, eq);
    } else if (std::find(switches.begin(), switches.end(), flag) != switches.end()) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw_input("myriad ", command, ": --", flag, " needs a value");
    }
    if (std::find(known.begin(), known.end(), flag) == known.end())
      throw_input("myriad ", command, ": unknown flag --", flag, did_you_mean(flag, known),
                  "; see myriad help");
    values_[flag].push_back(value);
  }
}

std::string Args::get(const std::string& flag, const std::string& fallback) const {
  auto it = values_.find(flag);
  return it == values_.end() ? fallback : it->second.back();
}

std::string Args::required(const std::string& flag) const {
  if (!has(flag)) throw_input("myriad ", command_, ": --", flag, " is required; see myriad help");
  return get(flag);
}

std::vector<std::string> Args::all(const std::string& flag) const {
  auto it = values_.find(flag);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

long long Args::get_int(const std::string& flag, long long fallback) const {
  if (!has(flag)) return fallback;
  std::string v = get(flag);
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (...) {
  }
  throw_input("myriad ", command_, ": --", flag, " must be an integer, got '", v, "'");
}

double Args::get_double(const std::string& flag, double fallback) const {
  if (!has(flag)) return fallback;
  std::string v = get(flag);
  // strtod, not stod: stod refuses a number too small for a normal double (1e-320) as out of
  // range, though strtod returns it (denormal, or 0) and it is as good a value as any.
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || end != v.c_str() + v.size())
    throw_input("myriad ", command_, ": --", flag, " must be a number, got '", v, "'");
  if (errno == ERANGE && std::isinf(x))
    throw_input("myriad ", command_, ": --", flag, " is out of range, got '", v,
                "': a number's magnitude must be below 1.8e308");
  return x;
}

}  // namespace myriad::cli
