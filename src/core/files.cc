#include "core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace fs = std::filesystem;

namespace myriad {

void require_writable_dir(const std::string& dir, const std::string& what, const std::string& advice) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw_input(what, " ", dir, ": cannot create it (", ec ? ec.message() : "a file of that name exists",
                "): ", advice);
  const fs::path probe = fs::path(dir) / cat(".write-test-", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_input(what, " ", dir, ": not writable (", std::strerror(errno), "): ", advice);
  ::close(fd);
  fs::remove(probe, ec);
}

}  // namespace myriad
