#include "core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
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

void write_file_durably(const std::string& path, const std::vector<std::string_view>& pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_runtime("cannot write ", path, ": ", std::strerror(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    throw_runtime("cannot ", what, " ", path, ": ", std::strerror(err));
  };
  for (std::string_view p : pieces)
    while (!p.empty()) {
      const ssize_t n = ::write(fd, p.data(), std::min<size_t>(p.size(), size_t(1) << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("write");
      p.remove_prefix(static_cast<size_t>(n));
    }
  if (::fsync(fd) != 0) fail("write");
  if (::close(fd) != 0) throw_runtime("cannot write ", path, ": ", std::strerror(errno));
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw_runtime("cannot sync ", dir, ": ", std::strerror(err));
  }
  ::close(fd);
}

int rename_noreplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  std::error_code ec;  // a file system without the flag
  if (fs::exists(fs::symlink_status(to, ec))) return EEXIST;
  return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}

int rename_exchange(const std::string& a, const std::string& b) {
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0 ? 0 : errno;
}

}  // namespace myriad
