#include "core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace myriad {
namespace {

std::string now_text() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&t));
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("?");
}

// This process's program and subcommand ("myriad train"), for the holder's description: not its
// whole command line, which may carry a store's password (--rdzv redis://:secret@...).
std::string command_name() {
  const std::string text = read_file("/proc/self/cmdline");
  std::vector<std::string> words;
  for (size_t at = 0; at < text.size() && words.size() < 2;) {
    const size_t end = std::min(text.find('\0', at), text.size());
    words.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (words.empty()) return "?";
  return fs::path(words[0]).filename().string() + (words.size() > 1 ? " " + words[1] : "");
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& what, const std::string& advice) {
  require_writable_dir(dir, what, advice);  // the messages of an unusable directory, as before the lock
  const std::string path = (fs::path(dir) / kFileName).string();
  // O_RDWR without O_TRUNC: the holder's description must survive a refused opener.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw_input(what, " ", dir, ": cannot create its lock file ", path, " (", std::strerror(errno), "): ", advice);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      ::close(fd_);
      fd_ = -1;
      std::string holder = read_file(path);
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      throw_input(what, " ", dir, " is in use by another run (", holder.empty() ? "it has not said who yet" : holder,
                  "): wait for it to end, stop it, or choose another directory");
    }
    // NFS without its lock service, Lustre without -o flock: unprotected, but not refused.
    log::warn(what, " ", dir, ": cannot lock ", path, " (", std::strerror(err),
              "): this file system does not lock; nothing keeps a second run out of this directory");
    return;
  }
  const std::string me = cat("host ", host_name(), ", pid ", ::getpid(), ", started ", now_text(), ", ", command_name(), "\n");
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t n = ::pwrite(fd_, me.data(), me.size(), 0);
    (void)n;  // the description is a courtesy: the lock is what excludes
  }
}

std::vector<std::unique_ptr<DirLock>> lock_run(const std::string& run_dir, const std::string& checkpoint_root) {
  std::vector<std::unique_ptr<DirLock>> out;
  out.push_back(std::make_unique<DirLock>(run_dir, "run directory", "choose a writable --run-dir"));
  std::error_code ec;
  const fs::path run = fs::weakly_canonical(fs::absolute(run_dir), ec);
  const fs::path ckpt = fs::weakly_canonical(fs::absolute(checkpoint_root), ec);
  // Locked even inside the run directory: another run may name it as its checkpoint.dir.
  if (ckpt != run)
    out.push_back(std::make_unique<DirLock>(checkpoint_root, "checkpoint directory",
                                            "set checkpoint.dir (or --run-dir) to a writable directory"));
  return out;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace myriad
