// One run per directory: an exclusive flock(2) on DIR/.myriad.lock, held while the object lives.
//
// The kernel releases the lock when the process ends, however it ends (SIGKILL included), so a
// run that was killed never blocks the next one, and there is no stale file to clean up: the
// lock file stays, holding the last holder's description, which a refused run quotes.
// The descriptor is close-on-exec: workers started by a launcher that holds the lock do not
// inherit it (they run under the launcher's hold).
//
// Shared file systems: on NFS, Linux emulates flock with the server's byte-range locks (NLM for
// v3, built into v4), so the lock holds across clients while the lock service works; on Lustre
// it holds across clients only when mounted with `-o flock` (`localflock` makes it node-local,
// and without either flock fails). Where the file system cannot lock at all, the run warns and
// goes on unprotected rather than refusing to train.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace myriad {

class DirLock {
 public:
  // Creates `dir` when missing (an input error with `advice` when it cannot be written) and
  // takes its lock; an input error naming the holder (host, pid, start time, program and
  // subcommand) when another process holds it. `what` names the directory in messages ("run
  // directory", "checkpoint directory").
  DirLock(const std::string& dir, const std::string& what, const std::string& advice);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  static constexpr const char* kFileName = ".myriad.lock";

 private:
  int fd_ = -1;
};

// The locks of one run: its run directory and its checkpoint directory (checkpoint.dir shared by
// two runs would mix them as surely as a shared run directory).
std::vector<std::unique_ptr<DirLock>> lock_run(const std::string& run_dir, const std::string& checkpoint_root);

}  // namespace myriad
