#include "checkpoint/hf.h"

#include "checkpoint/state.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_llama.h"
#include "model/params.h"
#include "core/config.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;

namespace myriad::checkpoint {
namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// (rows, cols) -> (cols, rows)
HostTensor transposed(const HostTensor& t) {
  const int64_t R = t.shape[0], C = t.shape[1];
  HostTensor out{{C, R}, std::vector<float>(t.data.size())};
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out.data[c * R + r] = t.data[r * C + c];
  return out;
}

// The position in GPT-2's c_attn output (q/k/v, head, dim) of Myriad's fused QKV row (head,
// q/k/v, dim).
int64_t gpt2_qkv_index(int64_t myriad_row, int64_t heads, int64_t head_dim) {
  const int64_t h = myriad_row / (3 * head_dim), j = myriad_row / head_dim % 3, d = myriad_row % head_dim;
  return j * heads * head_dim + h * head_dim + d;
}

// The GPT-2 tensors of a model: name -> (its Myriad tensor, shape in GPT-2).
struct Names {
  std::string gpt2, myriad;
  enum Kind { kCopy, kLinear, kQkvWeight, kQkvBias } kind;
};
std::vector<Names> gpt2_names(const ModelConfig& m) {
  std::vector<Names> out = {{"wte.weight", "wte", Names::kCopy}, {"wpe.weight", "wpe", Names::kCopy}};
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string g = cat("h.", l, "."), y = cat("h.", l, ".");
    for (const auto& [a, b] : {std::pair<const char*, const char*>{"ln_1", "ln1"}, {"ln_2", "ln2"}}) {
      out.push_back({g + a + ".weight", y + b + ".w", Names::kCopy});
      out.push_back({g + a + ".bias", y + b + ".b", Names::kCopy});
    }
    out.push_back({g + "attn.c_attn.weight", y + "attn.qkv.w", Names::kQkvWeight});
    out.push_back({g + "attn.c_attn.bias", y + "attn.qkv.b", Names::kQkvBias});
    for (const auto& [a, b] : {std::pair<const char*, const char*>{"attn.c_proj", "attn.proj"}, {"mlp.c_fc", "mlp.fc"},
                               {"mlp.c_proj", "mlp.proj"}}) {
      out.push_back({g + a + ".weight", y + b + ".w", Names::kLinear});
      out.push_back({g + a + ".bias", y + b + ".b", Names::kCopy});
    }
  }
  out.push_back({"ln_f.weight", "lnf.w", Names::kCopy});
  out.push_back({"ln_f.bias", "lnf.b", Names::kCopy});
  return out;
}

// Myriad's global shape of each stored model tensor (wte unpadded: the checkpoint's).
std::map<std::string, std::vector<int64_t>> myriad_shapes(const ModelConfig& m, int64_t positions) {
  const int64_t C = m.d_model;
  std::map<std::string, std::vector<int64_t>> s = {{"wte", {m.vocab_size, C}}, {"wpe", {positions, C}},
                                                   {"lnf.w", {C}}, {"lnf.b", {C}}};
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string y = cat("h.", l, ".");
    for (const char* n : {"ln1.w", "ln1.b", "ln2.w", "ln2.b", "attn.proj.b", "mlp.proj.b"}) s[y + n] = {C};
    s[y + "attn.qkv.w"] = {3 * C, C}, s[y + "attn.qkv.b"] = {3 * C};
    s[y + "attn.proj.w"] = {C, C};
    s[y + "mlp.fc.w"] = {4 * C, C}, s[y + "mlp.fc.b"] = {4 * C};
    s[y + "mlp.proj.w"] = {C, 4 * C};
  }
  return s;
}

// Myriad -> GPT-2 (`to_gpt2`) or back, one tensor.
HostTensor convert(const Names& n, const HostTensor& t, const ModelConfig& m, bool to_gpt2) {
  const int64_t H = m.heads, D = m.d_model / m.heads, C = m.d_model;
  switch (n.kind) {
    case Names::kCopy:
      return t;
    case Names::kLinear:
      return transposed(t);
    case Names::kQkvBias: {
      HostTensor out{t.shape, std::vector<float>(t.data.size())};
      for (int64_t r = 0; r < 3 * C; ++r) {
        const int64_t g = gpt2_qkv_index(r, H, D);
        if (to_gpt2) out.data[g] = t.data[r];
        else out.data[r] = t.data[g];
      }
      return out;
    }
    case Names::kQkvWeight: {
      if (!to_gpt2) {  // (C, 3C) GPT-2 -> (3C, C): columns back to rows
        const HostTensor rows = transposed(t);
        HostTensor out{rows.shape, std::vector<float>(rows.data.size())};
        for (int64_t r = 0; r < 3 * C; ++r)
          std::memcpy(&out.data[r * C], &rows.data[gpt2_qkv_index(r, H, D) * C], C * sizeof(float));
        return out;
      }
      HostTensor rows{t.shape, std::vector<float>(t.data.size())};
      for (int64_t r = 0; r < 3 * C; ++r)
        std::memcpy(&rows.data[gpt2_qkv_index(r, H, D) * C], &t.data[r * C], C * sizeof(float));
      return transposed(rows);
    }
  }
  return t;
}

// `pieces`, one after another, as the file `path`, on the disk before it returns: export renames
// the folder into place next, and a rename that reached the disk before the data would leave
// empty files after a crash. A failure says why (a full disk is the usual one).
void write_pieces(const fs::path& path, const std::vector<std::string_view>& pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_runtime("cannot write ", path.string(), ": ", std::strerror(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    throw_runtime("cannot ", what, " ", path.string(), ": ", std::strerror(err));
  };
  for (std::string_view p : pieces)
    while (!p.empty()) {
      const ssize_t n = ::write(fd, p.data(), p.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("write");
      p.remove_prefix(static_cast<size_t>(n));
    }
  if (::fsync(fd) != 0) fail("write");
  if (::close(fd) != 0) throw_runtime("cannot write ", path.string(), ": ", std::strerror(errno));
}

void write_text(const fs::path& p, const std::string& text) { write_pieces(p, {text}); }

void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw_runtime("cannot sync ", dir.string(), ": ", std::strerror(err));
  }
  ::close(fd);
}

// The path a command will write for a path the user gave: absolute, `..` resolved as the
// writes will resolve it, no trailing slash ("nonexist/../victim" is victim).
fs::path normalized(const std::string& p) {
  fs::path n = fs::absolute(p).lexically_normal();
  if (n.filename().empty() && n != n.root_path()) n = n.parent_path();
  return n;
}

