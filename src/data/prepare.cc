#include "data/prepare.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
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

// The documents of one input, .jsonl or plain text.
void documents(const std::string& path, const std::string& separator, const DocFn& doc) {
  if (ends_with(path, ".jsonl")) jsonl_documents(path, doc);
  else text_documents(path, separator, doc);
}

// Which documents go to validation, from their number i among all n: F of the first i
// documents, rounded down, while i < n, so that they are spread evenly (a fraction 1/k takes
// document i when i % k == k - 1); the last document makes the whole split the nearest count
// (F of 10 is 4 for F = 0.4, not 1/3). The relative nudge keeps products such as 10 x 0.1 from
// landing just below a whole number.
struct Split {
  double f;
  int64_t n;
  int64_t rounded_down(int64_t i) const { return static_cast<int64_t>(std::floor(double(i) * f * (1 + 1e-12))); }
  int64_t nearest(int64_t i) const { return static_cast<int64_t>(std::floor(double(i) * f * (1 + 1e-12) + 0.5)); }
  bool to_valid(int64_t i) const {
    return i + 1 < n ? rounded_down(i + 1) > rounded_down(i) : nearest(n) > rounded_down(n - 1);
  }
  int64_t valid_documents() const { return n == 0 ? 0 : rounded_down(n - 1) + (to_valid(n - 1) ? 1 : 0); }
};

// fn(0), ..., fn(n - 1) on up to `jobs` threads; the error of the lowest input that failed is
// rethrown (the one a single thread would have met first).
void for_each_input(size_t n, int jobs, const std::function<void(size_t)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < n;) {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < std::min<int>(jobs, static_cast<int>(n)); ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

// The private directory the parts of a parallel prepare go to, beside the output, removed with
// everything in it when the prepare ends, however it ends but killed: it is this process's own.
// Its name carries the process's id (.myriad-prepare-<pid>-XXXXXX), so that a later prepare can
// tell a killed one's.
constexpr const char* kScratchPrefix = ".myriad-prepare-";
struct Scratch {
  std::filesystem::path dir;
  explicit Scratch(const std::string& output_prefix) {
    const std::filesystem::path parent = std::filesystem::absolute(output_prefix).parent_path();
    std::filesystem::create_directories(parent);
    std::string pattern = (parent / cat(kScratchPrefix, ::getpid(), "-XXXXXX")).string();
    if (!::mkdtemp(pattern.data())) throw_input("prepare: cannot create a directory in ", parent.string(), ": is it writable?");
    dir = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

// The process id a name of prepare's own scheme carries after `lead` ("<pid>" then "-..." or
// nothing), or -1 when `name` is not of that form.
long pid_after(const std::string& name, const std::string& lead) {
  if (name.size() <= lead.size() || name.compare(0, lead.size(), lead) != 0) return -1;
  size_t at = lead.size(), end = at;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == at || end - at > 9 || (end < name.size() && name[end] != '-')) return -1;
  return std::stol(name.substr(at, end - at));
}

// Whether process `pid` is gone from this machine (a live one, or one of another user's, is not).
bool gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

// What a killed prepare left under the names this one writes: PREFIX.{bin,idx,json}.tmp-<pid>[-i]
// (data/indexed_dataset.h's temporaries) and scratch folders beside them, each of a process gone.
// Removed and said; anything of a live process, or of another naming, is left alone.
void remove_stale_leftovers(const std::vector<std::string>& prefixes, const std::string& output_prefix) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path parent = fs::absolute(output_prefix).parent_path();
  if (!fs::is_directory(parent, ec)) return;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    bool stale = e.is_directory(ec) && gone(pid_after(name, kScratchPrefix));
    for (const std::string& p : prefixes)
      for (const char* ext : {".bin", ".idx", ".json"})
        stale = stale || (!e.is_directory(ec) && fs::absolute(p).parent_path() == parent &&
                          gone(pid_after(name, fs::path(p).filename().string() + ext + ".tmp-")));
    if (!stale) continue;
    fs::remove_all(e.path(), ec);
    if (!ec) log::info("prepare: removed ", e.path().string(), ", left by a prepare that was killed (its process is gone)");
  }
}

// PREFIX_<stem> for each input (per_input), refusing two inputs of one stem.
std::vector<std::string> per_input_prefixes(const PrepareOptions& o) {
  std::vector<std::string> out;
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    const std::string stem = std::filesystem::path(o.inputs[i]).stem().string();
    for (size_t k = 0; k < i; ++k)
      if (std::filesystem::path(o.inputs[k]).stem().string() == stem)
        throw_input("prepare: --per-input writes PREFIX_<name> for each input, but ", o.inputs[k], " and ", o.inputs[i],
                    " are both named ", stem, ": rename one, or prepare them apart");
    out.push_back(o.output_prefix + "_" + stem);
  }
  return out;
}

}  // namespace

