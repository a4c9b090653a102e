#include "core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace myriad
