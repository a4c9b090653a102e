#include "data/tokenizer.h"

#include <cstdlib>
#include <filesystem>

#include "core/config.h"
#include "core/error.h"
#include "core/text.h"

namespace myriad::data {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  int32_t eot() const override { return 0; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > 255)
        throw_input("byte tokenizer: token id ", ids[i], " at position ", i,
                    " is outside [0, 256)");
      out[i] = static_cast<char>(ids[i]);
    }
    return out;
  }
};

}  // namespace

std::vector<std::string> tokenizer_names() { return {"byte", "gpt2", "llama3", "qwen3"}; }

namespace {
constexpr const char* kHf = "hf:";
}  // namespace

int64_t tokenizer_vocab_size(const std::string& name) {
  if (name == "byte") return 256;
  if (name == "gpt2") return 50257;
  if (name == "llama3") return 128256;
  if (name == "qwen3") return 151669;
  return make_tokenizer(name)->vocab_size();  // hf:DIR loads; anything else throws, naming the choices
}

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name) {
  if (name == "byte") return make_byte_tokenizer();
  if (name == "gpt2") return make_gpt2_tokenizer(gpt2_dir());
  if (name == "llama3" || name == "qwen3")
    return make_hf_bpe_tokenizer(hf_tokenizer_dir(name), name,
                                 cat("run scripts/setup.sh to fetch the ", name == "llama3" ? "Llama 3" : "Qwen3",
                                     " vocabulary"));
  if (name.starts_with(kHf)) {
    const std::string id = canonical_tokenizer(name);
    return make_hf_bpe_tokenizer(hf_tokenizer_dir(id), id,
                                 cat("give ", name, " a directory holding a Hugging Face tokenizer.json of Llama 3's "
                                     "or Qwen's form (an imported checkpoint keeps its model's)"));
  }
  const auto names = tokenizer_names();
  throw_input("unknown tokenizer '", name, "'", did_you_mean(name, names),
              ": choose one of byte, gpt2, llama3, qwen3, or hf:DIR for DIR/tokenizer.json");
}

std::string hf_tokenizer_dir(const std::string& name) {
  if (name == "llama3") return llama3_dir();
  if (name == "qwen3") return qwen3_dir();
  if (name.starts_with(kHf)) return canonical_tokenizer(name).substr(3);
  return "";
}

namespace {

// The cache scripts/setup.sh fills: $MYRIAD_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/myriad.
std::string cache_dir() {
  const char* cache = std::getenv("MYRIAD_CACHE");
  if (cache && *cache) return cache;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/myriad";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/myriad";
}

}  // namespace

std::string gpt2_dir() { return cache_dir() + "/gpt2"; }

std::string llama3_dir() { return cache_dir() + "/llama3"; }

std::string qwen3_dir() { return cache_dir() + "/qwen3"; }

}  // namespace myriad::data
