#include "data/prepare.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace myriad::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool blank(std::string_view s) {
  return s.find_first_not_of(" \t\n\r\v\f") == std::string_view::npos;
}

// Whether `a` (an input, which exists) and `b` name one file: the same inode (links, other
// spellings), or the same path once normalized (`sub/../x` when sub does not exist yet, which the
// writers would create).
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::exists(b, ec) && std::filesystem::equivalent(a, b, ec)) return true;
  return std::filesystem::absolute(a).lexically_normal() == std::filesystem::absolute(b).lexically_normal();
}

// Whether PREFIX.json is the sidecar prepare writes, which names the tokenizer: the writer
// renames it into place after the .bin and .idx it describes, so it proves that PREFIX.* are an
// earlier prepare's, which may be replaced.
bool written_by_prepare(const std::string& prefix) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(prefix + ".json", ec)) return false;
  std::ifstream in(prefix + ".json", std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_object() && j.contains("format") && j["format"] == "MMIDIDX" && j.contains("tokenizer") &&
         j["tokenizer"].is_string() && j.contains("vocab_size") && j["vocab_size"].is_number_integer();
}

using DocFn = std::function<void(std::string_view)>;

std::ifstream open_input(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input("prepare: cannot read input ", path);
  return in;
}

void check_read(const std::ifstream& in, const std::string& path) {
  if (in.bad()) throw_runtime("prepare: error reading ", path);
}

// Megatron-style JSON lines: each non-blank line is an object whose "text" is a document.
void jsonl_documents(const std::string& path, const DocFn& doc) {
  std::ifstream in = open_input(path);
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (blank(line)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw_input(path, ":", lineno, ": invalid JSON: ", e.what());
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      throw_input(path, ":", lineno, ": expected an object with a string field \"text\"");
    doc(j["text"].get_ref<const std::string&>());
  }
  check_read(in, path);
}

// Plain text: documents end at lines equal to `separator` (the line itself is dropped); every
// other byte, newlines included, is kept as it is.
void text_documents(const std::string& path, const std::string& separator, const DocFn& doc) {
  std::ifstream in = open_input(path);
  if (separator.empty()) {
    std::ostringstream os;
    os << in.rdbuf();
    check_read(in, path);
    doc(os.str());
    return;
  }
  std::string line, current;
  while (std::getline(in, line)) {
    const bool newline = !in.eof();
    std::string_view bare = line;
    if (!bare.empty() && bare.back() == '\r') bare.remove_suffix(1);  // CRLF files
    if (bare == separator) {
      doc(current);
      current.clear();
      continue;
    }
    current += line;
    if (newline) current += '\n';
  }
  check_read(in, path);
  doc(current);
}

}  // namespace

