// FileStore: a shared directory, one file per key.
//
//   DIR/myriad/<job>/<attempt>/<escaped key>   "M1 <expiry, ms since the epoch; 0 = never>\n" value
//   DIR/myriad/<job>/<attempt>/.lock           flock'ed around every change
//   DIR/myriad/<job>/<attempt>/.tmp.*          a value being written (renamed into place)
//
// Readers never lock: a rename replaces a file atomically, so a reader sees the old or the new
// value, never a partial one. Writers lock so that add and compare_set (read, modify, rename)
// are atomic with respect to every other change.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "comm/store_backends.h"
#include "core/error.h"

namespace myriad::comm {
namespace {

namespace fs = std::filesystem;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Keys may hold any byte; file names keep [A-Za-z0-9_-] and '.' (not first), the rest as %XX.
// Long names end in a hash so that they stay under NAME_MAX.
std::string escape_key(const std::string& key) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (size_t i = 0; i < key.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (std::isalnum(c) || c == '_' || c == '-' || (c == '.' && i > 0)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (out.size() > 200) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the key
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    char tail[20];
    std::snprintf(tail, sizeof tail, "~%016llx", static_cast<unsigned long long>(h));
    out = out.substr(0, 150) + tail;
  }
  return out;
}

class FileStore final : public Store {
 public:
  FileStore(const std::string& dir, const std::string& job, const std::string& attempt,
            double timeout_s)
      : Store(cat("file://", dir == "/" ? "" : dir, "/", job), job, attempt, timeout_s),
        dir_(cat(dir, "/myriad/", job, "/", attempt)) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) io_error("cannot create directory ", dir_, ": ", ec.message());
    std::string lock = dir_ + "/.lock";
    lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) io_error("cannot open ", lock, ": ", std::strerror(errno));
  }
  ~FileStore() override {
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  bool poll(std::vector<StoreResult>* out) override {
    if (!active_) throw Error(ErrorClass::kInternal, "FileStore::poll without start");
    for (; cursor_ < ops_.size(); ++cursor_) {
      const StoreOp& op = ops_[cursor_];
      if (op.kind == StoreOp::Kind::kWait) {
        if (!exists(op.key)) {
          if (steady_now_s() >= deadline_) throw_timeout(op.key, steady_now_s() - started_);
          return false;
        }
        results_[cursor_].found = true;
      } else {
        results_[cursor_] = apply(op);
      }
    }
    active_ = false;
    *out = std::move(results_);
    return true;
  }

 protected:
  std::vector<StoreResult> run_batch(const std::vector<StoreOp>& ops, double deadline_s) override {
    std::vector<StoreResult> results(ops.size());
    const double start = steady_now_s();
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != StoreOp::Kind::kWait) {
        results[i] = apply(ops[i]);
        continue;
      }
      // Poll with a growing interval: 0.5 ms at first (set-up latency), 20 ms at most.
      double sleep_s = 0.0005;
      while (!exists(ops[i].key)) {
        double now = steady_now_s();
        if (now >= deadline_s) throw_timeout(ops[i].key, now - start);
        std::this_thread::sleep_for(
            std::chrono::duration<double>(std::min(sleep_s, deadline_s - now)));
        sleep_s = std::min(sleep_s * 2, 0.02);
      }
      results[i].found = true;
    }
    return results;
  }

  void start_batch(const std::vector<StoreOp>& ops, double deadline_s) override {
    ops_ = ops;
    results_.assign(ops.size(), StoreResult{});
    cursor_ = 0;
    deadline_ = deadline_s;
    started_ = steady_now_s();
    active_ = true;
  }

 private:
  template <class... Args>
  [[noreturn]] void io_error(const Args&... args) const {
    throw Error(ErrorClass::kComm, cat("store ", url(), ": ", args...));
  }

  std::string path_of(const std::string& key) const { return dir_ + "/" + escape_key(key); }

  // The live value of the file at `path`, if any.
  std::optional<std::string> read_entry(const std::string& path, const std::string& key) const {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::nullopt;
      io_error("cannot open ", path, ": ", std::strerror(errno));
    }
    std::string data;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int e = errno;
        ::close(fd);
        io_error("cannot read ", path, ": ", std::strerror(e));
      }
      if (n == 0) break;
      data.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    size_t nl = data.find('\n');
    long long expiry = 0;
    if (data.rfind("M1 ", 0) != 0 || nl == std::string::npos ||
        std::sscanf(data.c_str() + 3, "%lld", &expiry) != 1)
      io_error("corrupt entry ", path, " for key '", full_key(key), "'");
    if (expiry > 0 && wall_ms() >= expiry) return std::nullopt;
    return data.substr(nl + 1);
  }

  bool exists(const std::string& key) const { return read_entry(path_of(key), key).has_value(); }

  // Writes a temporary file holding `value`; the caller renames it into place.
  std::string write_temp(const std::string& value, double ttl_s) {
    // Unique across the processes of all nodes that share the directory.
    static const uint64_t token = std::random_device{}() * 4294967296ull + std::random_device{}();
    static std::atomic<uint64_t> counter{0};
    std::string tmp = cat(dir_, "/.tmp.", std::hex, token, ".", std::dec, counter.fetch_add(1));
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) io_error("cannot create ", tmp, ": ", std::strerror(errno));
    const int64_t expiry = ttl_s > 0 ? wall_ms() + static_cast<int64_t>(ttl_s * 1000 + 0.5) : 0;
    std::string data = cat("M1 ", expiry, "\n");
    data += value;
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int e = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        io_error("cannot write ", tmp, ": ", std::strerror(e));
      }
      off += static_cast<size_t>(n);
    }
    if (::close(fd) != 0) io_error("cannot write ", tmp, ": ", std::strerror(errno));
    return tmp;
  }

  void commit(const std::string& tmp, const std::string& path) {
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      int e = errno;
      ::unlink(tmp.c_str());
      io_error("cannot rename ", tmp, " to ", path, ": ", std::strerror(e));
    }
  }

  class Lock {
   public:
    explicit Lock(const FileStore& s) : fd_(s.lock_fd_) {
      while (::flock(fd_, LOCK_EX) != 0) {
        if (errno != EINTR) s.io_error("cannot lock ", s.dir_, "/.lock: ", std::strerror(errno));
      }
    }
    ~Lock() { ::flock(fd_, LOCK_UN); }

   private:
    int fd_;
  };

  StoreResult apply(const StoreOp& op) {
    StoreResult r;
    const std::string path = path_of(op.key);
    switch (op.kind) {
      case StoreOp::Kind::kSet: {
        std::string tmp = write_temp(op.value, op.ttl_s);
        Lock lock(*this);
        commit(tmp, path);
        r.found = true;
        break;
      }
      case StoreOp::Kind::kGet: {
        std::optional<std::string> v = read_entry(path, op.key);
        if (v) r.found = true, r.value = std::move(*v);
        break;
      }
      case StoreOp::Kind::kAdd: {
        Lock lock(*this);
        std::optional<std::string> v = read_entry(path, op.key);
        int64_t cur = 0;
        if (v) {
          size_t used = 0;
          bool ok = false;
          try {
            cur = std::stoll(*v, &used);
            ok = used == v->size();
          } catch (...) {
          }
          if (!ok)
            throw Error(ErrorClass::kInternal,
                        cat("store ", url(), ": add on key '", full_key(op.key),
                            "', which holds a non-integer value"));
        }
        r.number = cur + op.delta;
        r.found = true;
        commit(write_temp(std::to_string(r.number), 0), path);
        break;
      }
      case StoreOp::Kind::kCompareSet: {
        Lock lock(*this);
        std::optional<std::string> v = read_entry(path, op.key);
        if (v == op.expected) {
          commit(write_temp(op.value, 0), path);
          v = op.value;
        }
        if (v) r.found = true, r.value = std::move(*v);
        break;
      }
      case StoreOp::Kind::kDel: {
        Lock lock(*this);
        r.found = read_entry(path, op.key).has_value();
        if (::unlink(path.c_str()) != 0 && errno != ENOENT)
          io_error("cannot delete ", path, ": ", std::strerror(errno));
        break;
      }
      case StoreOp::Kind::kDropAttemptsBelow: {
        const fs::path job_dir = fs::path(dir_).parent_path();
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(job_dir, ec)) {
          const std::string a = e.path().filename().string();
          if (a.empty() || a.size() > 18 || !std::all_of(a.begin(), a.end(), ::isdigit)) continue;
          if (std::stoll(a) >= op.delta) continue;
          for (const auto& f : fs::directory_iterator(e.path(), ec))
            r.number += f.path().filename().string()[0] != '.';  // keys, not .lock or .tmp.*
          fs::remove_all(e.path(), ec);
        }
        r.found = true;
        break;
      }
      case StoreOp::Kind::kWait:
        break;
    }
    return r;
  }

  std::string dir_;
  int lock_fd_ = -1;
  // The batch in progress (start/poll).
  std::vector<StoreOp> ops_;
  std::vector<StoreResult> results_;
  size_t cursor_ = 0;
  double deadline_ = 0, started_ = 0;
  bool active_ = false;
};

}  // namespace

std::unique_ptr<Store> open_file_store(const std::string& dir, const std::string& job,
                                       const std::string& attempt, double timeout_s) {
  return std::make_unique<FileStore>(dir, job, attempt, timeout_s);
}

}  // namespace myriad::comm
