#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/fault.h"
#include "core/files.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace myriad::checkpoint {
namespace {

constexpr const char* kFormat = "myriad-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kCommitMarker = "COMMITTED";

uint32_t crc32_of(const void* data, size_t bytes) {
  return static_cast<uint32_t>(crc32_z(0L, static_cast<const Bytef*>(data), bytes));
}

class File {
 public:
  File(const std::string& path, int flags) : path_(path), fd_(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw_runtime("checkpoint: cannot open ", path, ": ", std::strerror(errno));
  }
  ~File() { if (fd_ >= 0) ::close(fd_); }
  void write_all(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, 1 << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_runtime("checkpoint: write to ", path_, " failed: ", std::strerror(errno));
      p += n, bytes -= n;
    }
  }
  void read_at(void* data, size_t bytes, int64_t offset) {
    char* p = static_cast<char*>(data);
    while (bytes > 0) {
      ssize_t n = ::pread(fd_, p, bytes, offset);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_runtime("checkpoint: read of ", path_, " failed: ", std::strerror(errno));
      if (n == 0) throw Corrupt(cat("checkpoint ", path_, ": file is truncated; use an earlier checkpoint"));
      p += n, bytes -= n, offset += n;
    }
  }
  void sync() {
    if (::fsync(fd_) != 0) throw_runtime("checkpoint: fsync of ", path_, " failed: ", std::strerror(errno));
  }

 private:
  std::string path_;
  int fd_;
};

void write_text(const std::string& path, const std::string& text) { write_file_durably(path, {text}); }

bool is_step_dir(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.size() == 13 && n.rfind("step_", 0) == 0 &&
         std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool committed(const fs::path& p) { return is_step_dir(p) && fs::exists(p / kCommitMarker); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// Copies the intersection of a stored piece (src at src_off, shape src_shape) and a requested
// region (dst at dst_off, shape dst_shape), both inside the same global tensor.
void copy_overlap(const float* src, const std::vector<int64_t>& src_off,
                  const std::vector<int64_t>& src_shape, float* dst,
                  const std::vector<int64_t>& dst_off, const std::vector<int64_t>& dst_shape,
                  int64_t& copied) {
  const size_t nd = dst_shape.size();
  std::vector<int64_t> lo(nd), hi(nd);
  for (size_t d = 0; d < nd; ++d) {
    lo[d] = std::max(src_off[d], dst_off[d]);
    hi[d] = std::min(src_off[d] + src_shape[d], dst_off[d] + dst_shape[d]);
    if (lo[d] >= hi[d]) return;
  }
  // Walk every index of the overlap but the last dimension; copy runs along the last.
  std::vector<int64_t> idx(lo);
  const int64_t run = hi[nd - 1] - lo[nd - 1];
  while (true) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d < nd; ++d) {
      s = s * src_shape[d] + (idx[d] - src_off[d]);
      t = t * dst_shape[d] + (idx[d] - dst_off[d]);
    }
    std::memcpy(dst + t, src + s, run * sizeof(float));
    copied += run;
    int d = static_cast<int>(nd) - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
    }
    if (d < 0) break;
  }
}

