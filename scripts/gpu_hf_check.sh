#!/usr/bin/env bash
# On the GPU machine, whose python3 has transformers (the dev machine has not): Hugging Face
# Llama interchange against transformers itself.
#   1. A llama3-tokenized Llama trained by Myriad, exported (fp32), loads with
#      LlamaForCausalLM.from_pretrained and gives Myriad's logits (`myriad sample --logits`);
#   2. the exported tokenizer (AutoTokenizer, add_special_tokens=False) loads without a warning
#      and encodes as Myriad does, on a prompt of unicode, digits, whitespace runs and
#      contractions;
#   3. a random LlamaForCausalLM saved by transformers (fp32 and bf16, untied, GQA) imports, and
#      Myriad's logits are transformers'.
# Every model here has a rotary theta other than the default (500000) and Llama 3.1's scaling,
# in both forms of config.json: transformers 4's (rope_theta, rope_scaling), which Myriad's
# export writes, and transformers 5's (rope_parameters), which transformers 5 saves and which
# the export's config is also rewritten into and loaded from, both ways.
# Both sides compare in fp32: the trained model is set to the CPU, and the imported ones have a
# head size (16) the CUDA kernels do not take, so `myriad sample` runs them on the CPU.
# Prints one line per check ("ok: ..." or "FAIL: ..."); exits nonzero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${MYRIAD:-/tmp/m/bin/myriad}
[ -f scripts/device_env.sh ] && source scripts/device_env.sh
W=$(mktemp -d)
fail=0
P=$'Hello  world!! It\'s 2026: naïve café, ünïcödé 12345 6789.\n\n  We\'ll   see\tyou\'re right   '
"$B" prepare --input README.md --input docs/ARCHITECTURE.md --tokenizer llama3 --output "$W/d" >"$W/prepare.log" 2>&1 || fail=1
"$B" train --config configs/demo-llama.toml --run-dir "$W/run" --set data.train="$W/d" --set data.valid= \
  --set data.tokenizer=llama3 --set model.vocab_size=128256 --set model.layers=2 --set model.d_model=64 \
  --set model.seq_len=64 --set model.mlp_hidden=176 --set train.steps=3 --set train.device=cpu \
  --set model.rope_theta=500000 --set model.rope_scaling=llama3 --set model.rope_factor=8 \
  --set model.rope_original_positions=16 \
  --set train.global_batch=2 --set train.micro_batch=1 >"$W/train.log" 2>&1 || { echo "FAIL: train"; tail -3 "$W/train.log"; fail=1; }
"$B" export --checkpoint "$W/run" --dtype fp32 --output "$W/hf" >"$W/export.log" 2>&1 || { echo "FAIL: export"; tail -3 "$W/export.log"; fail=1; }
"$B" sample --checkpoint "$W/run" --prompt "$P" --tokens 0 --logits "$W/myriad.json" >"$W/sample.log" 2>&1 ||
  { echo "FAIL: sample --logits"; tail -3 "$W/sample.log"; fail=1; }
python3 - "$W" "$P" <<'PY' || fail=1
import json, sys, torch
from transformers import AutoTokenizer, LlamaForCausalLM
w, prompt = sys.argv[1], sys.argv[2]
mine = json.load(open(f"{w}/myriad.json"))
ok = True
import logging
warned = []  # transformers' own warnings while it loads the tokenizer (a regex it distrusts, say)
catch = logging.Handler(logging.WARNING)
catch.emit = lambda r: warned.append(r.getMessage())
logging.getLogger("transformers").addHandler(catch)
tok = AutoTokenizer.from_pretrained(f"{w}/hf")
logging.getLogger("transformers").removeHandler(catch)
ids = tok(prompt, add_special_tokens=False).input_ids
same = ids == mine["prompt_ids"] and not warned
ok &= same
print(f"{'ok' if same else 'FAIL'}: the exported llama3 tokenizer (AutoTokenizer, add_special_tokens=False) encodes the "
      f"prompt as Myriad does: {len(ids)} ids" + ("" if ids == mine["prompt_ids"] else f" vs {len(mine['prompt_ids'])}: {ids} / {mine['prompt_ids']}")
      + (f"; but transformers warned: {warned}" if warned else ", without a warning from transformers"))