// Whether `inner` is `outer` or lies inside it.
bool within(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

// Errors of creating or renaming a path that are the path's, not the machine's: another path
// works (exit 2), a retry would not. A full disk or an I/O error is a runtime fault.
bool path_fault(int err) {
  return err == EROFS || err == EACCES || err == EPERM || err == ENOTDIR || err == ENOENT || err == ENAMETOOLONG ||
         err == ELOOP || err == EEXIST || err == ENOTEMPTY || err == EXDEV;
}

// The index of a sharded model (transformers' name).
constexpr const char* kIndex = "model.safetensors.index.json";

// The export's manifest: the files it wrote, which the next export into the folder may replace.
constexpr const char* kManifest = "myriad_export.json";
constexpr const char* kManifestFormat = "myriad-hf-export";
// The folder inside OUT where an export that cannot replace OUT whole stages its files.
constexpr std::string_view kStaging = ".myriad-tmp-";

// The files the manifest in `out` lists; nullopt when there is no manifest or it is not an
// export's. Only plain names are taken: a name with a slash would reach outside the folder when
// the next export removes the files it does not write.
std::optional<std::set<std::string>> manifest_files(const fs::path& out) {
  const nlohmann::json m = nlohmann::json::parse(read_file((out / kManifest).string()), nullptr, false);
  if (!(m.is_object() && m.contains("format") && m["format"] == kManifestFormat && m.contains("files") &&
        m["files"].is_array()))
    return std::nullopt;
  std::set<std::string> listed;
  for (const auto& f : m["files"])
    if (f.is_string()) {
      const std::string name = f.get<std::string>();
      if (!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos) listed.insert(name);
    }
  return listed;
}

// The first entry of the folder `out` that no export wrote, by the manifest there; "" when
// every entry is an earlier export's (or there are none), so the folder may be replaced. A
// staging folder (.myriad-tmp-PID) is an export's: one that was interrupted left it.
std::string foreign_entry(const fs::path& out) {
  const std::optional<std::set<std::string>> listed = manifest_files(out);
  const bool ours = listed.has_value();
  std::error_code ec;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const fs::file_type type = it->symlink_status(ec).type();
    if (type == fs::file_type::directory && name.starts_with(kStaging)) continue;
    if (!(ours && type == fs::file_type::regular && (name == kManifest || listed->count(name)))) return name;
  }
  if (ec) throw_input("export: cannot read the folder ", out.string(), " (", ec.message(), "): choose another --output");
  return "";
}

// A new folder `base`<pid>, `made`, that this process made: it alone writes there, and may
// remove it. 0, or the errno of why it cannot be made.
int make_own_dir(const std::string& base, fs::path& made) {
  for (int i = 0;; ++i) {
    made = base + cat(::getpid(), i ? cat("-", i) : std::string());
    if (::mkdir(made.c_str(), 0755) == 0) return 0;
    if (errno == EEXIST && i < 100) continue;  // a killed export's, of a process with this pid
    return errno;
  }
}

// A new folder beside `p`, P.tmp-<pid>. Where `p` exists, "" when none can be made there (a
// parent this user cannot write, a read-only one above a mounted OUT): the export is then
// written inside `p`.
fs::path make_sibling_dir(const fs::path& p, bool existed) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  if (ec)
    throw_input("export: cannot create ", p.parent_path().string(), " for --output ", p.string(), " (", ec.message(),
                "): choose another --output");
  fs::path t;
  const int err = make_own_dir(p.string() + ".tmp-", t);
  if (err == 0) return t;
  if (existed) {
    log::info("export: cannot create a folder beside ", p.string(), " (", t.string(), ": ", std::strerror(err),
              "): writing into it");
    return {};
  }
  if (path_fault(err))
    throw_input("export: cannot create a folder beside --output ", p.string(), " (", t.string(), ": ",
                std::strerror(err), "): choose another --output");
  throw_runtime("export: cannot create ", t.string(), ": ", std::strerror(err));
}

// How put_in_place ended, and what a failure left.
struct Placing {
  bool cannot_swap = false;  // OUT cannot be replaced whole (a mount point, ...): nothing changed
  bool keep_tmp = false;     // tmp holds the earlier folder: never remove it
  bool out_intact = true;    // OUT is as it was before the export, on a failure
};

// The finished export `tmp` in the place of `out`. An earlier export there stays whole until the
// one rename that swaps the two folders (RENAME_EXCHANGE), and is removed only then; where the
// filesystem cannot swap, two renames, with the earlier export moved back if the second fails.
// With `recheck`, a file added to `out` while the export was written puts it back as it was.
void put_in_place(const fs::path& tmp, const fs::path& out, bool existed, bool recheck, Placing& s) {
  auto fail = [&](int err) {
    if (err == EEXIST || err == ENOTEMPTY)
      throw_input("export: ", out.string(), " appeared while the export was written; it is left as it is: run the "
                  "export again");
    if (path_fault(err)) throw_input("export: cannot rename ", tmp.string(), " to ", out.string(), ": ", std::strerror(err));
    throw_runtime("export: cannot rename ", tmp.string(), " to ", out.string(), ": ", std::strerror(err));
  };
  // What keeps the earlier folder `earlier` from being removed: a file no export wrote, or a
  // folder that cannot be read. It never throws, so that the earlier folder is put back first.
  std::string refusal;
  auto changed = [&](const fs::path& earlier) {
    if (!recheck) return false;
    try {
      if (const std::string f = foreign_entry(earlier); !f.empty())
        refusal = cat("export: ", f, " appeared in ", out.string(), " while the export was written; it is left as it "
                      "is: run the export again");
    } catch (const Error& e) {
      refusal = e.what();
    }
    return !refusal.empty();
  };
  // Whether a swap may still be had by writing inside OUT: the errors of a mount point, a
  // filesystem boundary, or a parent whose sticky bit or permissions forbid the rename.
  auto unswappable = [](int err) { return err == EXDEV || err == EBUSY || err == EACCES || err == EPERM; };
  fs::path earlier;  // where the earlier export is once the new one is in place
  if (!existed) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) != 0) {
      if (errno != EINVAL && errno != ENOSYS) fail(errno);
      std::error_code ec;
      if (fs::exists(fs::symlink_status(out, ec))) fail(EEXIST);
      if (::rename(tmp.c_str(), out.c_str()) != 0) fail(errno);
    }
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0) {
    earlier = tmp;
    s.keep_tmp = true;  // until it is known that the earlier folder may go
    if (changed(earlier)) {
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) != 0) {
        const int err = errno;
        s.out_intact = false;
        const fs::path kept = tmp.string() + ".kept";  // out of the way of the failed export's removal
        const fs::path at = ::rename(tmp.c_str(), kept.c_str()) == 0 ? kept : tmp;
        s.keep_tmp = at == tmp;
        throw_runtime(refusal, "; ", out.string(), " holds the new export and cannot be put back (", std::strerror(err),
                      "): the earlier folder is ", at.string());
      }
      s.keep_tmp = false;
      throw_input(refusal);
    }
    s.keep_tmp = false;
  } else {
    const int err = errno;
    if (unswappable(err)) return void(s.cannot_swap = true);
    if (err != EINVAL && err != ENOSYS) fail(err);
    earlier = tmp.string() + ".old";
    if (::rename(out.c_str(), earlier.c_str()) != 0) {
      if (unswappable(errno)) return void(s.cannot_swap = true);
      fail(errno);
    }
    const bool appeared = changed(earlier);
    if (appeared || ::rename(tmp.c_str(), out.c_str()) != 0) {
      const int err2 = errno;
      if (::rename(earlier.c_str(), out.c_str()) != 0) {
        s.out_intact = false;
        throw_runtime("export: cannot put ", out.string(), " back (", std::strerror(errno), "): the earlier folder is ",
                      earlier.string());
      }
      if (appeared) throw_input(refusal);
      fail(err2);
    }
  }
  if (!earlier.empty()) {
    std::error_code ec;
    fs::remove_all(earlier, ec);
    if (ec) log::warn("export: cannot remove the earlier export at ", earlier.string(), ": ", ec.message());
  }
}