PrepareStats prepare(const PrepareOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  // Checked at each document: a signal stops the prepare there, and unwinding removes what it
  // was writing (the writers' temporaries, the scratch folder).
  auto check_stop = [&] {
    if (o.stop && o.stop->load() != 0)
      throw Interrupted(o.stop->load(), cat("prepare: stopped by signal ", o.stop->load(), " before ", o.output_prefix,
                                            " was complete; its partial files are removed"));
  };
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
  const int jobs = o.jobs > 0 ? o.jobs : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (o.per_input) {
    // Each input prepared on its own (in parallel), one output per input. One that fails leaves
    // the others' outputs, complete, and the error says which they are.
    const std::vector<std::string> outputs = per_input_prefixes(o);
    std::vector<PrepareStats> each(o.inputs.size());
    std::vector<char> done(o.inputs.size(), 0);
    try {
      for_each_input(o.inputs.size(), jobs, [&](size_t i) {
        PrepareOptions one = o;
        one.inputs = {o.inputs[i]}, one.output_prefix = outputs[i], one.per_input = false, one.jobs = 1;
        each[i] = prepare(one);
        done[i] = 1;
      });
    } catch (const Error& e) {
      std::string kept;
      for (size_t i = 0; i < outputs.size(); ++i)
        if (done[i]) kept += cat(kept.empty() ? "" : ", ", outputs[i]);
      const std::string said = cat(e.what(), kept.empty() ? "; no input's output was written"
                                                          : cat("; the other inputs' outputs are complete and kept: ", kept));
      if (const auto* stopped = dynamic_cast<const Interrupted*>(&e)) throw Interrupted(stopped->signal, said);
      throw Error(e.cls(), said);
    }
    PrepareStats all = stats;
    for (const PrepareStats& e : each) {
      all.splits.insert(all.splits.end(), e.splits.begin(), e.splits.end());
      all.documents += e.documents, all.tokens += e.tokens, all.skipped += e.skipped;
    }
    all.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return all;
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
  remove_stale_leftovers(prefixes, o.output_prefix);
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
  // Pass 1: each input's documents, counted, so that every document's split is known before
  // any is tokenized (the split depends on the document's number among all of them).
  std::vector<int64_t> first(o.inputs.size() + 1, 0), skipped(o.inputs.size(), 0);
  for_each_input(o.inputs.size(), jobs, [&](size_t i) {
    // A JSON line is a document even when its text is empty; plain text's empty pieces (the
    // end after a last separator) are no documents.
    const bool jsonl = ends_with(o.inputs[i], ".jsonl");
    documents(o.inputs[i], o.doc_separator, [&](std::string_view text) {
      check_stop();
      if (blank(text)) skipped[i] += jsonl || !text.empty();
      else ++first[i + 1];
    });
  });
  for (size_t i = 0; i < o.inputs.size(); ++i) first[i + 1] += first[i], stats.skipped += skipped[i];
  const int64_t n = first.back();
  const Split split_of{o.valid_fraction, n};
  const int64_t to_valid = split ? split_of.valid_documents() : 0;
  for (size_t s = 0; s < prefixes.size(); ++s)
    if ((s == 0 ? n - to_valid : to_valid) == 0)
      throw_input("prepare: no documents for ", prefixes[s], " (", n, " documents in all",
                  split ? cat("; valid_fraction ", o.valid_fraction, " of ", n, " documents rounds to ", to_valid) : std::string(),
                  "): give more input", split ? (s == 1 ? " or a larger valid_fraction" : " or a smaller valid_fraction") : "");

  // Pass 2: tokenized, input i into writers of its own (or, with one at a time, straight into the
  // outputs), then joined in input order.
  const auto tok = make_tokenizer(o.tokenizer);
  auto writers = [&](const std::vector<std::string>& names) {
    std::vector<std::unique_ptr<IndexedDatasetWriter>> w;
    for (const auto& p : names) w.push_back(std::make_unique<IndexedDatasetWriter>(p, tok->vocab_size(), tok->name(), tok->eot()));
    return w;
  };
  std::vector<std::unique_ptr<IndexedDatasetWriter>> out = writers(prefixes);
  auto tokenize = [&](size_t i, const Tokenizer& t, std::vector<std::unique_ptr<IndexedDatasetWriter>>& to) {
    int64_t j = first[i];
    documents(o.inputs[i], o.doc_separator, [&](std::string_view text) {
      check_stop();
      if (blank(text)) return;
      std::vector<int32_t> ids = t.encode(text);
      ids.push_back(t.eot());
      to[split && split_of.to_valid(j) ? 1 : 0]->add_document(ids);
      ++j;
    });
  };
  if (jobs == 1 || o.inputs.size() == 1) {
    for (size_t i = 0; i < o.inputs.size(); ++i) tokenize(i, *tok, out);
  } else {
    const Scratch scratch(o.output_prefix);
    std::vector<std::vector<std::string>> parts(o.inputs.size());
    for_each_input(o.inputs.size(), jobs, [&](size_t i) {
      for (size_t s = 0; s < prefixes.size(); ++s) parts[i].push_back((scratch.dir / cat("part", i, s == 0 ? "_a" : "_b")).string());
      const auto own = make_tokenizer(o.tokenizer);  // a tokenizer per thread: they keep caches
      std::vector<std::unique_ptr<IndexedDatasetWriter>> to = writers(parts[i]);
      tokenize(i, *own, to);
      for (size_t s = 0; s < to.size(); ++s) {
        if (to[s]->documents() == 0) parts[i][s].clear();  // nothing to join
        to[s]->finish();
      }
    });
    for (size_t i = 0; i < o.inputs.size(); ++i)
      for (size_t s = 0; s < prefixes.size(); ++s) {
        if (parts[i][s].empty()) continue;
        const IndexedDataset part(parts[i][s]);
        for (int64_t q = 0; q < part.num_sequences(); ++q) {
          if (q % 4096 == 0) check_stop();
          out[s]->add_document(part.read(part.sequence_start(q), part.sequence_length(q)));
        }
      }
  }
  check_stop();
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
