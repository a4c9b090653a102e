#include "checkpoint/export_folder.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace myriad::checkpoint {
namespace {

// The path a command will write for a path the user gave: absolute, `..` resolved as the
// writes will resolve it, no trailing slash ("nonexist/../victim" is victim).
fs::path normalized_path(const std::string& p) {
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
  int swap = 0;
  if (!existed) {
    if (const int err = rename_noreplace(tmp.string(), out.string()); err != 0) fail(err);
  } else if ((swap = rename_exchange(tmp.string(), out.string())) == 0) {
    earlier = tmp;
    s.keep_tmp = true;  // until it is known that the earlier folder may go
    if (changed(earlier)) {
      if (const int err = rename_exchange(tmp.string(), out.string()); err != 0) {
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
    const int err = swap;
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
    sync_dir(staging.string());
    if (recheck)
      if (const std::string f = foreign_entry(out); !f.empty())
        throw_input("export: ", f, " appeared in ", out.string(), " while the export was written; it is left as it is: "
                    "run the export again");
    const std::set<std::string> earlier = manifest_files(out).value_or(std::set<std::string>());
    std::set<std::string> both(earlier);
    both.insert(files.begin(), files.end());
    write_file_durably((staging / kManifest).string(), {manifest({both.begin(), both.end()})});
    move_in(kManifest);
    for (const std::string& f : files) move_in(f);
    for (const std::string& f : earlier)
      if (!std::count(files.begin(), files.end(), f) && f != kManifest &&
          fs::symlink_status(out / f, ec).type() == fs::file_type::regular && ::unlink((out / f).c_str()) != 0 &&
          errno != ENOENT)
        throw_runtime("export: cannot remove the earlier export's ", (out / f).string(), ": ", std::strerror(errno));
    sync_dir(out.string());
    write_file_durably((staging / kManifest).string(), {manifest(files)});
    move_in(kManifest);
    sync_dir(out.string());
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

}  // namespace

fs::path normalized(const std::string& p) { return normalized_path(p); }

fs::path check_export_output(const std::string& out_arg, const std::string& dir, bool overwrite) {
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
  return out;
}

void write_export(const fs::path& out, bool overwrite,
                  const std::function<std::vector<std::string>(const fs::path&)>& write_files,
                  const std::function<std::string(const std::vector<std::string>&)>& manifest) {
  std::error_code ec;
  const bool existed = fs::exists(fs::symlink_status(out, ec));
  // The inner errors mostly say "export: " already; the others (a write's) get it here.
  auto said = [](const Error& e) {
    const std::string what = e.what();
    return what.starts_with("export: ") ? what : "export: " + what;
  };
  const fs::path tmp = make_sibling_dir(out, existed);
  bool in_place = tmp.empty();
  if (!in_place) {
    Placing placing;
    try {
      write_file_durably((tmp / kManifest).string(), {manifest(write_files(tmp))});
      sync_dir(tmp.string());
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
        sync_dir(out.parent_path().string());
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
}

}  // namespace myriad::checkpoint
