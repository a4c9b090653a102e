#!/usr/bin/env bash
# On the GPU machine, whose python3 has transformers (the dev machine has not): Qwen3, Qwen3-MoE
# and Mixtral interchange against transformers itself (docs/notes/hf.md), for each family:
#   1. a model Myriad trained (3 steps on the CPU, byte ids), exported in fp32, loads with
#      AutoModelForCausalLM.from_pretrained as the family's class and gives Myriad's logits
#      (`myriad sample --logits`) within 1e-4;
#   2. a random model of the family that transformers made and saved (its own config form and
#      file layout) imports, and Myriad's logits are transformers' within 1e-4.
# The shapes: Qwen3 with a head size (16) apart from d_model / heads (8) and per-head query-key
# norms; Qwen3-MoE with a dense first layer (mlp_only_layers) and renormalized top-2 of 4
# experts; Mixtral top-2 of 4. Both sides in fp32 (`myriad sample` runs on the CPU).
# Then the tokenizer.json tokenizers: `prepare --tokenizer qwen3` and `llama3` against Hugging
# Face's tokenizers library on the same files.
# Prints one line per check ("ok: ..." or "FAIL: ..."); exits nonzero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${MYRIAD:-/tmp/m/bin/myriad}
[ -f scripts/device_env.sh ] && source scripts/device_env.sh
W=$(mktemp -d)
fail=0
P="Hello world, it's 12:34"
printf 'Myriad trains on these words. %.0s' $(seq 1 400) > "$W/corpus.txt"
"$B" prepare --input "$W/corpus.txt" --tokenizer byte --output "$W/d" >"$W/prepare.log" 2>&1 || { echo "FAIL: prepare"; fail=1; }
common="--set model.layers=2 --set model.d_model=32 --set model.heads=4 --set model.seq_len=32 --set model.vocab_size=256
  --set model.norm=rmsnorm --set model.position_encoding=rope --set model.mlp=swiglu --set model.bias=false
  --set model.kv_heads=2 --set model.rope_theta=1000000 --set train.steps=3 --set train.device=cpu
  --set train.global_batch=2 --set train.micro_batch=1 --set train.eval_every=0 --set data.tokenizer=byte"
declare -A SETS=(
  [qwen3]="--set model.head_dim=16 --set model.qk_norm=head --set model.mlp_hidden=40"
  [qwen3_moe]="--set model.head_dim=16 --set model.qk_norm=head --set model.mlp_hidden=40 --set model.dense_layers=1
    --set model.experts=4 --set model.experts_per_token=2 --set model.expert_hidden=24 --set model.tied_embeddings=false"
  [mixtral]="--set model.mlp_hidden=24 --set model.experts=4 --set model.experts_per_token=2 --set model.expert_hidden=24
    --set model.tied_embeddings=false")
for f in qwen3 qwen3_moe mixtral; do
  # shellcheck disable=SC2086
  "$B" train --config configs/demo.toml --run-dir "$W/$f" --set data.train="$W/d" --set data.valid= $common ${SETS[$f]} \
    >"$W/train_$f.log" 2>&1 || { echo "FAIL: train $f"; tail -3 "$W/train_$f.log"; fail=1; continue; }
  "$B" export --checkpoint "$W/$f" --dtype fp32 --output "$W/${f}_hf" >"$W/export_$f.log" 2>&1 ||
    { echo "FAIL: export $f"; tail -3 "$W/export_$f.log"; fail=1; continue; }
  "$B" sample --checkpoint "$W/$f" --prompt "$P" --tokens 0 --logits "$W/$f.json" >"$W/sample_$f.log" 2>&1 ||
    { echo "FAIL: sample $f"; tail -3 "$W/sample_$f.log"; fail=1; continue; }
  python3 - "$W" "$f" <<'PY' || fail=1
import json, sys, torch
from transformers import AutoModelForCausalLM
w, f = sys.argv[1], sys.argv[2]
mine = json.load(open(f"{w}/{f}.json"))
model = AutoModelForCausalLM.from_pretrained(f"{w}/{f}_hf", torch_dtype=torch.float32).eval()
with torch.no_grad():
    got = model(torch.tensor([mine["prompt_ids"]])).logits[0, -1].double()
ref = torch.tensor(mine["logits"], dtype=torch.float64)
err = ((got - ref).norm() / ref.norm()).item()
print(f"{'ok' if err < 1e-4 else 'FAIL'}: {type(model).__name__}.from_pretrained loads Myriad's {f} export; its logits "
      f"after the prompt are Myriad's within {err:.1e}")
sys.exit(0 if err < 1e-4 else 1)
PY
  python3 - "$W/tf_$f" "$f" "$P" <<'PY' || { fail=1; continue; }
import json, sys, torch
import transformers as T
d, f, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
common = dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)
if f == "qwen3":
    cfg = T.Qwen3Config(intermediate_size=96, head_dim=32, **common)
