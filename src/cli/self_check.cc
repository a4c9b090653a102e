// `myriad self-check`: a node's stop-and-check diagnostics, run by its agent between attempts
// (myriad launch --max-restarts) in a process of its own, so that a machine that cannot compute,
// hold memory or write checkpoints fails here rather than in the next attempt:
//   compute  a GEMM through the training kernels (OpenBLAS here) on integer-valued operands,
//            whose every element is known exactly
//   GPUs     with --device cuda (or auto and GPUs visible): on every visible GPU, the same kind
//            of GEMM through cuBLASLt as the training runs it, checked exactly, and 256 MiB
//            through its memory and back (model/cuda/device.h)
//   memory   64 MiB written with a pattern and read back
//   storage  a file written, synced, read back and removed in the checkpoint directory
//   collective  the node's processes, as many as it runs workers (--ranks), all-reduce 8 MiB of
//            integer-valued floats over Gloo through a file store, each element checked, the bus
//            bandwidth (2(n-1)/n x bytes / time, as nccl-tests count it) at least --min-bus-gbps
// Prints one line, "self-check ok: ..." with what each check measured, or fails with the
// failing check's error (a runtime fault, exit 3). Every recovery waits for it on every node, so
// it is sized to be a smoke test of each path (about 0.3 s on a 2-core machine), not a burn-in:
// 256 MiB of memory and 32 MiB all-reduced cost 2 s a recovery where four nodes share two cores.
// The fault point "diag" (core/fault.h) makes it fail on purpose: diag:fail@node=1.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/args.h"
#include "comm/communicator.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/fault.h"
#include "ops/cpu/ops.h"
#ifdef MYRIAD_HAVE_CUDA
#include "model/cuda/device.h"
#endif

namespace myriad::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// out (n,n) = a (n,n) @ b^T with a[i][k] = (i + 2k) % 7 - 3 and b[j][k] = (3j + k) % 5 - 2: small
// integers, so every sum of products is exact in fp32 and checked against a plain loop.
double compute_check() {
  const int n = 512;
  std::vector<float> a(n * n), b(n * n), out(n * n);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k) a[i * n + k] = float((i + 2 * k) % 7 - 3), b[i * n + k] = float((3 * i + k) % 5 - 2);
  const auto t0 = std::chrono::steady_clock::now();
  cpu::linear_forward(out.data(), a.data(), b.data(), static_cast<const float*>(nullptr), n, n, n);
  const double s = seconds_since(t0);
  for (int i = 0; i < n; i += 7)
    for (int j = 0; j < n; ++j) {
      int64_t want = 0;
      for (int k = 0; k < n; ++k) want += int64_t((i + 2 * k) % 7 - 3) * ((3 * j + k) % 5 - 2);
      if (out[i * n + j] != float(want))
        throw_runtime("self-check: compute: a GEMM gave ", out[i * n + j], " at (", i, ", ", j, "), expected ",
                      want, ": this machine computes wrongly");
    }
  return 2.0 * n * n * n / s / 1e9;
}

double memory_check() {
  const size_t n = (64u << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; ++i)
    if (buf[i] != i * 0x9E3779B97F4A7C15ull)
      throw_runtime("self-check: memory: word ", i, " of 64 MiB read back wrong: this machine's memory is bad");
  return 2.0 * n * sizeof(uint64_t) / seconds_since(t0) / 1e9;
}

double storage_check(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::filesystem::path path = dir / cat(".self_check_", getpid());
  std::vector<char> data(8 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131);
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0644);
  if (fd < 0) throw_runtime("self-check: storage: cannot create ", path.string(), ": the checkpoint directory is not writable");
  const bool written = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) && ::fsync(fd) == 0;
  std::vector<char> back(data.size());
  const bool read = written && ::pread(fd, back.data(), back.size(), 0) == static_cast<ssize_t>(back.size());
  ::close(fd);
  std::filesystem::remove(path, ec);
  if (!written) throw_runtime("self-check: storage: writing 8 MiB to ", dir.string(), " failed (disk full?)");
  if (!read || back != data) throw_runtime("self-check: storage: ", path.string(), " read back wrong");
  return 2.0 * data.size() / seconds_since(t0) / 1e6;
}

