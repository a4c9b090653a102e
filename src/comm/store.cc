#include "comm/store.h"

#include <chrono>
#include <cmath>

#include "comm/store_backends.h"
#include "core/error.h"

namespace myriad::comm {

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* op_kind_name(StoreOp::Kind kind) {
  switch (kind) {
    case StoreOp::Kind::kSet:
      return "set";
    case StoreOp::Kind::kGet:
      return "get";
    case StoreOp::Kind::kAdd:
      return "add";
    case StoreOp::Kind::kCompareSet:
      return "compare_set";
    case StoreOp::Kind::kDel:
      return "del";
    case StoreOp::Kind::kWait:
      return "wait";
    case StoreOp::Kind::kDropAttemptsBelow:
      return "drop_attempts_below";
  }
  return "?";
}

StoreOp StoreOp::set(std::string key, std::string value, double ttl_s) {
  StoreOp op;
  op.kind = Kind::kSet, op.key = std::move(key), op.value = std::move(value), op.ttl_s = ttl_s;
  return op;
}
StoreOp StoreOp::get(std::string key) {
  StoreOp op;
  op.kind = Kind::kGet, op.key = std::move(key);
  return op;
}
StoreOp StoreOp::add(std::string key, int64_t delta) {
  StoreOp op;
  op.kind = Kind::kAdd, op.key = std::move(key), op.delta = delta;
  return op;
}
StoreOp StoreOp::compare_set(std::string key, std::optional<std::string> expected,
                             std::string desired) {
  StoreOp op;
  op.kind = Kind::kCompareSet, op.key = std::move(key), op.expected = std::move(expected);
  op.value = std::move(desired);
  return op;
}
StoreOp StoreOp::del(std::string key) {
  StoreOp op;
  op.kind = Kind::kDel, op.key = std::move(key);
  return op;
}
StoreOp StoreOp::drop_attempts_below(int64_t attempt) {
  StoreOp op;
  op.kind = Kind::kDropAttemptsBelow, op.key = "*", op.delta = attempt;
  return op;
}
StoreOp StoreOp::wait(std::string key) {
  StoreOp op;
  op.kind = Kind::kWait, op.key = std::move(key);
  return op;
}

namespace {

bool valid_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

void check_key(const std::string& key, const std::string& url) {
  if (key.empty()) throw_input("store ", url, ": empty key");
}

}  // namespace

Store::Store(std::string url, const std::string& job, const std::string& attempt, double timeout_s)
    : url_(std::move(url)),
      prefix_(cat("myriad/", job, "/", attempt, "/")),
      job_prefix_(cat("myriad/", job, "/")),
      timeout_s_(timeout_s) {
  if (!valid_name(job))
    throw_input("store ", url_, ": the job name '", job,
                "' must be letters, digits, '.', '_' or '-'");
  if (!valid_name(attempt))
    throw_input("store ", url_, ": the attempt '", attempt,
                "' must be letters, digits, '.', '_' or '-'");
  if (!(timeout_s > 0)) throw_input("store ", url_, ": the timeout must be > 0, got ", timeout_s);
}

Store::~Store() = default;

double Store::deadline_for(double timeout_s) const {
  return steady_now_s() + (timeout_s >= 0 ? timeout_s : timeout_s_);
}

void Store::throw_timeout(const std::string& key, double waited_s) const {
  throw Error(ErrorClass::kComm,
              cat("store ", url_, ": timed out after ", std::round(waited_s * 10) / 10,
                  " s waiting for key '", full_key(key), "'"));
}

std::vector<StoreResult> Store::run(const std::vector<StoreOp>& ops, double timeout_s) {
  for (const StoreOp& op : ops) check_key(op.key, url_);
  if (ops.empty()) return {};
  stats_.ops += static_cast<int64_t>(ops.size());
  stats_.round_trips += 1;
  return run_batch(ops, deadline_for(timeout_s));
}

void Store::start(const std::vector<StoreOp>& ops, double timeout_s) {
  for (const StoreOp& op : ops) check_key(op.key, url_);
  stats_.ops += static_cast<int64_t>(ops.size());
  stats_.round_trips += 1;
  start_batch(ops, deadline_for(timeout_s));
}

void Store::set(const std::string& key, const std::string& value, double ttl_s) {
  if (ttl_s < 0) throw_input("store ", url_, ": negative expiry for key '", key, "'");
  run({StoreOp::set(key, value, ttl_s)});
}

std::string Store::get(const std::string& key) {
  // Wait then read, in one batch; an absent value after the wait (deleted or expired meanwhile)
  // waits again, within the same deadline.
  const double deadline = deadline_for(-1), start = steady_now_s();
  for (;;) {
    double left = deadline - steady_now_s();
    if (left <= 0) throw_timeout(key, steady_now_s() - start);
    std::vector<StoreResult> r = run({StoreOp::wait(key), StoreOp::get(key)}, left);
    if (r[1].found) return std::move(r[1].value);
  }
}

std::optional<std::string> Store::try_get(const std::string& key) {
  std::vector<StoreResult> r = run({StoreOp::get(key)});
  if (!r[0].found) return std::nullopt;
  return std::move(r[0].value);
}

int64_t Store::add(const std::string& key, int64_t delta) {
  return run({StoreOp::add(key, delta)})[0].number;
}

std::optional<std::string> Store::compare_set(const std::string& key,
                                              const std::optional<std::string>& expected,
                                              const std::string& desired) {
  std::vector<StoreResult> r = run({StoreOp::compare_set(key, expected, desired)});
  if (!r[0].found) return std::nullopt;
  return std::move(r[0].value);
}

void Store::wait(const std::vector<std::string>& keys, double timeout_s) {
  std::vector<StoreOp> ops;
  for (const std::string& k : keys) ops.push_back(StoreOp::wait(k));
  run(ops, timeout_s);
}

bool Store::del(const std::string& key) {
  return run({StoreOp::del(key)})[0].found;
}

int64_t Store::drop_attempts_below(int64_t attempt) {
  return run({StoreOp::drop_attempts_below(attempt)})[0].number;
}

// ---- URLs ----

namespace {

std::string percent_decode(const std::string& s, const std::string& url) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
          !std::isxdigit(static_cast<unsigned char>(s[i + 2])))
        throw_input("store URL '", url, "': bad percent escape");
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// redis://[[user]:password@]host[:port]/job; the returned URL for messages drops the password.
std::unique_ptr<Store> open_redis_url(const std::string& url, const std::string& attempt,
                                      double timeout_s) {
  const std::string rest = url.substr(8);
  const size_t slash = rest.find('/');
  if (slash == std::string::npos || slash + 1 >= rest.size())
    throw_input("store URL '", url, "' names no job: expected redis://[:password@]host:port/job");
  std::string authority = rest.substr(0, slash), job = rest.substr(slash + 1);
  if (!job.empty() && job.back() == '/') job.pop_back();
  RedisAddress a;
  if (size_t at = authority.rfind('@'); at != std::string::npos) {
    std::string userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    size_t colon = userinfo.find(':');
    if (colon == std::string::npos) {
      a.password = percent_decode(userinfo, url);  // redis://password@host (lenient)
    } else {
      a.user = percent_decode(userinfo.substr(0, colon), url);
      a.password = percent_decode(userinfo.substr(colon + 1), url);
    }
  }
  std::string port;
  if (!authority.empty() && authority[0] == '[') {  // [v6 address]:port
    size_t close = authority.find(']');
    if (close == std::string::npos) throw_input("store URL '", url, "': unclosed '['");
    a.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') throw_input("store URL '", url, "': bad host");
      port = authority.substr(close + 2);
    }
  } else if (size_t colon = authority.rfind(':'); colon != std::string::npos) {
    a.host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  } else {
    a.host = authority;
  }
  if (a.host.empty()) throw_input("store URL '", url, "' names no host");
  if (!port.empty()) {
    size_t used = 0;
    int p = -1;
    try {
      p = std::stoi(port, &used);
    } catch (...) {
    }
    if (used != port.size() || p <= 0 || p > 65535)
      throw_input("store URL '", url, "': bad port '", port, "'");
    a.port = p;
  }
  return open_redis_store(a, job, attempt, timeout_s);
}

std::unique_ptr<Store> open_file_url(const std::string& url, const std::string& attempt,
                                     double timeout_s) {
  std::string path = url.rfind("file://", 0) == 0 ? url.substr(7) : url;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  std::string job = slash == std::string::npos ? path : path.substr(slash + 1);
  if (job.empty() || job == "/")
    throw_input("store URL '", url, "' names no job: expected file:///dir/job");
  return open_file_store(dir, job, attempt, timeout_s);
}

}  // namespace

std::unique_ptr<Store> make_store(const std::string& url, const std::string& attempt,
                                  double timeout_s) {
  if (url.empty())
    throw_input("empty store URL: expected redis://host:port/job or file:///dir/job");
  if (url.rfind("redis://", 0) == 0) return open_redis_url(url, attempt, timeout_s);
  if (url.rfind("file://", 0) == 0 || url.find("://") == std::string::npos)
    return open_file_url(url, attempt, timeout_s);
  throw_input("store URL '", url, "': unknown scheme (expected redis:// or file://)");
}

}  // namespace myriad::comm
