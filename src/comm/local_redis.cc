#include "comm/local_redis.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/store.h"
#include "core/error.h"

namespace myriad::comm {
namespace {

// A port that was free a moment ago (the kernel's choice for port 0).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_runtime("local redis: socket: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw_runtime("local redis: cannot find a free port: ", std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Whether a server on 127.0.0.1:port answers PING (with anything).
bool answers_ping(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  timeval tv{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const char ping[] = "PING\r\n";
    char buf[16] = {};
    if (::send(fd, ping, sizeof ping - 1, MSG_NOSIGNAL) == sizeof ping - 1 &&
        ::recv(fd, buf, sizeof buf - 1, 0) > 0)
      ok = buf[0] == '+' || buf[0] == '-';  // -NOAUTH when a password is required: it answers
  }
  ::close(fd);
  return ok;
}

}  // namespace

LocalRedis::LocalRedis(const std::vector<std::string>& extra, int port) {
  const char* env = std::getenv("MYRIAD_REDIS_SERVER");
  const std::string server = env && *env ? env : "redis-server";
  std::string last;
  for (int attempt = 0; attempt < 3; ++attempt) {  // the free port may be taken meanwhile
    port_ = port > 0 ? port : free_port();
    std::vector<std::string> args = {server,
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--protected-mode",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--loglevel",
                                     "warning"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw_runtime("local redis: fork: ", std::strerror(errno));
    if (pid == 0) {  // only async-signal-safe calls until exec
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      int devnull = ::open("/dev/null", O_RDWR);
      if (devnull >= 0) {
        ::dup2(devnull, 0), ::dup2(devnull, 1), ::dup2(devnull, 2);
      }
      ::execvp(argv[0], argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    const double deadline = steady_now_s() + 10;
    while (steady_now_s() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        last =
            WIFEXITED(status) && WEXITSTATUS(status) == 127
                ? cat("cannot run ", server, " (install redis-server or set MYRIAD_REDIS_SERVER)")
                : cat(server, " exited at start (status ", status, ")");
        break;
      }
      if (answers_ping(port_)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (pid_ > 0) {
      kill();
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
      last = cat(server, " did not answer on port ", port_, " within 10 s");
    }
    if (last.rfind("cannot run", 0) == 0) break;
  }
  throw_runtime("local redis: ", last);
}

LocalRedis::~LocalRedis() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 200; ++i) {  // up to 2 s, then SIGKILL
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

std::string LocalRedis::url(const std::string& job) const {
  return cat("redis://127.0.0.1:", port_, "/", job);
}

void LocalRedis::kill() {
  if (pid_ > 0) ::kill(pid_, SIGKILL);
}

}  // namespace myriad::comm