// The export written inside the folder `out` itself, for when it cannot be replaced whole (a
// mount point, a parent this user cannot write): staged in OUT/.myriad-tmp-PID, on the disk,
// then each file renamed over its namesake. Not atomic, so the manifest first lists the earlier
// export's files and the new ones together, and only the new ones once the earlier ones this
// export did not write are gone: a crash leaves a folder the next export recognises as its own.
void export_in_place(const fs::path& out, const std::function<std::vector<std::string>(const fs::path&)>& write_files,
                     const std::function<std::string(const std::vector<std::string>&)>& manifest, bool recheck) {
  fs::path staging;
  if (const int err = make_own_dir((out / kStaging).string(), staging); err != 0) {
    if (path_fault(err))
      throw_input("export: cannot write into --output ", out.string(), " (", staging.string(), ": ", std::strerror(err),
                  "): choose another --output");
    throw_runtime("export: cannot create ", staging.string(), ": ", std::strerror(err));
  }
  bool touched = false;  // whether OUT itself has changed
  auto move_in = [&](const std::string& name) {
    const fs::path from = staging / name, to = out / name;
    if (::rename(from.c_str(), to.c_str()) != 0)
      throw_runtime("export: cannot rename ", from.string(), " to ", to.string(), ": ", std::strerror(errno));
    touched = true;
  };
  std::error_code ec;
  try {
    const std::vector<std::string> files = write_files(staging);
    sync_dir(staging);
    if (recheck)
      if (const std::string f = foreign_entry(out); !f.empty())
        throw_input("export: ", f, " appeared in ", out.string(), " while the export was written; it is left as it is: "
                    "run the export again");
    const std::set<std::string> earlier = manifest_files(out).value_or(std::set<std::string>());
    std::set<std::string> both(earlier);
    both.insert(files.begin(), files.end());
    write_text(staging / kManifest, manifest({both.begin(), both.end()}));
    move_in(kManifest);
    for (const std::string& f : files) move_in(f);
    for (const std::string& f : earlier)
      if (!std::count(files.begin(), files.end(), f) && f != kManifest &&
          fs::symlink_status(out / f, ec).type() == fs::file_type::regular && ::unlink((out / f).c_str()) != 0 &&
          errno != ENOENT)
        throw_runtime("export: cannot remove the earlier export's ", (out / f).string(), ": ", std::strerror(errno));
    sync_dir(out);
    write_text(staging / kManifest, manifest(files));
    move_in(kManifest);
    sync_dir(out);
  } catch (const Error& e) {
    fs::remove_all(staging, ec);
    if (e.cls() != ErrorClass::kRuntime) throw;
    throw_runtime(e.what(), touched ? cat("; ", out.string(), " holds part of this export, which the next export "
                                          "replaces: run it again")
                                    : cat("; ", out.string(), " is left as it was"));
  }
  fs::remove_all(staging, ec);
  // Staging folders of exports that were killed (each a model's size), whose process is gone.
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const long pid = name.starts_with(kStaging) ? std::atol(name.c_str() + kStaging.size()) : 0;
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) stale.push_back(it->path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

// Bytes of one element of a dtype Myriad writes or reads (F32; BF16, F16).
int64_t dtype_bytes(const std::string& dtype) { return dtype == "F32" ? 4 : 2; }

// fp32 <-> bfloat16 (its upper half; rounded to nearest even, NaN kept a NaN) and IEEE half.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, biased = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (biased == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf, nan
  } else if (biased != 0) {
    u = sign | ((biased + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalized into fp32's range
    int e = -1;
    uint32_t m = man;
    do ++e, m <<= 1;
    while (!(m & 0x400u));
    u = sign | (uint32_t(112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Released GPT-2 checkpoints store the attention's mask buffers (h.N.attn.bias, in F32, BOOL or
// U8, and h.N.attn.masked_bias): constants Myriad does not load, dropped unread.
bool mask_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

}  // namespace

// The tensors, by name in ascending order (the data order is then fixed), without copying them.
using TensorRefs = std::vector<std::pair<std::string, const HostTensor*>>;
static void write_safetensors(const std::string& path, const TensorRefs& tensors, const std::string& dtype);

void write_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors,
                       const std::string& dtype) {
  TensorRefs refs;
  for (const auto& [name, t] : tensors) refs.emplace_back(name, &t);
  write_safetensors(path, refs, dtype);
}

static void write_safetensors(const std::string& path, const TensorRefs& tensors, const std::string& dtype) {
  MYRIAD_CHECK(dtype == "F32" || dtype == "BF16", "safetensors dtype ", dtype);
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};  // transformers asks for "pt"
  int64_t at = 0;
  for (const auto& [name, tp] : tensors) {
    const HostTensor& t = *tp;
    const int64_t bytes = static_cast<int64_t>(t.data.size()) * dtype_bytes(dtype);
    header[name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();  // nlohmann's objects are sorted by key
  text.append((8 - text.size() % 8) % 8, ' ');  // the data 8-byte aligned, as the format advises
  uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(n >> (8 * i));
  std::vector<std::string_view> pieces = {{len, 8}, text};
  std::vector<std::vector<uint16_t>> narrowed;  // BF16: each tensor rounded, to nearest even
  narrowed.reserve(tensors.size());
  for (const auto& [name, tp] : tensors) {
    const HostTensor& t = *tp;
    if (dtype == "F32") {
      pieces.emplace_back(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float));
      continue;
    }
    std::vector<uint16_t>& b = narrowed.emplace_back(t.data.size());
    for (size_t i = 0; i < t.data.size(); ++i) b[i] = to_bf16(t.data[i]);
    pieces.emplace_back(reinterpret_cast<const char*>(b.data()), b.size() * sizeof(uint16_t));
  }
  write_pieces(path, pieces);
}

std::map<std::string, HostTensor> read_safetensors(const std::string& path,
                                                   const std::function<bool(const std::string&)>& skip) {
  std::error_code ec;
  if (const auto st = fs::status(path, ec); fs::exists(st) && !fs::is_regular_file(st))
    throw_input("import: ", path, " is not a file", fs::is_directory(st) ? " (it is a directory)" : "",
                ": give the model's safetensors file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input("import: cannot open ", path);
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  in.seekg(0);
  unsigned char len[8] = {};
  if (size < 8 || !in.read(reinterpret_cast<char*>(len), 8))
    throw_input("import: ", path, ": truncated header (", size, " bytes): not a safetensors file");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len[i];
  if (n > uint64_t(size - 8) || n > (100u << 20))
    throw_input("import: ", path, ": truncated header (it says ", n, " bytes, the file has ", size - 8,
                " after the length): not a whole safetensors file");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  const nlohmann::json header = nlohmann::json::parse(text, nullptr, false);
  if (!header.is_object()) throw_input("import: ", path, ": the header is not a JSON object: not a safetensors file");
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  const uint64_t data_bytes = static_cast<uint64_t>(size - data_start);
  // As the reference library requires: the tensors' bytes tile the data section exactly, with no
  // overlap, no gap and nothing after the last (a file that breaks this is damaged or crafted,
  // and other readers refuse it). Every entry counts, those skipped included.
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__" || !e.is_object() || !e.contains("data_offsets")) continue;
    const nlohmann::json& o = e["data_offsets"];
    if (o.is_array() && o.size() == 2 && o[0].is_number_unsigned() && o[1].is_number_unsigned())
      spans.emplace_back(o[0].get<uint64_t>(), o[1].get<uint64_t>());
  }
  // Each entry read is checked first, then the whole (its message names the entry), then read.
  struct Planned {
    std::string name, dtype;
    HostTensor t;
    uint64_t begin, end;
  };
  std::vector<Planned> planned;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__" || (skip && skip(name))) continue;
    const std::string where = cat("import: ", path, ": tensor ", name);
    if (!e.is_object()) throw_input(where, "'s header entry is not a JSON object");
    auto field = [&](const char* key) { return e.contains(key) ? e[key].dump() : std::string("(none)"); };
    if (!e.contains("dtype") || !e["dtype"].is_string())
      throw_input(where, ": dtype ", field("dtype"), " is not a dtype name such as \"F32\": not a safetensors file");
    const std::string dtype = e["dtype"];
    if (dtype != "F32" && dtype != "BF16" && dtype != "F16")
      throw_input(where, " has dtype ", dtype, "; F32, BF16 and F16 are read: convert the model to one of them first");
    const uint64_t esize = static_cast<uint64_t>(dtype_bytes(dtype));
    // Sizes are checked against the file before anything is allocated: a crafted shape would
    // otherwise overflow the element count or ask for exabytes.
    const nlohmann::json& shape = e.contains("shape") ? e["shape"] : nlohmann::json();
    if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), [](const auto& d) { return d.is_number_unsigned(); }))
      throw_input(where, ": shape ", field("shape"), " is not a list of sizes >= 0: not a safetensors file");
    HostTensor t;
    uint64_t elements = 1;
    for (const auto& d : shape) {
      const uint64_t v = d.get<uint64_t>();
      elements = v == 0 || elements == 0 ? 0 : elements > data_bytes / esize / v ? data_bytes / esize + 1 : elements * v;
      t.shape.push_back(v > uint64_t(std::numeric_limits<int64_t>::max()) ? -1 : static_cast<int64_t>(v));
    }
    if (elements > data_bytes / esize)
      throw_input(where, ": shape ", shape.dump(), " holds more elements than the file holds bytes: not a whole "
                  "safetensors file");
    const nlohmann::json& off = e.contains("data_offsets") ? e["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw_input(where, ": data_offsets ", field("data_offsets"), " is not two integers [begin, end] (bytes after "
                  "the header): not a safetensors file");
    const uint64_t begin = off[0], end = off[1];
    if (begin > end || end - begin != elements * esize || end > data_bytes)
      throw_input(where, " (shape ", shape_str(t.shape), ") has data_offsets [", begin, ", ", end,
                  "] that do not fit its shape or the file");
    t.data.resize(static_cast<size_t>(elements));
    planned.push_back({name, dtype, std::move(t), begin, end});
  }
  std::sort(spans.begin(), spans.end());
  uint64_t covered = 0;
  for (const auto& [b, e] : spans) {
    if (b != covered)
      throw_input("import: ", path, ": the tensors' data_offsets ", b < covered ? "overlap" : "leave a gap", " at byte ",
                  std::min(b, covered), " of the data: not a valid safetensors file");
    covered = std::max(covered, e);
  }
  if (covered < data_bytes)
    throw_input("import: ", path, ": ", data_bytes - covered, " bytes follow the last tensor's data: not a valid "
                "safetensors file (it may be damaged, or two files joined)");
  std::map<std::string, HostTensor> out;
  for (Planned& p : planned) {
    in.seekg(data_start + static_cast<int64_t>(p.begin));
    if (p.dtype == "F32") {
      in.read(reinterpret_cast<char*>(p.t.data.data()), static_cast<std::streamsize>(p.end - p.begin));
    } else {  // widened to fp32, exactly
      std::vector<uint16_t> half(p.t.data.size());
      in.read(reinterpret_cast<char*>(half.data()), static_cast<std::streamsize>(p.end - p.begin));
      for (size_t i = 0; i < half.size(); ++i) p.t.data[i] = p.dtype == "BF16" ? from_bf16(half[i]) : from_f16(half[i]);
    }
    if (!in) throw_runtime("import: cannot read ", path, ": ", std::strerror(errno));
    out[p.name] = std::move(p.t);
  }
  return out;
}

