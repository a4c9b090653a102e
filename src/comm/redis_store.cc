// RedisStore: one connection per Store object, batches pipelined, waits by notification.
//
// Why notification rather than polling: a set-up wait has thousands of waiters on one key (every
// rank of the world waits for the leader's id, then for the release key). Polling costs
// waiters x (wait time / interval) commands and adds up to one interval of latency; a
// notification costs one command per waiter and wakes it at once. BLPOP itself cannot serve an
// unknown number of waiters (each pop consumes the element), so every change that creates a key
// also appends to a companion stream "myriad-ev/<job>/<attempt>/<key>" (one entry kept), and a
// wait is `XREAD BLOCK ms STREAMS <stream> 0`: it returns at once when the key was ever set
// (level-triggered: no lost wake-up whatever the order of set and wait) and blocks otherwise,
// without consuming anything. del and expiry remove the stream with the key. Each change runs as
// one Lua script, so the key and its stream change together.
//
// The connection is ours: hiredis connects (and parses replies); the socket is non-blocking and
// every read or write is bounded by the batch's deadline, so a frozen or vanished server is an
// Error(kComm) naming host:port, never a hang. After an error the connection is dropped and the
// next batch reconnects.
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string_view>
#include <thread>

#include "comm/store_backends.h"
#include "core/error.h"

namespace myriad::comm {
namespace {

// KEYS: key, stream. ARGV: value, ttl in ms (0 = none).
const char* kSetScript = R"(local ttl = tonumber(ARGV[2])
if ttl > 0 then redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl) else redis.call('SET', KEYS[1], ARGV[1]) end
redis.call('XADD', KEYS[2], 'MAXLEN', 1, '*', 'v', '')
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) else redis.call('PERSIST', KEYS[2]) end
return 1)";
// KEYS: key, stream. ARGV: delta. Notifies only when it creates the key.
const char* kAddScript = R"(local fresh = redis.call('EXISTS', KEYS[1]) == 0
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
if fresh then redis.call('XADD', KEYS[2], 'MAXLEN', 1, '*', 'v', '') redis.call('PERSIST', KEYS[2]) end
return v)";
// KEYS: key, stream. ARGV: expected, desired, "1" when an expected value is given ("0": absent).
const char* kCompareSetScript = R"(local cur = redis.call('GET', KEYS[1])
local match
if ARGV[3] == '1' then match = (cur == ARGV[1]) else match = (cur == false) end
if match then
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', 1, '*', 'v', '')
  redis.call('PERSIST', KEYS[2])
  return ARGV[2]
end
return cur)";
// KEYS: key, stream.
const char* kDelScript = R"(local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
return n)";