PrepareStats prepare(const PrepareOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  if (o.inputs.empty()) throw_input("prepare: no input files");
  if (o.output_prefix.empty()) throw_input("prepare: no output prefix");
  if (o.output_prefix.back() == '/' || std::filesystem::is_directory(o.output_prefix))
    throw_input("prepare: --output ", o.output_prefix, " is a directory, but it names the files "
                "PREFIX.bin, PREFIX.idx and PREFIX.json: give a prefix such as ",
                (std::filesystem::path(o.output_prefix) / "corpus").lexically_normal().string());
  if (!(o.valid_fraction >= 0 && o.valid_fraction <= 0.5))
    throw_input("prepare: valid_fraction ", o.valid_fraction, " is outside [0, 0.5]");
  PrepareStats stats;
  for (const auto& path : o.inputs) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(st)) throw_input("prepare: input ", path, " does not exist");
    if (!std::filesystem::is_regular_file(st))
      throw_input("prepare: input ", path, " is not a file");
    stats.input_bytes += static_cast<int64_t>(std::filesystem::file_size(path, ec));
  }
  const bool split = o.valid_fraction > 0;
  std::vector<std::string> prefixes;
  if (split) {
    prefixes = {o.output_prefix + "_train", o.output_prefix + "_valid"};
  } else {
    prefixes = {o.output_prefix};
  }
  // The writers replace PREFIX.* by renames at the end: an input of that name would be lost.
  for (const auto& p : prefixes)
    for (const char* ext : {".bin", ".idx", ".json"})
      for (const auto& in : o.inputs)
        if (same_file(in, p + ext))
          throw_input("prepare: --output ", o.output_prefix, " would write ", p + ext, ", which is also an input (",
                      in, "): choose another --output");
  // A file the user already has under one of the names is never replaced, unless an earlier
  // prepare wrote it (its sidecar says so) or --overwrite is given.
  if (!o.overwrite)
    for (const auto& p : prefixes) {
      if (written_by_prepare(p)) continue;
      for (const char* ext : {".bin", ".idx", ".json"}) {
        std::error_code ec;
        if (!std::filesystem::exists(std::filesystem::symlink_status(p + ext, ec))) continue;
        throw_input("prepare: ", p + ext, " exists", std::string(ext) == ".json" ? " and is not the sidecar myriad prepare "
                    "writes" : cat(" and no sidecar ", p, ".json of myriad prepare's says it wrote it"),
                    ": give another --output, or add --overwrite to replace it");
      }
    }
  const auto tok = make_tokenizer(o.tokenizer);

  std::vector<std::unique_ptr<IndexedDatasetWriter>> out;
  for (const auto& p : prefixes)
    out.push_back(
        std::make_unique<IndexedDatasetWriter>(p, tok->vocab_size(), tok->name(), tok->eot()));

  // Validation takes F of the first n documents, rounded down, while the count is not known:
  // the documents it takes are spread evenly, and a fraction 1/k takes document j when
  // j % k == k - 1. The last document is held back until the end, when the count is known, and
  // placed so that the whole split is the nearest count (F of 10 is 4 for F = 0.4, not 1/3).
  // The relative nudge keeps products such as 10 x 0.1 from landing just below a whole number.
  const double f = o.valid_fraction;
  const auto rounded_down = [f](int64_t n) { return static_cast<int64_t>(std::floor(double(n) * f * (1 + 1e-12))); };
  const auto nearest = [f](int64_t n) { return static_cast<int64_t>(std::floor(double(n) * f * (1 + 1e-12) + 0.5)); };
  int64_t j = 0, valid = 0;
  std::vector<int32_t> held;
  bool holding = false;
  const auto place = [&](const std::vector<int32_t>& ids, bool to_valid) {
    out[to_valid ? 1 : 0]->add_document(ids);
    valid += to_valid;
  };
  const DocFn add = [&](std::string_view text) {
    if (blank(text)) {
      if (!text.empty()) ++stats.skipped;
      return;
    }
    std::vector<int32_t> ids = tok->encode(text);
    ids.push_back(tok->eot());
    if (!split) {
      out[0]->add_document(ids);
    } else {
      if (holding) place(held, rounded_down(j) > valid);  // document j - 1
      held = std::move(ids);
      holding = true;
    }
    ++j;
  };
  for (const auto& path : o.inputs) {
    if (ends_with(path, ".jsonl"))
      jsonl_documents(path, add);
    else
      text_documents(path, o.doc_separator, add);
  }
  if (holding) place(held, nearest(j) > valid);
  for (size_t s = 0; s < out.size(); ++s)
    if (out[s]->documents() == 0)
      throw_input("prepare: no documents for ", prefixes[s], " (", j, " documents in all",
                  split ? cat("; valid_fraction ", f, " of ", j, " documents rounds to ", valid) : std::string(),
                  "): give more input", split ? (s == 1 ? " or a larger valid_fraction" : " or a smaller valid_fraction") : "");
  for (size_t s = 0; s < out.size(); ++s) {
    out[s]->finish();
    stats.splits.push_back({prefixes[s], out[s]->documents(), out[s]->tokens()});
    stats.documents += out[s]->documents();
    stats.tokens += out[s]->tokens();
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace myriad::data