elif f == "qwen3_moe":
    cfg = T.Qwen3MoeConfig(intermediate_size=96, head_dim=32, moe_intermediate_size=48, num_experts=4,
                           num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0], **common)
else:
    cfg = T.MixtralConfig(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, **common)
model = T.AutoModelForCausalLM.from_config(cfg).eval()
with torch.no_grad():  # weights of a visible scale, the norms not all ones
    for p in model.parameters():
        p.normal_(0, 0.3 if p.dim() == 1 else 0.05).add_(1.0 if p.dim() == 1 else 0.0)
model.save_pretrained(d, safe_serialization=True)
ids = list(prompt.encode())
with torch.no_grad():
    logits = T.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()(torch.tensor([ids])).logits[0, -1]
json.dump({"prompt_ids": ids, "logits": logits.tolist()}, open(f"{d}/transformers.json", "w"))
saved = json.load(open(f"{d}/config.json"))
print(f"   (transformers {T.__version__} saved {f} with: " +
      ", ".join(k for k in ("rope_parameters", "rope_theta", "num_experts", "num_local_experts") if k in saved) + ")")
PY
  "$B" import --hf "$W/tf_$f" --output "$W/tf_${f}_ckpt" >"$W/import_$f.log" 2>&1 ||
    { echo "FAIL: import of transformers' $f"; tail -3 "$W/import_$f.log"; fail=1; continue; }
  "$B" sample --checkpoint "$W/tf_${f}_ckpt" --prompt "$P" --tokens 0 --logits "$W/tf_$f.json" >"$W/sample_tf_$f.log" 2>&1 ||
    { echo "FAIL: sample of the imported $f"; tail -3 "$W/sample_tf_$f.log"; fail=1; continue; }
  python3 - "$W/tf_$f/transformers.json" "$W/tf_$f.json" "$f" <<'PY' || fail=1
import json, sys, math
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
same_ids = a["prompt_ids"] == b["prompt_ids"]
d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a["logits"], b["logits"])))
r = math.sqrt(sum(y * y for y in a["logits"]))
ok = same_ids and d / r < 1e-4
print(f"{'ok' if ok else 'FAIL'}: a random {sys.argv[3]} saved by transformers imports; Myriad's logits are "
      f"transformers' within {d / r:.1e}" + ("" if same_ids else " (the prompt ids differ)"))