// One rank of the collective check; returns the best of 2 timed all-reduces' bus bandwidth in GB/s.
double collective_rank(const std::string& url, int rank, int n) {
  std::shared_ptr<comm::Store> store = comm::make_store(url, "0", 30);
  comm::CommOptions options;
  options.backend = "gloo", options.timeout_s = 30;
  std::unique_ptr<comm::Communicator> g = comm::make_group(store, "self_check", rank, n, options);
  const int64_t count = (8 << 20) / int64_t(sizeof(float));
  std::vector<float> buf(static_cast<size_t>(count));
  double best_s = 1e30;
  for (int iter = 0; iter < 3; ++iter) {  // the first warms the connections up
    for (int64_t i = 0; i < count; ++i) buf[i] = float((rank + 1) * (i % 7 + 1));
    const auto t0 = std::chrono::steady_clock::now();
    g->all_reduce(buf.data(), count)->wait();
    if (iter > 0) best_s = std::min(best_s, seconds_since(t0));
    for (int64_t i = 0; i < count; ++i)
      if (buf[i] != float(n * (n + 1) / 2 * (i % 7 + 1)))
        throw_runtime("self-check: collective: an all-reduce of ", n, " processes gave ", buf[i], " at element ", i,
                      ", expected ", n * (n + 1) / 2 * (i % 7 + 1), ": this node's transport corrupts data");
  }
  g->barrier()->wait();
  return 2.0 * (n - 1) / n * double(count) * sizeof(float) / best_s / 1e9;
}

// The collective check: this process is rank 0, n - 1 forked children the others (forked before
// any other check starts a thread), meeting in a fresh directory. mkdtemp, not a name from the
// pid: a killed check leaves its directory, and a later check given the same pid would meet
// the dead one's members there.
double collective_check(int n, double min_gbps) {
  std::string pattern = (std::filesystem::temp_directory_path() / "myriad-self-check-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw_runtime("self-check: collective: cannot create a directory in ", pattern);
  const std::filesystem::path dir = pattern;
  std::vector<pid_t> children;
  for (int r = 1; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw_runtime("self-check: collective: fork failed");
    if (pid == 0) {
      int code = 0;
      try {
        collective_rank(dir.string(), r, n);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "myriad: %s\n", e.what());
        code = 3;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    children.push_back(pid);
  }
  double gbps = 0;
  std::string error;
  try {
    gbps = collective_rank(dir.string(), 0, n);
  } catch (const std::exception& e) {
    error = e.what();
  }
  bool children_ok = true;
  for (pid_t pid : children) {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) children_ok = false;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!error.empty()) throw_runtime(error);
  if (!children_ok) throw_runtime("self-check: collective: a process of the node's all-reduce failed");
  if (gbps < min_gbps)
    throw_runtime("self-check: collective: the all-reduce of ", n, " processes reached ", gbps,
                  " GB/s of bus bandwidth, below fault.diag_min_bus_gbps (", min_gbps, "): this node's transport is slow");
  return gbps;
}

// Each visible GPU's check; returns "N GPUs, GEMM a..b TFLOP/s" (empty when there are none to check).
std::string gpu_check(const std::string& device) {
#ifdef MYRIAD_HAVE_CUDA
  const int gpus = device == "cpu" ? 0 : cuda_device_count();
#else
  const int gpus = 0;
#endif
  if (gpus == 0) {
#ifdef MYRIAD_HAVE_CUDA
    if (device == "cuda") throw_runtime("self-check: GPUs: the workers train on GPUs but none is visible (driver or device lost)");
#else
    if (device == "cuda") throw_input("self-check: --device cuda, but this build has no CUDA (nvcc was not found at build time)");
#endif
    return "";
  }
  double lo = 1e30, hi = 0;
#ifdef MYRIAD_HAVE_CUDA
  for (int g = 0; g < gpus; ++g) {
    const double tflops = cuda_self_check(g);
    lo = std::min(lo, tflops), hi = std::max(hi, tflops);
  }
#endif
  char line[96];
  std::snprintf(line, sizeof line, ", %d GPU(s): GEMM %.0f..%.0f TFLOP/s, memory ok", gpus, lo, hi);
  return line;
}

}  // namespace

int cmd_self_check(int argc, char** argv) {
  Args args("self-check", argc, argv, {"checkpoint-dir", "ranks", "min-bus-gbps", "device"});
  const std::string dir = args.required("checkpoint-dir");
  const long long ranks = args.get_int("ranks", 1);
  if (ranks < 1 || ranks > 1024) throw_input("self-check: --ranks must be 1..1024, got ", ranks);
  const double min_gbps = args.get_double("min-bus-gbps", 0);
  const std::string device = args.has("device") ? args.get("device") : "auto";
  if (device != "auto" && device != "cpu" && device != "cuda")
    throw_input("self-check: --device must be auto, cpu or cuda, got '", device, "'");
  fault::poll_live(0);
  fault::trigger("diag");  // diag:fail (a runtime fault), kill, hang, ...
  const double bus = ranks > 1 ? collective_check(static_cast<int>(ranks), min_gbps) : 0;  // forks: first
  const double gflops = compute_check(), mem = memory_check(), disk = storage_check(dir);
  const std::string gpus = gpu_check(device);
  std::printf("self-check ok: compute %.1f GFLOP/s, memory %.1f GB/s, checkpoint directory %.0f MB/s", gflops, mem,
              disk);
  if (ranks > 1) std::printf(", all-reduce of %lld processes %.2f GB/s", ranks, bus);
  std::printf("%s\n", gpus.c_str());
  return 0;
}

}  // namespace myriad::cli