// COMMITTED of `dir`, opened and locked (shared, or exclusive without waiting): the descriptor,
// or -1 when the checkpoint is gone (pruned meanwhile) or, for `exclusive`, held by a reader. A
// file system that cannot lock gives an unlocked descriptor: no worse than before holds existed.
int lock_commit_marker(const fs::path& dir, bool exclusive) {
  const fs::path marker = dir / kCommitMarker;
  // An exclusive lock over NFS needs a descriptor open for writing.
  int fd = exclusive ? ::open(marker.c_str(), O_RDWR | O_CLOEXEC) : -1;
  if (fd < 0) fd = ::open(marker.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc;
  while ((rc = ::flock(fd, exclusive ? LOCK_EX | LOCK_NB : LOCK_SH)) != 0 && errno == EINTR) {}
  if (rc != 0 && errno == EWOULDBLOCK) {
    ::close(fd);
    return -1;
  }
  // Held: still the marker of a checkpoint under its committed name (a pruner that had it first
  // moved the directory away, or removed it, before letting go)?
  struct stat held{}, now{};
  if (::fstat(fd, &held) != 0 || ::stat(marker.c_str(), &now) != 0 || held.st_ino != now.st_ino ||
      held.st_dev != now.st_dev) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int64_t Shard::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

namespace {
// Rank 0's wait for every rank's index file of a save (each appears by an atomic rename, so one
// that exists is whole).
void wait_for_parts(const fs::path& tmp, int64_t step, const SaveGroup& group) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(group.timeout_s);
  char name[32];
  for (int r = 1; r < group.world; ++r) {
    std::snprintf(name, sizeof name, "index_%05d.json", r);
    for (int i = 0; !fs::exists(tmp / name); ++i) {
      if (group.cancel && group.cancel->load())
        throw_runtime("checkpoint: the save of step ", step, " was abandoned: the process is ending");
      if (std::chrono::steady_clock::now() > deadline)
        throw_runtime("checkpoint: rank ", r, "'s part of the save of step ", step, " did not arrive in ",
                      tmp.string(), " within ", group.timeout_s, " s (comm.timeout_s)");
      std::this_thread::sleep_for(std::chrono::milliseconds(i < 100 ? 2 : 20));
    }
  }
}
}  // namespace

namespace {
// The save of `final_dir` through its partial directory `tmp` (save() and save_as()). With
// `replace`, a committed checkpoint of the same step is replaced once the new one is complete;
// without, an existing `final_dir` is left alone and the save fails (save_as: the user's path).
void save_into(const fs::path& final_dir, const fs::path& tmp, int64_t step, nlohmann::json meta,
               const std::vector<Shard>& shards, const SaveGroup& group, bool replace = true) {
  const fs::path root = final_dir.parent_path();
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (!fs::is_directory(tmp)) throw_runtime("checkpoint: cannot create ", tmp.string(), ": ", ec.message());

  // Each rank: its shard file, then its part of the tensor index. A rank whose write fails (a
  // full disk) removes what it wrote; rank 0 the whole partial directory, so that a failed save
  // frees its space for the next one.
  char name[32];
  std::snprintf(name, sizeof name, "shard_%05d.bin", group.rank);
  nlohmann::json index = nlohmann::json::array();
  try {
    File f((tmp / name).string(), O_WRONLY | O_CREAT | O_TRUNC);
    int64_t offset = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      const Shard& s = shards[i];
      const size_t bytes = s.numel() * sizeof(float);
      if (i == shards.size() / 2) fault::trigger("checkpoint_write");
      f.write_all(s.data, bytes);
      index.push_back({{"name", s.name},
                       {"dtype", "f32"},
                       {"global_shape", s.global_shape},
                       {"pieces", {{{"file", name},
                                    {"byte_offset", offset},
                                    {"offset", s.offset},
                                    {"shape", s.shape},
                                    {"crc32", crc32_of(s.data, bytes)}}}}});
      offset += bytes;
    }
    f.sync();
    std::snprintf(name, sizeof name, "index_%05d.json", group.rank);
    write_text((tmp / (std::string(name) + ".tmp")).string(), index.dump());
    fs::rename(tmp / (std::string(name) + ".tmp"), tmp / name);
  } catch (...) {
    for (const char* f : {"shard_%05d.bin", "index_%05d.json", "index_%05d.json.tmp"}) {
      std::snprintf(name, sizeof name, f, group.rank);
      fs::remove(tmp / name, ec);
    }
    if (group.rank == 0) fs::remove_all(tmp, ec);
    throw;
  }
  if (group.rank != 0) return;

  // Rank 0: one index over every rank's pieces, then the commit.
  try {
    wait_for_parts(tmp, step, group);
    nlohmann::json tensors = nlohmann::json::array();
    std::map<std::string, size_t> where;
    for (int r = 0; r < group.world; ++r) {
      std::snprintf(name, sizeof name, "index_%05d.json", r);
      std::ifstream in(tmp / name);
      nlohmann::json part = nlohmann::json::parse(in);
      for (auto& t : part) {
        auto it = where.find(t["name"]);
        if (it == where.end()) {
          where[t["name"]] = tensors.size();
          tensors.push_back(t);
        } else {
          for (auto& piece : t["pieces"]) tensors[it->second]["pieces"].push_back(piece);
        }
      }
      fs::remove(tmp / name, ec);
    }
    meta["format"] = kFormat;
    meta["version"] = kVersion;
    meta["step"] = step;
    meta["ranks"] = group.world;
    meta["tensors"] = tensors;
    const std::string meta_text = meta.dump(1);
    write_text((tmp / "meta.json").string(), meta_text);
    write_text((tmp / kCommitMarker).string(),
               cat("step ", step, "\nmeta.json crc32 ", crc32_of(meta_text.data(), meta_text.size()), "\n"));
    sync_dir(tmp.string());

    if (!replace) {
      // RENAME_NOREPLACE: a directory that appeared meanwhile is not replaced, not even an
      // empty one (which a plain rename would).
      if (const int err = rename_noreplace(tmp.string(), final_dir.string()); err != 0) {
        if (err == EEXIST || err == ENOTEMPTY)
          throw_input("checkpoint ", final_dir.string(), " appeared while it was written; it is left as it is: give a "
                      "new directory");
        throw_runtime("checkpoint: cannot rename ", tmp.string(), " to ", final_dir.string(), ": ", std::strerror(err));
      }
      sync_dir(root.string());
      return;
    }
    // Replace a committed checkpoint of the same step only now that the new one is complete,
    // and once no reader holds it (ReadHold): the save waits for them.
    const fs::path old = root / (final_dir.filename().string() + ".replaced");
    const bool had_old = fs::exists(final_dir);
    int held = -1;
    for (double waited = 0; had_old && fs::exists(final_dir / kCommitMarker) &&
                            (held = lock_commit_marker(final_dir, true)) < 0; waited += 0.1) {
      if (waited == 0) log::info("checkpoint: waiting for the readers of ", final_dir.string(), " to replace it");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // One swap where the file system can (the partial directory then holds the old one, removed
    // next, or at the next start after a crash); else the old one moved aside first, which the
    // next start puts back if a crash comes between the two renames (remove_leftovers).
    if (had_old && rename_exchange(tmp.string(), final_dir.string()) == 0) {
      sync_dir(root.string());
      fs::remove_all(tmp, ec);
    } else {
      fs::remove_all(old, ec);
      if (had_old) fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      sync_dir(root.string());
      if (had_old) fs::remove_all(old, ec);
    }
    if (held >= 0) ::close(held);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}
}  // namespace

std::string save(const std::string& root, int64_t step, nlohmann::json meta,
                 const std::vector<Shard>& shards, const SaveGroup& group) {
  const fs::path final_dir = fs::path(root) / step_dir_name(step);
  save_into(final_dir, fs::path(root) / cat(step_dir_name(step), ".", group.id, ".partial"), step, std::move(meta),
            shards, group);
  return final_dir.string();
}

void save_as(const std::string& dir, int64_t step, nlohmann::json meta, const std::vector<Shard>& shards,
             const std::map<std::string, std::string>& files) {
  fs::path final_dir = fs::absolute(dir).lexically_normal();
  if (final_dir.filename().empty()) final_dir = final_dir.parent_path();  // "out/"
  // `dir` is a path the user named: an existing one is never replaced, and the partial directory
  // is a new one of this process's (DIR.partial-<pid>), so that its removal after a failure
  // removes nothing of the user's.
  std::error_code ec;
  if (fs::exists(fs::symlink_status(final_dir, ec)))
    throw_input("checkpoint ", final_dir.string(), " exists: give a new directory");
  fs::create_directories(final_dir.parent_path(), ec);
  for (int i = 0;; ++i) {
    const fs::path tmp = final_dir.string() + cat(".partial-", ::getpid(), i ? cat("-", i) : std::string());
    if (::mkdir(tmp.c_str(), 0755) == 0) {
      try {
        for (const auto& [name, bytes] : files) write_text((tmp / name).string(), bytes);
      } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
      }
      save_into(final_dir, tmp, step, std::move(meta), shards, {}, /*replace=*/false);
      return;
    }
    const int err = errno;
    if (err == EEXIST && i < 100) continue;
    if (err == ENOSPC || err == EDQUOT || err == EIO)
      throw_runtime("checkpoint: cannot create ", tmp.string(), ": ", std::strerror(err));
    throw_input("checkpoint ", final_dir.string(), ": cannot create a directory beside it (", tmp.string(), ": ",
                std::strerror(err), "): give another directory");
  }
}

Writer::~Writer() {
  cancel_ = true;
  if (thread_.joinable()) thread_.join();
}

void Writer::start(std::function<void()> save) {
  wait();
  done_ = false;
  thread_ = std::thread([this, save = std::move(save)] {
    try {
      save();
    } catch (const std::exception& e) {
      log::error("checkpoint: the save failed: ", e.what());
      error_ = std::current_exception();
    } catch (...) {
      error_ = std::current_exception();
    }
    done_ = true;
  });
}

void Writer::poll() {
  if (thread_.joinable() && done_) wait();
}

void Writer::wait() {
  if (thread_.joinable()) thread_.join();
  if (std::exception_ptr e = std::exchange(error_, nullptr)) std::rethrow_exception(e);
}

std::optional<std::string> latest(const std::string& root) {
  std::optional<std::string> best;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return best;
  std::string best_name;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!committed(e.path())) continue;
    std::string name = e.path().filename().string();
    if (name > best_name) best_name = name, best = e.path().string();
  }
  return best;
}

