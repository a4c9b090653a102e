#!/usr/bin/env bash
# Packs what a GPU machine needs to run binaries built here into .device/stage.tgz: the
# binaries and the shared libraries they use that a CUDA image (Ubuntu, CUDA toolkit, no Debian
# -dev packages) lacks. Carry `.device` to the machine, then there:
#   mkdir -p /tmp/m && tar xzf .device/stage.tgz -C /tmp/m && export LD_LIBRARY_PATH=/tmp/m/lib
#   /tmp/m/bin/NAME ...
# Usage: scripts/stage_device.sh BINARY...
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
mkdir -p "$tmp/bin" "$tmp/lib" .device
# In a worktree .git is a file: ask git where the (shared) exclude file is.
exclude=$(git rev-parse --git-path info/exclude)
grep -qx "/.device/" "$exclude" 2>/dev/null || echo "/.device/" >> "$exclude"
for b in "$@"; do
  cp "$b" "$tmp/bin/"
  # Everything but the C/C++ runtime and the CUDA libraries, which the GPU image has.
  ldd "$b" | awk '/=> \//{print $3}' | grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcublas[^/]*|libcudnn[^/]*|libnccl)\.so' \
    | while read -r lib; do cp -L "$lib" "$tmp/lib/"; done
done
# The tokenizer files scripts/setup.sh fetched (the GPU machine reaches no network); device_env.sh
# points MYRIAD_CACHE at them.
cache="${MYRIAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/myriad}"
# Qwen3's reference encoder (node modules, 20 MB) stays: only the dev machine's tests run it.
[ -d "$cache" ] && cp -r "$cache" "$tmp/cache" && rm -rf "$tmp/cache/qwen3/reference"
tar czf .device/stage.tgz -C "$tmp" .
rm -rf "$tmp"
ls -la .device/stage.tgz
