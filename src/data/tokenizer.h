// Tokenizers: text bytes <-> token ids.
//
// Two are built in: "byte" (ids are the bytes) and "gpt2" (GPT-2's byte-level BPE, read from
// the files scripts/setup.sh puts in the cache). Both are lossless on arbitrary bytes:
// decode(encode(s)) == s even when s is not valid UTF-8.
//
// Thread safety: a Tokenizer is immutable after construction apart from an internal,
// mutex-guarded cache, so one instance may be used from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace myriad::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;    // "byte" or "gpt2"
  virtual int64_t vocab_size() const = 0;  // 256 or 50257
  // The end-of-text id that prepare appends after each document.
  virtual int32_t eot() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes the ids stand for; a cut in the middle of a token sequence may leave a partial
  // UTF-8 character at either end. Ids outside [0, vocab_size) are an input error.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

// The names make_tokenizer accepts.
std::vector<std::string> tokenizer_names();
// The vocabulary of a named tokenizer without loading it: 256 (byte), 50257 (gpt2); an unknown
// name is an input error, as in make_tokenizer.
int64_t tokenizer_vocab_size(const std::string& name);
// "byte" or "gpt2"; anything else is an input error naming `name` and the choices.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name);

// The byte tokenizer: ids are the bytes themselves, vocab 256, and eot = 0, since NUL never
// occurs in the text we train on (a NUL inside an input is still encoded as 0 and so reads as
// a document end; prepare accepts it but nothing should rely on it).
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Where the GPT-2 files live: $MYRIAD_CACHE/gpt2, else ${XDG_CACHE_HOME:-$HOME/.cache}/myriad/gpt2
// (the place scripts/setup.sh fills).
std::string gpt2_dir();
// GPT-2 BPE from `dir`/encoder.json and `dir`/vocab.bpe; missing or malformed files are an input
// error that says to run scripts/setup.sh. The tables are loaded once per directory and shared.
std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& dir);

// GPT-2's pre-tokenizer, exposed for tests: splits `text` into the pieces BPE runs on, the
// matches of 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ with
// JavaScript's \s (the reference encoder is the npm gpt-3-encoder). A byte that does not start
// a valid UTF-8 character counts as one character of its own that is neither letter, number
// nor space. The pieces view `text` and cover it exactly, in order.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace myriad::data