std::vector<std::string> committed_newest_first(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (committed(e.path())) out.push_back(e.path().string());
  std::sort(out.rbegin(), out.rend());  // step_<8 digits>: the names sort as the steps
  return out;
}


ReadHold::ReadHold(const std::string& path) {
  if (fs::exists(fs::path(path) / "meta.json")) {
    dir_ = path;
    fd_ = lock_commit_marker(path, false);  // read_meta says what is wrong with one that is not held
    return;
  }
  // A run that saves and prunes as it goes may prune every checkpoint listed here before one is
  // held; it prunes only after committing a newer one, so the listing is taken again then.
  for (int listing = 0; listing < 100; ++listing) {
    std::vector<std::string> found = committed_newest_first(path);
    if (found.empty()) found = committed_newest_first((fs::path(path) / "checkpoints").string());
    if (found.empty()) break;
    for (const std::string& dir : found) {
      if ((fd_ = lock_commit_marker(dir, false)) < 0) continue;
      if (dir != found.front())
        log::warn("checkpoint: ", found.front(), " was pruned as it was chosen; reading ", dir, ", the newest left");
      dir_ = dir;
      return;
    }
  }
  throw_input("checkpoint ", path, ": no committed checkpoint there (give a step_XXXXXXXX "
              "directory, a checkpoints/ directory or a run directory)");
}

