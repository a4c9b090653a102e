// `myriad self-check`: a node's stop-and-check diagnostics, run by its agent between attempts
// (myriad launch --max-restarts) in a process of its own, so that a machine that cannot compute,
// hold memory or write checkpoints fails here rather than in the next attempt:
//   compute  a GEMM through the training kernels (OpenBLAS here) on integer-valued operands,
//            whose every element is known exactly
//   memory   256 MiB written with a pattern and read back
//   storage  a file written, synced, read back and removed in the checkpoint directory
// Prints one line, "self-check ok: ..." with what each check measured, or fails with the
// failing check's error (a runtime fault, exit 3). The fault point "diag" (core/fault.h) makes
// it fail on purpose: diag:fail@node=1.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/args.h"
#include "core/error.h"
#include "core/fault.h"
#include "ops/cpu/ops.h"

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
  const size_t n = (256u << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; ++i)
    if (buf[i] != i * 0x9E3779B97F4A7C15ull)
      throw_runtime("self-check: memory: word ", i, " of 256 MiB read back wrong: this machine's memory is bad");
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

}  // namespace

int cmd_self_check(int argc, char** argv) {
  Args args("self-check", argc, argv, {"checkpoint-dir"});
  const std::string dir = args.required("checkpoint-dir");
  fault::trigger("diag");  // diag:fail (a runtime fault), kill, hang, ...
  const double gflops = compute_check(), mem = memory_check(), disk = storage_check(dir);
  std::printf("self-check ok: compute %.1f GFLOP/s, memory %.1f GB/s, checkpoint directory %.0f MB/s\n", gflops,
              mem, disk);
  return 0;
}

}  // namespace myriad::cli