sys.exit(0 if ok else 1)
PY
done
# The tokenizer.json tokenizers (qwen3, llama3) against Hugging Face's tokenizers library, the
# Rust code under transformers' fast tokenizers, on the same files as setup.sh fetched them:
# `myriad prepare` gives each document its ids and then the document end. Special tokens' text
# is ordinary text on both sides (encode_special_tokens); non-special added tokens (Qwen's <think>)
# are matched on both. The documents: this repository's text,
# and lines that stress the normalizer and the pre-tokenizer (combining marks, compatibility
# characters, digits, every kind of space, U+0085 and U+FEFF among them), one document each.
python3 - "$W/tok_corpus.jsonl" README.md docs/*.md src/data/*.cc <<'PY'
import json, random, sys
out, files = sys.argv[1], sys.argv[2:]
docs = [open(f, encoding="utf-8").read() for f in files]
random.seed(3)
pool = ["a", "Z", "word", "e\u0301", "A\u030a", "\u212b", "\u2126", "\u1100\u1161\u11a8", "\uac00", "\u0958",
        "\uff21\uff42", "\ufb01", "\u00bd", "\u2163", "\u0663\u0664", "12345", "3.14", " ", "  ", "\t", "\n", "\r\n",
        "\u00a0", "\u2009", "\u3000", "\u2028", "\u0085", "\ufeff", "'s", "'LL", "DON'T", ",", "...", "(",
        "\u65e5\u672c", "\ud55c", "\U0001f600", "\u0627\u0644", "\u0915\u093f", "\u0e01\u0e34", "<|endoftext|>",
        "<think>", "</tool_call>", "<|fim_prefix|>", "<thin"]
docs += ["".join(random.choice(pool) for _ in range(random.randint(1, 30))) for _ in range(400)]
with open(out, "w") as f:
    for d in docs:
        if d.strip():
            f.write(json.dumps({"text": d}) + "\n")
PY
for tk in qwen3 llama3; do
  "$B" prepare --input "$W/tok_corpus.jsonl" --tokenizer $tk --output "$W/tok_$tk" >"$W/tok_$tk.log" 2>&1 ||
    { echo "FAIL: prepare --tokenizer $tk"; tail -3 "$W/tok_$tk.log"; fail=1; continue; }
  python3 - "$W/tok_$tk" "$W/tok_corpus.jsonl" "${MYRIAD_CACHE:-$HOME/.cache/myriad}/$tk/tokenizer.json" $tk <<'PY' || fail=1
import json, sys, numpy as np
import tokenizers
prefix, corpus, path, name = sys.argv[1:5]
idx = open(prefix + ".idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", "not an MMIDIDX index"
n = int.from_bytes(idx[18:26], "little")
sizes = np.frombuffer(idx, np.int32, n, 34)
pointers = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
dtype = {4: np.int32, 8: np.uint16}[idx[17]]
data = np.fromfile(prefix + ".bin", dtype)
ours = [data[p // data.itemsize: p // data.itemsize + s].tolist() for p, s in zip(pointers, sizes)]
docs = [json.loads(line)["text"] for line in open(corpus)]
tok = tokenizers.Tokenizer.from_file(path)
tok.encode_special_tokens = True  # "<|endoftext|>" in a text is its characters, as in Myriad
eot = ours[0][-1]
theirs = [tok.encode(d, add_special_tokens=False).ids + [eot] for d in docs]
bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
ok = len(ours) == len(theirs) and not bad
print(f"{'ok' if ok else 'FAIL'}: prepare --tokenizer {name} gives the ids of Hugging Face's tokenizers "
      f"{tokenizers.__version__} on {len(theirs) - len(bad)} of {len(theirs)} documents ({len(ours)} prepared, "
      f"{sum(map(len, ours))} ids)")
for i in bad[:4]:
    at = next(k for k, (x, y) in enumerate(zip(ours[i] + [-1], theirs[i] + [-2])) if x != y)
    print("   differs:", json.dumps(docs[i])[:160], f"at id {at}:")
    print("     ours:  ", ours[i][max(0, at - 3):at + 8], " theirs:", theirs[i][max(0, at - 3):at + 8],
          " around", json.dumps(tok.decode(theirs[i][max(0, at - 3):at + 8])))
sys.exit(0 if ok else 1)
PY
done
[ "$fail" = 0 ] || cp "$W"/*.log "${OUT:-/tmp/out}/" 2>/dev/null
rm -rf "$W"
exit $fail