ReadHold::~ReadHold() {
  if (fd_ >= 0) ::close(fd_);
}

std::string resolve(const std::string& path) {
  if (fs::exists(fs::path(path) / "meta.json")) return path;
  std::optional<std::string> found = latest(path);
  if (!found) found = latest((fs::path(path) / "checkpoints").string());
  if (!found)
    throw_input("checkpoint ", path, ": no committed checkpoint there (give a step_XXXXXXXX "
                "directory, a checkpoints/ directory or a run directory)");
  return *found;
}

nlohmann::json read_meta(const std::string& dir) {
  if (!fs::is_directory(dir))
    throw_input("checkpoint ", dir, ": no such directory");
  if (!fs::exists(fs::path(dir) / kCommitMarker))
    throw_input("checkpoint ", dir, ": not committed (no ", kCommitMarker,
                " marker: the save did not finish); use an earlier checkpoint");
  // The commit marker holds the CRC32 of meta.json: the data position, the optimizer step and
  // the tensor index are trusted only when they are the bytes that were committed.
  const std::string marker = read_file((fs::path(dir) / kCommitMarker).string());
  const size_t at = marker.find("meta.json crc32 ");
  if (at == std::string::npos)
    throw Corrupt(cat("checkpoint ", dir, "/", kCommitMarker, ": no meta.json checksum (damaged, "
                      "or written by an older Myriad); use another checkpoint"));
  const std::string text = read_file((fs::path(dir) / "meta.json").string());
  if (text.empty()) throw Corrupt(cat("checkpoint ", dir, ": missing or empty meta.json; use an earlier checkpoint"));
  const unsigned long long want = std::strtoull(marker.c_str() + at + 16, nullptr, 10);
  if (crc32_of(text.data(), text.size()) != want)
    throw Corrupt(cat("checkpoint ", dir, "/meta.json: checksum mismatch (it differs from what was "
                      "committed); use an earlier checkpoint"));
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Corrupt(cat("checkpoint ", dir, "/meta.json: not valid JSON (", e.what(), "); use an earlier checkpoint"));
  }
  if (meta.value("format", "") != kFormat || meta.value("version", 0) != kVersion)
    throw_input("checkpoint ", dir, "/meta.json: not a ", kFormat, " version ", kVersion, " checkpoint");
  return meta;
}