// The weights as model.safetensors, or, when they hold more than max_shard_bytes, as shards
// model-0000i-of-0000n.safetensors (tensors in name order, each shard filled up to the limit, a
// larger tensor alone in one) with model.safetensors.index.json mapping each tensor to its
// shard, as transformers writes them. The files' names.
static std::vector<std::string> write_model(const fs::path& into, const std::map<std::string, HostTensor>& tensors,
                                            const std::string& dtype, int64_t max_shard_bytes) {
  std::vector<TensorRefs> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = static_cast<int64_t>(t.data.size()) * dtype_bytes(dtype);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().emplace_back(name, &t);
    in_shard += bytes, total += bytes;
  }
  if (shards.size() == 1) {
    write_safetensors((into / "model.safetensors").string(), shards[0], dtype);
    return {"model.safetensors"};
  }
  std::vector<std::string> files;
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors((into / name).string(), shards[i], dtype);
    for (const auto& ref : shards[i]) map[ref.first] = name;
    files.push_back(name);
  }
  write_text(into / kIndex, nlohmann::json({{"metadata", {{"total_size", total}}}, {"weight_map", map}}).dump(2) + "\n");
  files.push_back(kIndex);
  return files;
}

nlohmann::json hf_special_tokens(const std::string& tokenizer) {
  if (tokenizer == "gpt2") return {{"bos_token_id", 50256}, {"eos_token_id", 50256}};
  if (tokenizer == "llama3") return {{"bos_token_id", 128000}, {"eos_token_id", 128001}};
  return {{"bos_token_id", nullptr}, {"eos_token_id", nullptr}};
}

