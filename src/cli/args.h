// A small command-line reader: --flag value pairs, repeatable flags, did-you-mean on typos.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace myriad::cli {

class Args {
 public:
  // `allowed` lists the flags the subcommand takes (without "--"); `switches` those that take
  // no value. Throws an input error for an unknown flag or a missing value.
  Args(const std::string& command, int argc, char** argv, const std::vector<std::string>& allowed,
       const std::vector<std::string>& switches = {});
  bool has(const std::string& flag) const { return values_.count(flag) > 0; }
  std::string get(const std::string& flag, const std::string& fallback = "") const;
  std::string required(const std::string& flag) const;
  std::vector<std::string> all(const std::string& flag) const;
  long long get_int(const std::string& flag, long long fallback) const;
  double get_double(const std::string& flag, double fallback) const;

 private:
  std::string command_;
  std::map<std::string, std::vector<std::string>> values_;
};

}  // namespace myriad::cli
