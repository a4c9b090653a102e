// Helpers shared by the test binaries.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace myriad::test {

// The message of the input error that `fn` throws; fails the test when it throws anything else
// or a message of more than one line.
template <class F>
std::string input_error(F fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.cls(), ErrorClass::kInput) << e.what();
    std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "error must be one line: " << what;
    return what;
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// A file's bytes ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The objects of a JSON-lines file (metrics.jsonl, events.jsonl).
inline std::vector<nlohmann::json> jsonl(const std::filesystem::path& p) {
  std::vector<nlohmann::json> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// A command run through the shell to its end: its exit code, its output (what the command
// sends to stdout; add 2>&1 for stderr too) and its wall time.
struct Result {
  int code = -1;  // the exit code, or 128 + the signal
  std::string output;
  double seconds = 0;
};
inline Result run_shell(const std::string& command) {
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(command.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The launcher's variables of an enclosing run unset, and one OpenMP thread.
inline constexpr const char* kCleanEnv =
    "env -u MYRIAD_RDZV -u MYRIAD_JOB -u MYRIAD_NNODES -u MYRIAD_NODE_RANK -u SLURM_JOB_ID -u MYRIAD_INJECT_FAULT "
    "OMP_NUM_THREADS=1";

// `myriad ARGS`, run to its end with ENV ("NAME=value ...") in the clean environment; its stdout
// and stderr together.
inline Result run_myriad(const std::string& args, const std::string& env = "") {
  return run_shell(cat(kCleanEnv, " ", env, " ", MYRIAD_BINARY_DIR, "/myriad ", args, " 2>&1"));
}

// The last line of a command's output.
inline std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
}

// Exit code 2, and a last line "myriad: input error: ..." holding `needle`: the one-line
// refusal every bad input gets.
inline void expect_input_error(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.code, 2) << r.output;
  const std::string line = last_line(r.output);
  EXPECT_EQ(line.rfind("myriad: input error: ", 0), 0u) << r.output;
  EXPECT_NE(line.find(needle), std::string::npos) << "expected '" << needle << "' in: " << line;
}

// A test suite's fresh scratch directory (NAME_<pid> under the temp directory, into `dir`)
// holding a byte-level corpus of fortunes made by `myriad prepare`; returns the corpus prefix.
inline std::string make_corpus_dir(const std::string& name, std::filesystem::path& dir) {
  dir = std::filesystem::temp_directory_path() / cat(name, "_", getpid());
  std::filesystem::create_directories(dir);
  const std::string prefix = (dir / "corpus").string();
  const Result r = run_myriad(cat("prepare --input /usr/share/games/fortunes/computers --tokenizer byte --output ",
                                  prefix, " --doc-separator %"));
  EXPECT_EQ(r.code, 0) << r.output << "\n(the fortunes package comes with scripts/setup.sh)";
  return prefix;
}

// A process running `myriad ARGS` with its output in a file: started, waited for, killed.
class Proc {
 public:
  Proc(const std::string& args, const std::string& env, const std::filesystem::path& out) : out_(out) {
    const std::string cmd = cat("exec env -u MYRIAD_RDZV -u MYRIAD_JOB -u MYRIAD_INJECT_FAULT OMP_NUM_THREADS=1 ", env,
                                " ", MYRIAD_BINARY_DIR, "/myriad ", args, " > ", out.string(), " 2>&1");
    pid_ = fork();
    if (pid_ == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Proc() {
    if (pid_ > 0 && code_ < 0) ::kill(pid_, SIGKILL), wait(10);
  }
  // The exit code (128 + signal when killed); -1 when it did not end within `seconds`.
  int wait(double seconds = 240) {
    for (auto t0 = std::chrono::steady_clock::now(); code_ < 0;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() - t0 > std::chrono::duration<double>(seconds)) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return code_;
  }
  void kill(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }  // myriad's own (the shell execs it)
  std::string output() const {
    std::ifstream in(out_);
    std::stringstream s;
    s << in.rdbuf();
    // The warnings first (a launcher's): a failure's report may be cut after its first lines.
    std::string warnings, line;
    for (std::istringstream lines(s.str()); std::getline(lines, line);)
      if (line.rfind("[rank", 0) != 0 && (line.find(" W ") != std::string::npos || line.rfind("myriad:", 0) == 0))
        warnings += line + "\n";
    return cat("its warnings:\n", warnings, "its whole output:\n", s.str());
  }

 private:
  std::filesystem::path out_;
  pid_t pid_ = -1;
  int code_ = -1;
};

}  // namespace myriad::test