// The files transformers' AutoTokenizer reads for `tokenizer`, into `into`, whatever the model's
// family (a GPT-2 layout may train on Llama 3's ids): their names. The byte tokenizer has none.
static std::vector<std::string> write_tokenizer(const fs::path& into, const std::string& tokenizer, int64_t max_length) {
  if (tokenizer == "llama3") {  // transformers' fast tokenizer reads tokenizer.json: the one Myriad encodes with
    const fs::path src = fs::path(data::llama3_dir()) / "tokenizer.json";
    const std::string bytes = read_file(src.string());
    if (bytes.empty()) throw_input("export: ", src.string(), " is missing: run scripts/setup.sh");
    write_text(into / "tokenizer.json", bytes);
    write_text(into / "tokenizer_config.json",
               nlohmann::json({{"tokenizer_class", "PreTrainedTokenizerFast"},
                               {"bos_token", "<|begin_of_text|>"},
                               {"eos_token", "<|end_of_text|>"},
                               {"model_max_length", max_length}})
                       .dump(2) +
                   "\n");
    return {"tokenizer.json", "tokenizer_config.json"};
  }
  if (tokenizer == "gpt2") {  // transformers' GPT2Tokenizer reads vocab.json and merges.txt: the same BPE files
    const fs::path src = data::gpt2_dir();
    for (const auto& [from, to] : {std::pair<const char*, const char*>{"encoder.json", "vocab.json"}, {"vocab.bpe", "merges.txt"}}) {
      const std::string bytes = read_file((src / from).string());
      if (bytes.empty()) throw_input("export: ", (src / from).string(), " is missing: run scripts/setup.sh");
      write_text(into / to, bytes);
    }
    write_text(into / "tokenizer_config.json",
               nlohmann::json({{"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", max_length}}).dump(2) + "\n");
    return {"vocab.json", "merges.txt", "tokenizer_config.json"};
  }
  return {};
}