// ARGV: "myriad/<job>/", "myriad-ev/<job>/", attempt. Deletes the keys (and their streams) of
// numbered attempts below ARGV[3]; SCAN inside the script, so the job's keys go in one step.
const char* kDropAttemptsScript = R"(local n = 0
for _, pre in ipairs({ARGV[1], ARGV[2]}) do
  local cursor = '0'
  repeat
    local r = redis.call('SCAN', cursor, 'MATCH', pre .. '*', 'COUNT', 1000)
    cursor = r[1]
    for _, k in ipairs(r[2]) do
      local a = string.match(string.sub(k, #pre + 1), '^(%d+)/')
      if a and tonumber(a) < tonumber(ARGV[3]) then
        redis.call('DEL', k)
        if pre == ARGV[1] then n = n + 1 end
      end
    end
  until cursor == '0'
end
return n)";

// How long a refused connection is retried (a server starting up takes well under this).
constexpr double kRefusedLimit_s = 10;

// Extra time a client gives a server-side timeout (XREAD BLOCK) to arrive before giving up itself.
constexpr double kReplyGrace_s = 0.5;

void append_command(std::string* out, std::initializer_list<std::string_view> args) {
  *out += '*';
  *out += std::to_string(args.size());
  *out += "\r\n";
  for (std::string_view a : args) {
    *out += '$';
    *out += std::to_string(a.size());
    *out += "\r\n";
    out->append(a.data(), a.size());
    *out += "\r\n";
  }
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

double round1(double x) {
  return std::round(x * 10) / 10;
}

class RedisStore final : public Store {
 public:
  RedisStore(const RedisAddress& a, const std::string& job, const std::string& attempt,
             double timeout_s)
      : Store(cat("redis://", a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host,
                  ":", a.port, "/", job),
              job, attempt, timeout_s),
        addr_(a),
        ev_prefix_(cat("myriad-ev/", job, "/", attempt, "/")),
        ev_job_prefix_(cat("myriad-ev/", job, "/")),
        hostport_(cat(a.host, ":", a.port)) {
    connect(deadline_for(-1));
  }
  ~RedisStore() override { disconnect(); }

  int fd() const override { return ctx_ ? ctx_->fd : -1; }

  bool poll(std::vector<StoreResult>* out) override {
    if (!active_) throw Error(ErrorClass::kInternal, "RedisStore::poll without start");
    if (!progress()) {
      if (steady_now_s() > deadline_ + kReplyGrace_s) fail_no_reply();
      return false;
    }
    active_ = false;
    *out = std::move(results_);
    return true;
  }

 protected:
  std::vector<StoreResult> run_batch(const std::vector<StoreOp>& ops, double deadline_s) override {
    start_batch(ops, deadline_s);
    while (!progress()) {
      const double left = deadline_ + kReplyGrace_s - steady_now_s();
      if (left <= 0) fail_no_reply();
      struct pollfd p = {ctx_->fd,
                         static_cast<short>(POLLIN | (out_off_ < out_.size() ? POLLOUT : 0)), 0};
      int rc = ::poll(&p, 1, static_cast<int>(std::ceil(left * 1000)));
      if (rc < 0 && errno != EINTR) lost(std::strerror(errno));
    }
    active_ = false;
    return std::move(results_);
  }

  void start_batch(const std::vector<StoreOp>& ops, double deadline_s) override {
    if (active_) {  // a batch abandoned by an exception: its replies would be misread
      disconnect();
      active_ = false;
    }
    if (!ctx_) connect(deadline_s);
    ops_ = ops;
    results_.assign(ops.size(), StoreResult{});
    replies_ = 0;
    deadline_ = deadline_s;
    started_ = steady_now_s();
    out_.clear();
    out_off_ = 0;
    for (const StoreOp& op : ops) encode(op);
    active_ = true;
    progress();
  }

 private:
  void encode(const StoreOp& op) {
    const std::string key = full_key(op.key), ev = ev_prefix_ + op.key;
    switch (op.kind) {
      case StoreOp::Kind::kSet: {
        const int64_t ttl_ms =
            op.ttl_s > 0 ? std::max<int64_t>(1, std::llround(op.ttl_s * 1000)) : 0;
        append_command(&out_, {"EVAL", kSetScript, "2", key, ev, op.value, std::to_string(ttl_ms)});
        break;
      }
      case StoreOp::Kind::kGet:
        append_command(&out_, {"GET", key});
        break;
      case StoreOp::Kind::kAdd:
        append_command(&out_, {"EVAL", kAddScript, "2", key, ev, std::to_string(op.delta)});
        break;
      case StoreOp::Kind::kCompareSet:
        append_command(&out_, {"EVAL", kCompareSetScript, "2", key, ev, op.expected.value_or(""),
                               op.value, op.expected ? "1" : "0"});
        break;
      case StoreOp::Kind::kDel:
        append_command(&out_, {"EVAL", kDelScript, "2", key, ev});
        break;
      case StoreOp::Kind::kDropAttemptsBelow:
        append_command(&out_, {"EVAL", kDropAttemptsScript, "0", job_prefix(), ev_job_prefix_,
                               std::to_string(op.delta)});
        break;
      case StoreOp::Kind::kWait: {
        // The server-side wait ends at the batch's deadline (at least 1 ms: 0 would be forever).
        const int64_t ms = std::max<int64_t>(1, std::llround((deadline_ - steady_now_s()) * 1000));
        append_command(&out_,
                       {"XREAD", "COUNT", "1", "BLOCK", std::to_string(ms), "STREAMS", ev, "0"});
        break;
      }
    }
  }

  // Writes and reads what the socket allows; true once every reply of the batch is in.
  bool progress() {
    pump();
    while (replies_ < ops_.size()) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader_, &raw) != REDIS_OK)
        lost(cat("protocol error: ", reader_->errstr));
      if (!raw) break;
      ReplyPtr reply(static_cast<redisReply*>(raw));
      decode(ops_[replies_], reply.get(), &results_[replies_]);
      ++replies_;
    }
    return replies_ == ops_.size();  // the batch stays active until its results are delivered
  }

  // Sends pending output and feeds the reader until the socket is drained (edge-triggered
  // callers rely on the draining).
  void pump() {
    while (out_off_ < out_.size()) {
      ssize_t n = ::send(ctx_->fd, out_.data() + out_off_, out_.size() - out_off_,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        lost(std::strerror(errno));
      }
      out_off_ += static_cast<size_t>(n);
    }
    char buf[16384];
    for (;;) {
      ssize_t n = ::recv(ctx_->fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        lost(std::strerror(errno));
      }
      if (n == 0) lost("closed by the server");
      if (redisReaderFeed(reader_, buf, static_cast<size_t>(n)) != REDIS_OK) lost("reader error");
    }
  }

  void decode(const StoreOp& op, const redisReply* r, StoreResult* out) {
    if (r->type == REDIS_REPLY_ERROR) {
      std::string msg(r->str, r->len);
      active_ = false;
      const bool auth = msg.rfind("NOAUTH", 0) == 0 || msg.rfind("WRONGPASS", 0) == 0;
      const bool integer = msg.find("not an integer") != std::string::npos;
      disconnect();  // drop the rest of the batch's replies with the connection
      throw Error(
          auth      ? ErrorClass::kInput
          : integer ? ErrorClass::kInternal
                    : ErrorClass::kComm,
          cat("store ", url(), ": ", op_kind_name(op.kind), " '", full_key(op.key), "': ", msg,
              auth ? " (give the password in the URL: redis://:PASSWORD@host:port/job)" : ""));
    }
    switch (op.kind) {
      case StoreOp::Kind::kSet:
        out->found = true;
        break;
      case StoreOp::Kind::kGet:
      case StoreOp::Kind::kCompareSet:
        if (r->type == REDIS_REPLY_STRING) out->found = true, out->value.assign(r->str, r->len);
        break;
      case StoreOp::Kind::kAdd:
        out->found = true;
        out->number = r->integer;
        break;
      case StoreOp::Kind::kDel:
        out->found = r->integer > 0;
        break;
      case StoreOp::Kind::kDropAttemptsBelow:
        out->found = true;
        out->number = r->integer;
        break;
      case StoreOp::Kind::kWait:
        if (r->type != REDIS_REPLY_ARRAY) {  // nil: the server-side wait ended
          active_ = false;
          disconnect();  // later waits of the batch may still be pending on the server
          throw_timeout(op.key, steady_now_s() - started_);
        }
        out->found = true;
        break;
    }
  }

  [[noreturn]] void fail_no_reply() {
    const StoreOp& op = ops_[replies_];
    const double waited = steady_now_s() - started_;
    active_ = false;
    disconnect();
    if (op.kind == StoreOp::Kind::kWait) throw_timeout(op.key, waited);
    throw Error(ErrorClass::kComm,
                cat("store ", url(), ": no reply from ", hostport_, " within ", round1(waited),
                    " s to ", op_kind_name(op.kind), " '", full_key(op.key), "'"));
  }

  [[noreturn]] void lost(const std::string& why) {
    std::string during;
    if (active_ && replies_ < ops_.size())
      during = cat(" during ", op_kind_name(ops_[replies_].kind), " '",
                   full_key(ops_[replies_].key), "'");
    active_ = false;
    disconnect();
    throw Error(ErrorClass::kComm,
                cat("store ", url(), ": connection to ", hostport_, " lost", during, ": ", why));
  }

  // Retries until `deadline`, but a server that refuses the connection (none listens there:
  // a wrong URL, or no redis-server) only for kRefusedLimit_s: waiting out the whole timeout
  // for that helps nobody.
  void connect(double deadline) {
    std::string last;
    double backoff = 0.02;
    const double refused_until = steady_now_s() + kRefusedLimit_s;
    for (;;) {
      const double left = std::max(0.001, deadline - steady_now_s());
      struct timeval tv;
      tv.tv_sec = static_cast<time_t>(left);
      tv.tv_usec = static_cast<suseconds_t>((left - static_cast<double>(tv.tv_sec)) * 1e6);
      redisContext* c = redisConnectWithTimeout(addr_.host.c_str(), addr_.port, tv);
      if (c && !c->err) {
        ctx_ = c;
        break;
      }
      last = c ? c->errstr : "out of memory";
      const bool refused = c && last.find("refused") != std::string::npos;
      if (c) redisFree(c);
      const double now = steady_now_s();
      if (refused && now >= refused_until && now < deadline)
        throw Error(ErrorClass::kComm,
                    cat("store ", url(), ": ", hostport_, " refused the connection for ",
                        kRefusedLimit_s, " s: is redis-server running there? (check the store URL, "
                        "--rdzv or MYRIAD_RDZV)"));
      if (now >= deadline)
        throw Error(ErrorClass::kComm, cat("store ", url(), ": cannot connect to ", hostport_,
                                           " within ", round1(timeout_s()), " s: ", last));
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(backoff, deadline - now)));
      backoff = std::min(backoff * 2, 0.5);
    }
    int flags = ::fcntl(ctx_->fd, F_GETFL);
    ::fcntl(ctx_->fd, F_SETFL, flags | O_NONBLOCK);
    int one = 1;
    ::setsockopt(ctx_->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    reader_ = redisReaderCreate();
    if (!reader_) {
      disconnect();
      throw std::bad_alloc();
    }
    if (!addr_.password.empty()) authenticate(deadline);
  }

  // AUTH on a fresh connection; an error reply (a wrong password) is an input error.
  void authenticate(double deadline) {
    out_.clear();
    out_off_ = 0;
    if (addr_.user.empty())
      append_command(&out_, {"AUTH", addr_.password});
    else
      append_command(&out_, {"AUTH", addr_.user, addr_.password});
    for (;;) {
      pump();
      void* raw = nullptr;
      if (redisReaderGetReply(reader_, &raw) != REDIS_OK) lost("protocol error");
      if (raw) {
        ReplyPtr reply(static_cast<redisReply*>(raw));
        if (reply->type == REDIS_REPLY_ERROR) {
          std::string msg(reply->str, reply->len);
          disconnect();
          throw Error(ErrorClass::kInput, cat("store ", url(), ": authentication failed: ", msg));
        }
        return;
      }
      const double left = deadline + kReplyGrace_s - steady_now_s();
      if (left <= 0) {
        disconnect();
        throw Error(ErrorClass::kComm, cat("store ", url(), ": no reply from ", hostport_,
                                           " to AUTH within ", round1(timeout_s()), " s"));
      }
      struct pollfd p = {ctx_->fd,
                         static_cast<short>(POLLIN | (out_off_ < out_.size() ? POLLOUT : 0)), 0};
      ::poll(&p, 1, static_cast<int>(std::ceil(left * 1000)));
    }
  }

  void disconnect() {
    if (reader_) redisReaderFree(reader_);
    reader_ = nullptr;
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
  }

  RedisAddress addr_;
  std::string ev_prefix_, ev_job_prefix_;
  std::string hostport_;
  redisContext* ctx_ = nullptr;
  redisReader* reader_ = nullptr;
  // The batch in flight.
  std::vector<StoreOp> ops_;
  std::vector<StoreResult> results_;
  size_t replies_ = 0;
  std::string out_;
  size_t out_off_ = 0;
  double deadline_ = 0, started_ = 0;
  bool active_ = false;
};

}  // namespace

std::unique_ptr<Store> open_redis_store(const RedisAddress& address, const std::string& job,
                                        const std::string& attempt, double timeout_s) {
  return std::make_unique<RedisStore>(address, job, attempt, timeout_s);
}

}  // namespace myriad::comm
