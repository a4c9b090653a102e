// Files and folders: the checks a run makes at start, before anything trains, and the durable
// writes and renames that checkpoints and exports share (a crash never leaves a half-written
// file under a final name, nor a folder half replaced).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace myriad {

// Creates `dir` when missing and checks that this process can create files in it (a probe
// file, so that read-only mounts and root's permission bypass are judged alike). Otherwise an
// input error: "<what> <dir>: cannot create it (...) | not writable (...): <advice>".
void require_writable_dir(const std::string& dir, const std::string& what, const std::string& advice);

// A whole file's bytes; "" when it cannot be read (the caller says what that means).
std::string read_file(const std::string& path);

// `pieces`, one after another, as the file `path` (created or truncated), on the disk before it
// returns: a rename that reaches the disk before the data would leave empty files after a crash.
// A failure is a runtime fault saying why (a full disk is the usual one).
void write_file_durably(const std::string& path, const std::vector<std::string_view>& pieces);
// The creations and renames in `dir` on the disk (fsync of the folder); a runtime fault otherwise.
void sync_dir(const std::string& dir);
// rename(2) that never replaces `to`, not even an empty folder: 0, or the errno (EEXIST when
// `to` exists). Where the file system lacks RENAME_NOREPLACE, a check and a plain rename.
int rename_noreplace(const std::string& from, const std::string& to);
// `a` and `b` swapped in one step (RENAME_EXCHANGE): 0, or the errno (EINVAL or ENOSYS where the
// file system cannot swap).
int rename_exchange(const std::string& a, const std::string& b);

}  // namespace myriad