void export_hf(const std::string& dir, const std::string& out_arg, const ExportOptions& opt) {
  const bool overwrite = opt.overwrite;
  const nlohmann::json meta = read_meta(dir);
  const Config cfg = parse_config(config_of(meta, dir), dir + "/meta.json");
  const ModelConfig& m = cfg.model;
  // A Llama-family model (any of the block's Llama keys) as LlamaForCausalLM, else GPT-2.
  const bool as_llama = llama::family(m);
  if (as_llama) {
    if (const std::string why = llama::unfit(m); !why.empty()) {
      // A GPT-2 block with a Llama key (fewer key/value heads, an untied head, another MLP width)
      // fits neither format: named first is what GPT-2 lacks.
      if (!m.rmsnorm() && !m.rope() && !m.swiglu()) {
        const std::string key = m.kv() != m.heads       ? cat("model.kv_heads = ", m.kv())
                                : !m.tied_embeddings    ? std::string("model.tied_embeddings = false")
                                                        : cat("model.mlp_hidden = ", m.ffn());
        throw_input("export: ", dir, " has ", key, ", which GPT-2 cannot express, and ", why, ": neither Hugging "
                    "Face GPT-2 nor LlamaForCausalLM can express it");
      }
      throw_input("export: ", dir, " has ", why, ": a Hugging Face LlamaForCausalLM cannot express it");
    }
  } else {
    if (m.parallel_block)
      throw_input("export: ", dir, " has model.parallel_block = true, which GPT-2 cannot express (its blocks are sequential)");
    if (m.window > 0)
      throw_input("export: ", dir, " has model.window = ", m.window, ", which GPT-2 cannot express (its attention is full causal)");
    if (!m.bias) throw_input("export: ", dir, " has model.bias = false, which GPT-2 cannot express (it has biases)");
  }
  // bf16 for Llama models, as Meta's and Hugging Face's releases are; GPT-2 stays fp32.
  const std::string dtype = opt.dtype.empty() ? (as_llama ? "BF16" : "F32")
                            : opt.dtype == "bf16"  ? "BF16"
                            : opt.dtype == "fp32"  ? "F32"
                                                   : "";
  if (dtype.empty()) throw_input("export: --dtype ", opt.dtype, " is not one of: bf16, fp32");
  if (opt.max_shard_bytes < 1) throw_input("export: --max-shard-size must be at least 1 byte");
  // What is at the output may be replaced only when an earlier export wrote all of it (its
  // manifest), or with --overwrite; never when it holds the checkpoint being read.
  const fs::path out = normalized(out_arg);
  // Resolved, so that a checkpoint reached through a symbolic link into OUT (or an OUT reached
  // through one) is still seen inside it.
  if (within(fs::weakly_canonical(normalized(dir)), fs::weakly_canonical(out)))
    throw_input("export: --output ", out.string(), " holds the checkpoint ", dir, ": choose another folder");
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(out, ec);
  const bool existed = fs::exists(st);
  if (fs::is_symlink(st))
    throw_input("export: --output ", out.string(), " is a symbolic link: give the folder it points to, or a new one");
  if (existed && !fs::is_directory(st)) throw_input("export: --output ", out.string(), " is not a directory: give a folder");
  if (existed && !overwrite)
    if (const std::string f = foreign_entry(out); !f.empty())
      throw_input("export: --output ", out.string(), " holds ", f, ", which no export wrote (", kManifest,
                  " lists an export's files): give a new or empty folder, or add --overwrite to replace the folder with this export");
  std::map<std::string, HostTensor> tensors;
  if (as_llama) {  // every stored tensor of the layout, whole
    std::map<std::string, HostTensor> own;
    const ParamLayout layout(cfg);
    for (const ParamSpec& p : layout.tensors()) {
      const ParamLayout::Stored st = layout.stored(p);
      HostTensor& t = own[p.name];
      t.shape = st.global_shape;
      t.data.resize(static_cast<size_t>(numel(t.shape)));
      load(dir, meta, {{param_name(p.name), t.shape, std::vector<int64_t>(t.shape.size(), 0), t.shape, t.data.data()}});
    }
    tensors = llama::to_hf(std::move(own), m);
  } else {
    const auto shapes = myriad_shapes(m, cfg.positions());
    for (const Names& n : gpt2_names(m)) {
      HostTensor t{shapes.at(n.myriad), {}};
      t.data.resize(static_cast<size_t>(numel(t.shape)));
      load(dir, meta, {{param_name(n.myriad), t.shape, std::vector<int64_t>(t.shape.size(), 0), t.shape, t.data.data()}});
      tensors[n.gpt2] = convert(n, t, m, /*to_gpt2=*/true);
    }
  }
  // The export's files (not the manifest) into the folder `into`, each on the disk: their names.
  auto write_files = [&](const fs::path& into) {
    std::vector<std::string> files = write_model(into, tensors, dtype, opt.max_shard_bytes);
    for (const std::string& f : write_tokenizer(into, cfg.data.tokenizer, cfg.positions())) files.push_back(f);
    if (as_llama) {
      write_text(into / "config.json",
                 llama::hf_config(cfg, dtype == "BF16" ? "bfloat16" : "float32", meta.value("step", 0)).dump(2) + "\n");
      files.push_back("config.json");
      std::sort(files.begin(), files.end());
      return files;
    }
    nlohmann::json config = {{"architectures", {"GPT2LMHeadModel"}},
                             {"model_type", "gpt2"},
                             {"vocab_size", m.vocab_size},
                             {"n_positions", cfg.positions()},
                             {"n_ctx", cfg.positions()},
                             {"n_embd", m.d_model},
                             {"n_layer", m.layers},
                             {"n_head", m.heads},
                             {"n_inner", nullptr},
                             {"activation_function", "gelu_new"},  // the tanh approximation, as Myriad's
                             {"layer_norm_epsilon", 1e-5},
                             {"initializer_range", m.init_std},
                             {"resid_pdrop", 0.0},
                             {"embd_pdrop", 0.0},
                             {"attn_pdrop", 0.0},
                             {"scale_attn_weights", true},
                             {"tie_word_embeddings", true},
                             {"bos_token_id", hf_special_tokens(cfg.data.tokenizer)["bos_token_id"]},
                             {"eos_token_id", hf_special_tokens(cfg.data.tokenizer)["eos_token_id"]},
                             {"myriad", {{"tokenizer", cfg.data.tokenizer}, {"step", meta.value("step", 0)}}}};
    write_text(into / "config.json", config.dump(2) + "\n");
    files.push_back("config.json");
    std::sort(files.begin(), files.end());
    return files;
  };
  auto manifest = [&](const std::vector<std::string>& files) {
    return nlohmann::json({{"format", kManifestFormat},
                           {"version", 1},
                           {"checkpoint", normalized(dir).string()},
                           {"step", meta.value("step", 0)},
                           {"files", files}})
               .dump(2) +
           "\n";
  };
  // The inner errors mostly say "export: " already; the others (a write's) get it here.
  auto said = [](const Error& e) {
    const std::string what = e.what();
    return what.starts_with("export: ") ? what : "export: " + what;
  };
  // Written beside the output and renamed into place whole: a failure (a full disk) leaves an
  // earlier export as it was, and the folder never mixes two exports' files. Where OUT cannot be
  // replaced whole (a mount point, a parent this user cannot write), written inside it instead.
  const fs::path tmp = make_sibling_dir(out, existed);
  bool in_place = tmp.empty();
  if (!in_place) {
    Placing placing;
    try {
      write_text(tmp / kManifest, manifest(write_files(tmp)));
      sync_dir(tmp);
      put_in_place(tmp, out, existed, /*recheck=*/!overwrite, placing);
    } catch (const Error& e) {
      if (!placing.keep_tmp) fs::remove_all(tmp, ec);
      if (e.cls() != ErrorClass::kRuntime) throw;
      throw_runtime(said(e), existed && placing.out_intact ? cat("; ", out.string(), " is left as it was") : std::string());
    } catch (...) {
      if (!placing.keep_tmp) fs::remove_all(tmp, ec);
      throw;
    }
    if (placing.cannot_swap) {
      log::info("export: ", out.string(), " cannot be replaced whole (a mount point?): writing into it");
      fs::remove_all(tmp, ec);
      in_place = true;
    } else {
      try {
        sync_dir(out.parent_path());
      } catch (const Error& e) {
        throw_runtime(said(e), "; ", out.string(), " holds the new export, which a crash now may undo");
      }
    }
  }
  if (in_place) {
    try {
      export_in_place(out, write_files, manifest, /*recheck=*/!overwrite);
    } catch (const Error& e) {
      if (e.cls() != ErrorClass::kRuntime) throw;
      throw_runtime(said(e));
    }
  }
  log::info("export: ", dir, " -> ", out.string(), " (", as_llama ? "LlamaForCausalLM" : "GPT-2", ", ", tensors.size(),
            " tensors in ", dtype, ", ", m.layers, " layers, d_model ", m.d_model, ", vocab ", m.vocab_size, ")");
}