# The export's config in transformers 5's form too (rope_parameters in place of rope_theta and
# rope_scaling): a copy of the folder, for transformers here and for Myriad's import below.
import shutil
shutil.copytree(f"{w}/hf", f"{w}/hf_v5")
c = json.load(open(f"{w}/hf_v5/config.json"))
c["rope_parameters"] = dict(c.pop("rope_scaling"), rope_theta=c.pop("rope_theta"))
json.dump(c, open(f"{w}/hf_v5/config.json", "w"), indent=2)
ref = torch.tensor(mine["logits"], dtype=torch.float64)
for folder, form in (("hf", "rope_theta and rope_scaling"), ("hf_v5", "rope_parameters")):
    model = LlamaForCausalLM.from_pretrained(f"{w}/{folder}", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        got = model(torch.tensor([mine["prompt_ids"]])).logits[0, -1].double()
    err = ((got - ref).norm() / ref.norm()).item()
    ok &= err < 1e-4
    print(f"{'ok' if err < 1e-4 else 'FAIL'}: LlamaForCausalLM.from_pretrained loads Myriad's export with {form} "
          f"(theta 500000, llama3 scaling; GQA 4 over 2, untied? {not model.config.tie_word_embeddings}); its logits "
          f"after the prompt are Myriad's within {err:.1e}")
sys.exit(0 if ok else 1)
PY
# Myriad's import of the transformers-5 form: the same model, the same logits.
"$B" import --hf "$W/hf_v5" --output "$W/v5_ckpt" >"$W/import_v5.log" 2>&1 &&
  "$B" sample --checkpoint "$W/v5_ckpt" --prompt "$P" --tokens 0 --logits "$W/v5.json" >"$W/sample_v5.log" 2>&1 &&
  python3 - "$W/myriad.json" "$W/v5.json" <<'PY' || { echo "FAIL: import of rope_parameters"; tail -3 "$W/import_v5.log"; fail=1; }
import json, sys, math
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a["logits"], b["logits"])))
r = math.sqrt(sum(y * y for y in a["logits"]))
ok = a["prompt_ids"] == b["prompt_ids"] and d / r < 1e-6
print(f"{'ok' if ok else 'FAIL'}: Myriad imports its export rewritten in transformers 5's form (rope_parameters) as the "
      f"same model: its logits are the original's within {d / r:.1e}")
sys.exit(0 if ok else 1)
PY
for dtype in float32 bfloat16; do
  python3 - "$W/tf_$dtype" "$dtype" <<'PY' || fail=1
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
d, dtype = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
import inspect
scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}
# transformers 5 takes rope_parameters (and saves them so); 4 takes rope_theta and rope_scaling.
rope = (dict(rope_parameters=dict(scaling, rope_theta=500000.0))
        if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters
        else dict(rope_theta=500000.0, rope_scaling=scaling))
cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, rms_norm_eps=1e-5, **rope)
model = LlamaForCausalLM(cfg).eval()
with torch.no_grad():  # weights of a visible scale, the norms not all ones
    for p in model.parameters():
        p.normal_(0, 0.3 if p.dim() == 1 else 0.05).add_(1.0 if p.dim() == 1 else 0.0)
model.to(getattr(torch, dtype)).save_pretrained(d, safe_serialization=True)
saved = json.load(open(f"{d}/config.json"))
print(f"   (transformers saved the rotary parameters as: {', '.join(k for k in ('rope_parameters', 'rope_theta', 'rope_scaling') if k in saved)})")
ids = list(b"Hello world, it's 12:34")
# The reference: the saved files loaded in fp32 (the bf16 weights widened exactly, the rotary
# frequencies computed afresh in fp32; the saved model's own, cast to bf16 with it, would lose
# digits a large theta needs).
with torch.no_grad():
    logits = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()(torch.tensor([ids])).logits[0, -1]
json.dump({"prompt_ids": ids, "logits": logits.tolist()}, open(f"{d}/transformers.json", "w"))
PY
  "$B" import --hf "$W/tf_$dtype" --output "$W/tf_${dtype}_ckpt" >"$W/import_$dtype.log" 2>&1 ||
    { echo "FAIL: import of transformers' $dtype Llama"; tail -3 "$W/import_$dtype.log"; fail=1; continue; }
  "$B" sample --checkpoint "$W/tf_${dtype}_ckpt" --prompt "Hello world, it's 12:34" --tokens 0 --logits "$W/tf_$dtype.json" \
    >"$W/sample_$dtype.log" 2>&1 || { echo "FAIL: sample of the imported $dtype model"; tail -3 "$W/sample_$dtype.log"; fail=1; continue; }
  python3 - "$W/tf_$dtype/transformers.json" "$W/tf_$dtype.json" "$dtype" <<'PY' || fail=1
import json, sys, math
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
same_ids = a["prompt_ids"] == b["prompt_ids"]
d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a["logits"], b["logits"])))
r = math.sqrt(sum(y * y for y in a["logits"]))
ok = same_ids and d / r < 1e-4
print(f"{'ok' if ok else 'FAIL'}: a random LlamaForCausalLM (theta 500000, llama3 scaling) saved by transformers in "
      f"{sys.argv[3]} imports; Myriad's logits are transformers' within {d / r:.1e}" + ("" if same_ids else " (the prompt ids differ)"))
sys.exit(0 if ok else 1)
PY
done
[ "$fail" = 0 ] || cp "$W"/*.log "${OUT:-/tmp/out}/" 2>/dev/null
rm -rf "$W"
exit $fail
