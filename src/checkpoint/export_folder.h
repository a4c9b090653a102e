// An export's folder (checkpoint/hf.h's export_hf): written beside OUT and swapped into its
// place whole, so that a failure leaves an earlier export as it was and the folder never mixes
// two exports' files; or, where OUT cannot be replaced whole (a mount point, a parent this user
// cannot write), staged inside it and renamed in file by file, the manifest last. The manifest,
// OUT/myriad_export.json, lists an export's files: what the next export may replace.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace myriad::checkpoint {

inline constexpr const char* kManifest = "myriad_export.json";

// The path a command will write for a path the user gave: absolute, `..` resolved as the
// writes will resolve it, no trailing slash ("nonexist/../victim" is victim).
std::filesystem::path normalized(const std::string& p);

// Checks the output before anything is read or written: an input error when OUT is a symbolic
// link, not a folder, holds the checkpoint `dir` (even through a link), or holds a file no
// export wrote (unless `overwrite`). Returns OUT, normalized.
std::filesystem::path check_export_output(const std::string& out_arg, const std::string& dir, bool overwrite);

// Writes the export into OUT: `write_files(into)` writes the export's files into a folder, each
// on the disk, and returns their names; `manifest(files)` is the manifest's text. `overwrite`:
// OUT may hold files no export wrote (they go with the folder). Runtime faults say whether OUT
// was left as it was.
void write_export(const std::filesystem::path& out, bool overwrite,
                  const std::function<std::vector<std::string>(const std::filesystem::path&)>& write_files,
                  const std::function<std::string(const std::vector<std::string>&)>& manifest);

}  // namespace myriad::checkpoint