// The weights of a model directory: model.safetensors, or the shards model.safetensors.index.json
// maps them to (plain file names in the directory, each tensor in the file its entry names).
static std::map<std::string, HostTensor> read_model_tensors(const std::string& hf_dir,
                                                            const std::function<bool(const std::string&)>& skip = {}) {
  const fs::path index = fs::path(hf_dir) / kIndex, single = fs::path(hf_dir) / "model.safetensors";
  // model.safetensors first, as transformers loads a directory that holds both.
  if (fs::exists(single)) {
    if (fs::exists(index))
      log::warn("import: ", hf_dir, " holds both model.safetensors and ", kIndex, ": reading model.safetensors, as "
                "transformers does (the index and its shards are ignored)");
    return read_safetensors(single.string(), skip);
  }
  if (!fs::exists(index))
    throw_input("import: ", hf_dir, " has neither model.safetensors nor ", kIndex, ": not a Hugging Face model directory");
  const nlohmann::json j = nlohmann::json::parse(read_file(index.string()), nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw_input("import: ", index.string(), ": weight_map is missing or not an object");
  std::map<std::string, std::string> where;  // tensor -> its file
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw_input("import: ", index.string(), ": weight_map.", tensor, " is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      throw_input("import: ", index.string(), ": weight_map.", tensor, " = \"", f, "\" is not a file of the directory");
    where[tensor] = f;
  }
  std::map<std::string, HostTensor> out;
  std::set<std::string> files;
  for (const auto& [tensor, f] : where) files.insert(f);
  for (const std::string& f : files) {
    for (auto& [name, t] : read_safetensors((fs::path(hf_dir) / f).string(), skip)) {
      auto it = where.find(name);
      if (it == where.end() || it->second != f)
        throw_input("import: ", (fs::path(hf_dir) / f).string(), ": tensor ", name, " is not mapped to this file by ", kIndex);
      out[name] = std::move(t);
    }
  }
  for (const auto& [tensor, f] : where)
    if (!out.count(tensor) && !(skip && skip(tensor))) throw_input("import: ", (fs::path(hf_dir) / f).string(), ": tensor ", tensor, " is missing (", kIndex, " maps it there)");
  return out;
}

// A non-finite weight would import and then sample garbage, or stop a run as a numerics fault
// (exit 5, which a supervisor retries): it is the file's fault.
static void refuse_non_finite(const std::map<std::string, HostTensor>& st, const std::string& from) {
  for (const auto& [name, t] : st)
    for (size_t i = 0; i < t.data.size(); ++i)
      if (!std::isfinite(t.data[i]))
        throw_input("import: ", from, ": tensor ", name, " element ", i, " is ",
                    std::isnan(t.data[i]) ? "nan" : t.data[i] > 0 ? "inf" : "-inf",
                    " (a flat index): the model holds non-finite weights; import a sound copy of it");
}

// A model must have an embedding row for every id of its tokenizer, or `sample` and training
// read past the table (`train` refuses such a model; so does an import).
static void refuse_small_vocabulary(const Config& cfg, const std::string& where, const char* vocab_key) {
  const int64_t ids = data::tokenizer_vocab_size(cfg.data.tokenizer);
  if (cfg.model.vocab_size < ids)
    throw_input(where, vocab_key, " = ", cfg.model.vocab_size, " is below the ", cfg.data.tokenizer, " tokenizer's ", ids,
                " ids, which the model's embedding must cover: import a model whose vocabulary covers its tokenizer's");
}

// `model` (Myriad's stored tensors by name) as the committed checkpoint `out` of step 0, with a
// fresh optimizer: zero moments, no step taken.
static void save_imported(const fs::path& out, const Config& cfg, std::map<std::string, HostTensor>& model,
                          const std::string& hf_dir, const char* kind) {
  std::vector<Shard> shards;
  size_t largest = 0;
  for (const auto& [tensor, t] : model) largest = std::max(largest, t.data.size());
  const std::vector<float> zeros(largest, 0.0f);  // every tensor's moments: read, never written
  for (auto& [tensor, t] : model) {
    const std::vector<int64_t> at(t.shape.size(), 0);
    shards.push_back({param_name(tensor), t.shape, at, t.shape, t.data.data()});
    for (int moment : {1, 2})
      shards.push_back({moment_name(moment, tensor), t.shape, at, t.shape, const_cast<float*>(zeros.data())});
  }
  // The state of a run at its step 0: the data at its start, no optimizer step taken.
  Meta meta;
  meta.config = to_toml(cfg), meta.tokenizer = cfg.data.tokenizer;
  meta.data.consumed = 0, meta.data.seed = cfg.train.seed;
  meta.optimizer = {cfg.optim.name, 0};
  meta.rng = {cfg.model.seed, cfg.train.seed};
  meta.imported_from = fs::absolute(hf_dir).lexically_normal().string();
  save_as(out.string(), 0, encode(meta), shards);
  const ModelConfig& m = cfg.model;
  log::info("import: ", hf_dir, " -> ", out.string(), " (", kind, ", ", m.layers, " layers, d_model ", m.d_model,
            ", vocab ", m.vocab_size, ", tokenizer ", cfg.data.tokenizer, ")");
}