void check_writable(const std::string& root) {
  require_writable_dir(root, "checkpoint directory", "set checkpoint.dir (or --run-dir) to a writable directory");
}

void remove_leftovers(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  // A save killed while it replaced a committed checkpoint of its step (step_X moved aside,
  // the new one not yet in place): the old one goes back.
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const fs::path back = fs::path(root) / name.substr(0, 13);
    if (name.size() == 22 && name.ends_with(".replaced") && is_step_dir(back) && !fs::exists(back) &&
        fs::exists(e.path() / kCommitMarker)) {
      fs::rename(e.path(), back, ec);
      log::warn("checkpoint: restored ", back.string(), ", which a save killed while it replaced it had moved aside");
    }
  }
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 &&
        (name.ends_with(".partial") || name.ends_with(".replaced") || name.ends_with(".pruned"))) {
      fs::remove_all(e.path(), ec);
      log::info("checkpoint: removed ", e.path().string(), ", left by a save that did not finish");
    }
  }
}

int64_t verify(const std::string& dir) {
  const nlohmann::json meta = read_meta(dir);
  int64_t pieces = 0;
  try {
    for (const auto& t : meta.at("tensors")) {
      const std::string name = t.at("name").get<std::string>();
      int p = 0;
      for (const auto& piece : t.at("pieces")) {
        const std::string file = piece.at("file").get<std::string>();
        const std::string where = cat("checkpoint ", (fs::path(dir) / file).string(), ": piece ", p++, " of tensor ",
                                      name, " (bytes at ", piece.at("byte_offset").get<int64_t>(), ")");
        int64_t n = 1;
        for (int64_t d : piece.at("shape").get<std::vector<int64_t>>()) n *= d;
        std::vector<float> buf(n);
        if (!fs::exists(fs::path(dir) / file)) throw Corrupt(cat(where, ": the file is missing"));
        try {
          File((fs::path(dir) / file).string(), O_RDONLY).read_at(buf.data(), n * sizeof(float),
                                                                 piece.at("byte_offset").get<int64_t>());
        } catch (const Corrupt&) {
          throw Corrupt(cat(where, ": the file ends before it"));
        }
        if (crc32_of(buf.data(), n * sizeof(float)) != piece.at("crc32").get<uint32_t>())
          throw Corrupt(cat(where, ": checksum mismatch: the file is damaged"));
        ++pieces;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Corrupt(cat("checkpoint ", dir, "/meta.json: malformed tensor index (", e.what(), ")"));
  }
  return pieces;
}

void load(const std::string& dir, const nlohmann::json& meta, const std::vector<Shard>& shards) {
  try {
    for (const Shard& want : shards) {
      const nlohmann::json* entry = nullptr;
      for (const auto& t : meta.at("tensors"))
        if (t.at("name") == want.name) entry = &t;
      if (!entry)
        throw_input("checkpoint ", dir, ": has no tensor ", want.name,
                    ": it was saved from a different model");
      auto global = entry->at("global_shape").get<std::vector<int64_t>>();
      if (global != want.global_shape)
        throw_input("checkpoint ", dir, ": tensor ", want.name, " has shape ", shape_str(global),
                    " but the model expects ", shape_str(want.global_shape),
                    ": it was saved from a different model");
      int64_t copied = 0;
      for (const auto& piece : entry->at("pieces")) {
        auto off = piece.at("offset").get<std::vector<int64_t>>();
        auto shape = piece.at("shape").get<std::vector<int64_t>>();
        // Only the pieces that overlap the region are read (and checked): a rank of another
        // layout, or holding one shard of the optimizer state, reads its part, not the tensor.
        bool overlaps = off.size() == want.offset.size();
        for (size_t d = 0; overlaps && d < off.size(); ++d)
          overlaps = std::max(off[d], want.offset[d]) < std::min(off[d] + shape[d], want.offset[d] + want.shape[d]);
        if (!overlaps) continue;
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        std::vector<float> buf(n);
        const std::string file = (fs::path(dir) / piece.at("file").get<std::string>()).string();
        if (!fs::exists(file))
          throw Corrupt(cat("checkpoint ", dir, ": ", piece.at("file").get<std::string>(),
                            " is missing (tensor ", want.name, "): the checkpoint is incomplete; "
                            "use an earlier checkpoint"));
        File(file, O_RDONLY).read_at(buf.data(), n * sizeof(float), piece.at("byte_offset").get<int64_t>());
        if (crc32_of(buf.data(), n * sizeof(float)) != piece.at("crc32").get<uint32_t>())
          throw Corrupt(cat("checkpoint ", file, ": checksum mismatch in tensor ", want.name,
                            ": the file is corrupt; use an earlier checkpoint"));
        copy_overlap(buf.data(), off, shape, want.data, want.offset, want.shape, copied);
      }
      if (copied != want.numel())
        throw_input("checkpoint ", dir, ": tensor ", want.name, " does not cover the region ",
                    shape_str(want.offset), "+", shape_str(want.shape));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Corrupt(cat("checkpoint ", dir, "/meta.json: malformed tensor index (", e.what(), ")"));
  }
}

void prune(const std::string& root, int64_t keep_last, int64_t keep_every, const std::string& id,
           int64_t committed_step) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  std::vector<fs::path> done;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    // This start's partial directories may be a save under way (the other ranks may write the
    // next one as rank 0 commits this one), unless their step is not past the one committed (a
    // failed save's, which a slower rank wrote into after rank 0 removed it); the others are
    // leftovers of failed saves.
    const bool ours = name.ends_with(cat(".", id, ".partial")) && name.size() > 13 &&
                      std::strtoll(name.c_str() + 5, nullptr, 10) > committed_step;
    if ((name.ends_with(".partial") && !ours) || name.ends_with(".replaced") || name.ends_with(".pruned")) {
      fs::remove_all(e.path(), ec);
    } else if (committed(e.path())) {
      done.push_back(e.path());
    }
  }
  if (keep_last <= 0) return;
  std::sort(done.begin(), done.end());
  for (size_t i = 0; i + keep_last < done.size(); ++i) {
    const int64_t step = std::stoll(done[i].filename().string().substr(5));
    if (keep_every > 0 && step % keep_every == 0) continue;
    // Never from under a reader (ReadHold): a later prune takes it.
    const int held = lock_commit_marker(done[i], true);
    if (held < 0) {
      if (fs::exists(done[i] / kCommitMarker))
        log::info("checkpoint: kept ", done[i].string(), " for now: a reader holds it (export, sample, verify, a "
                  "resume); a later save prunes it");
      continue;
    }
    // Out of the step_<8 digits> names first: a removal cut short (the process killed) must not
    // leave a committed-looking checkpoint with files missing.
    const fs::path doomed = done[i].string() + ".pruned";
    fs::rename(done[i], doomed, ec);
    fs::remove_all(ec ? done[i] : doomed, ec);
    ::close(held);
    log::info("checkpoint: removed ", done[i].string(), " (checkpoint.keep_last = ", keep_last, ")");
  }
}

}  // namespace myriad::checkpoint
