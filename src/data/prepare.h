// prepare: text files -> token files (MMIDIDX, see indexed_dataset.h) for training.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace myriad::data {

struct PrepareOptions {
  // Files ending in .jsonl hold one JSON object per line whose "text" field is a document
  // (Megatron-LM's preprocessing input); any other file is plain text.
  std::vector<std::string> inputs;
  std::string tokenizer;      // a make_tokenizer name: "byte", "gpt2" or "llama3"
  std::string output_prefix;  // writes PREFIX.{bin,idx,json}, or PREFIX_train.* and PREFIX_valid.*
  // With 0 < valid_fraction <= 0.5, the nearest whole number of documents to that fraction of
  // them (halves up), spread evenly over the documents of all inputs in order, goes to
  // PREFIX_valid and the rest to PREFIX_train; a fraction 1/k takes every k-th document.
  double valid_fraction = 0;
  // In plain-text inputs, a line equal to this (e.g. "%" in fortune files) ends a document;
  // when empty, each file is one document.
  std::string doc_separator;
  // Replace PREFIX.* files that are there already even when no earlier prepare wrote them.
  bool overwrite = false;
  // Inputs tokenized at once (0: one per core). The output is the same whatever the number.
  int jobs = 0;
  // One output per input, PREFIX_<input's name without its extension> (each split on its own),
  // ready to blend (data.train's sources), instead of one for all.
  bool per_input = false;
  // Set (to the signal's number) when the prepare is to stop: it then stops within a document,
  // removes what it was writing, and throws Interrupted. Null: never.
  const std::atomic<int>* stop = nullptr;
};

// A prepare stopped by PrepareOptions::stop: nothing half written is left (its temporary files
// and scratch parts are removed); outputs already complete (other inputs' with per_input) stay.
class Interrupted : public Error {
 public:
  Interrupted(int signal, const std::string& what) : Error(ErrorClass::kRuntime, what), signal(signal) {}
  int signal;
};

struct SplitStats {
  std::string prefix;  // where the split was written
  int64_t documents = 0;
  int64_t tokens = 0;  // including one eot per document
};

struct PrepareStats {
  std::vector<SplitStats> splits;  // {train, valid} with a valid fraction, else the one output (per input with per_input)
  int64_t documents = 0;           // over all splits
  int64_t tokens = 0;
  int64_t skipped = 0;  // empty or whitespace-only documents, not written
  int64_t input_bytes = 0;
  double seconds = 0;
};

// Tokenizes every document, appends the tokenizer's eot after each, and writes the splits
// (output directories are created; each file appears under its final name only when complete).
// Several inputs are tokenized at once (options.jobs), each into parts of its own under a
// private directory beside the output, which are then joined in input order: the files are
// the ones a single thread writes.
// Input errors: a missing or unreadable input (named), malformed JSON lines (file:line), an
// unknown tokenizer, a valid_fraction outside [0, 0.5], a split left empty, an output file that
// is one of the inputs, an output file that exists and that no earlier prepare wrote (by the
// PREFIX.json sidecar) unless `overwrite`.
// What an earlier prepare killed before it could clean up left under the output's names (its
// PREFIX.bin.tmp-<pid> files and .myriad-prepare-<pid>-* scratch folders, their process gone from
// this machine) is removed first, and said.
PrepareStats prepare(const PrepareOptions& options);

}  // namespace myriad::data