void import_hf(const std::string& hf_dir, const std::string& out_arg) {
  // The checkpoint goes to a new directory only (save_as never replaces one): said here, before
  // the model is read, and judged on the path the save will write.
  const fs::path out = normalized(out_arg);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec)))
    throw_input("import: --output ", out_arg, " exists (", out.string(), "): give a new directory; an import never "
                "replaces one");
  const fs::path cfg_path = fs::path(hf_dir) / "config.json";
  // Where the weights are, for messages: model.safetensors, or the index of its shards.
  const fs::path st_path = fs::exists(fs::path(hf_dir) / "model.safetensors") || !fs::exists(fs::path(hf_dir) / kIndex)
                               ? fs::path(hf_dir) / "model.safetensors"
                               : fs::path(hf_dir) / kIndex;
  if (!fs::exists(cfg_path)) throw_input("import: ", cfg_path.string(), " is missing: give a Hugging Face GPT-2 or Llama model directory");
  if (!fs::is_regular_file(cfg_path)) throw_input("import: ", cfg_path.string(), " is not a file: give a Hugging Face GPT-2 or Llama model directory");
  const nlohmann::json hf = nlohmann::json::parse(read_file(cfg_path.string()), nullptr, false);
  if (!hf.is_object()) throw_input("import: ", cfg_path.string(), " is not valid JSON");
  const std::string where = cat("import: ", cfg_path.string(), ": ");
  // Keys of config.json in the JSON type transformers gives them; another type (null included)
  // is the file's error, named, rather than a JSON library's exception.
  auto get = [&](const char* key) -> int64_t {
    if (!hf.contains(key) || !hf[key].is_number_integer())
      throw_input(where, key, " is missing or not an integer", hf.contains(key) ? cat(" (", hf[key].dump(), ")") : "");
    if (hf[key].is_number_unsigned() && hf[key].get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max()))
      throw_input(where, key, " = ", hf[key].dump(), " is past the largest size Myriad takes (2^31 - 1)");
    if (hf[key].get<int64_t>() < 1) throw_input(where, key, " = ", hf[key].dump(), ": it must be a positive integer");
    return hf[key].get<int64_t>();
  };
  auto text = [&](const char* key, const std::string& fallback, const char* example) -> std::string {
    if (!hf.contains(key)) return fallback;
    if (!hf[key].is_string()) throw_input(where, key, " is ", hf[key].dump(), ", not a string such as \"", example, "\"");
    return hf[key].get<std::string>();
  };
  auto flag = [&](const char* key, bool fallback) -> bool {
    if (!hf.contains(key)) return fallback;
    if (!hf[key].is_boolean()) throw_input(where, key, " is ", hf[key].dump(), ", not true or false");
    return hf[key].get<bool>();
  };
  auto number = [&](const char* key, double fallback) -> double {
    if (!hf.contains(key)) return fallback;
    if (!hf[key].is_number()) throw_input(where, key, " is ", hf[key].dump(), ", not a number");
    return hf[key].get<double>();
  };
  const std::string type = text("model_type", "", "gpt2");
  if (type == "llama") {
    Config cfg = llama::from_hf_config(hf, where);
    cfg = parse_config(to_toml(cfg), cfg_path.string());  // the config's own checks
    refuse_small_vocabulary(cfg, where, "vocab_size");
    std::map<std::string, HostTensor> st = read_model_tensors(hf_dir);
    refuse_non_finite(st, hf_dir);
    std::map<std::string, HostTensor> model = llama::from_hf(st, cfg.model, cat("import: ", hf_dir, ": "));
    save_imported(out, cfg, model, hf_dir, "LlamaForCausalLM");
    return;
  }
  if (type != "gpt2") throw_input(where, "model_type is '", type, "': Myriad imports gpt2 and llama");
  if (hf.contains("n_inner") && !hf["n_inner"].is_null() && hf["n_inner"] != 4 * get("n_embd"))
    throw_input(where, "n_inner = ", hf["n_inner"].dump(), "; Myriad's MLP is 4 x n_embd");
  if (const std::string act = text("activation_function", "gelu_new", "gelu_new"); act != "gelu_new")
    throw_input(where, "activation_function = ", act, "; Myriad's GELU is gelu_new (tanh)");
  // Options of transformers' GPT-2 that change its arithmetic away from Myriad's.
  if (flag("scale_attn_weights", true) != true || flag("scale_attn_by_inverse_layer_idx", false) != false)
    throw_input(where, "scale_attn_weights must be true and scale_attn_by_inverse_layer_idx "
                "false: Myriad scales attention by 1/sqrt(head size) only");
  if (const double eps = number("layer_norm_epsilon", 1e-5); std::abs(eps - 1e-5) > 1e-12)
    throw_input(where, "layer_norm_epsilon = ", eps, "; Myriad's LayerNorm uses 1e-5");
  Config cfg;
  cfg.model.layers = get("n_layer"), cfg.model.d_model = get("n_embd"), cfg.model.heads = get("n_head");
  if (cfg.model.d_model % cfg.model.heads != 0)
    throw_input(where, "n_embd = ", cfg.model.d_model, " is not a multiple of n_head = ", cfg.model.heads);
  cfg.model.vocab_size = get("vocab_size");
  cfg.model.positions = cfg.model.seq_len = get("n_positions");
  cfg.data.tokenizer = cfg.model.vocab_size == 256 ? "byte" : "gpt2";
  if (hf.contains("myriad")) {  // what `export` writes: the tokenizer the model was trained with
    const nlohmann::json& own = hf["myriad"];
    if (!own.is_object())
      throw_input(where, "myriad is ", own.dump(), ", not an object: it is the entry `myriad export` writes, "
                  "{\"tokenizer\": \"byte\" or \"gpt2\"}; remove it to take the tokenizer from vocab_size");
    cfg.data.tokenizer = "gpt2";
    if (own.contains("tokenizer")) {
      if (!own["tokenizer"].is_string())
        throw_input(where, "myriad.tokenizer is ", own["tokenizer"].dump(), ", not a string such as \"gpt2\"");
      cfg.data.tokenizer = own["tokenizer"].get<std::string>();
    }
  }
  // The config's own checks (heads divide d_model, ...), through its TOML text.
  cfg = parse_config(to_toml(cfg), cfg_path.string());
  refuse_small_vocabulary(cfg, where, "vocab_size");
  const ModelConfig& m = cfg.model;
  std::map<std::string, HostTensor> st = read_model_tensors(hf_dir, mask_buffer);
  refuse_non_finite(st, st_path.string());
  // Some released checkpoints carry a copy of the tied head.
  std::map<std::string, HostTensor> byname;
  for (auto& [name, t] : st) byname[name.rfind("transformer.", 0) == 0 ? name.substr(12) : name] = std::move(t);
  if (auto head = byname.find("lm_head.weight"); head != byname.end()) {
    if (!byname.count("wte.weight") || head->second.data != byname["wte.weight"].data)
      throw_input("import: ", st_path.string(), ": lm_head.weight differs from wte.weight: Myriad ties the head to the embedding");
    byname.erase(head);
  }
  const auto shapes = myriad_shapes(m, cfg.positions());
  std::map<std::string, HostTensor> model;  // Myriad's name -> tensor
  for (const Names& n : gpt2_names(m)) {
    auto it = byname.find(n.gpt2);
    if (it == byname.end()) throw_input("import: ", st_path.string(), ": tensor ", n.gpt2, " is missing");
    std::vector<int64_t> want = shapes.at(n.myriad);
    if (n.kind == Names::kLinear || n.kind == Names::kQkvWeight) std::swap(want[0], want[1]);
    if (it->second.shape != want)
      throw_input("import: ", st_path.string(), ": tensor ", n.gpt2, " has shape ", shape_str(it->second.shape),
                  " but ", cfg_path.filename().string(), " (n_layer ", m.layers, ", n_embd ", m.d_model, ", vocab_size ",
                  m.vocab_size, ", n_positions ", cfg.positions(), ") makes it ", shape_str(want));
    model[n.myriad] = convert(n, it->second, m, /*to_gpt2=*/false);
    byname.erase(it);
  }
  if (!byname.empty())
    throw_input("import: ", st_path.string(), ": tensor ", byname.begin()->first, " is not part of a GPT-2 model");
  save_imported(out, cfg, model, hf_dir, "GPT-2");
}

}  // namespace myriad::checkpoint
