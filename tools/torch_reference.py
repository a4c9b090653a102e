#!/usr/bin/python3
"""Float64 PyTorch reference for Myriad's CPU backend tests.

    /usr/bin/python3 tools/torch_reference.py DIR      # read DIR/model.json, params.bin, tokens.bin
    /usr/bin/python3 tools/torch_reference.py --selftest
    /usr/bin/python3 tools/torch_reference.py --gpt2 HF_DIR DIR   # GPT-2 logits of DIR/tokens.bin

Given a model description, a flat float32 parameter buffer and a batch of tokens, computes in
float64 the logits, the loss, the gradients (by torch autograd) and the parameters after one
AdamW step and after one LAMB step, and writes them next to the inputs. tools/README.md gives
the exact file protocol. --selftest checks this script itself (autograd against finite
differences, the forward against a loop-by-loop NumPy version, both optimizer steps against
their formulas) and exits nonzero on failure.
"""
import argparse
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

LN_EPS = 1e-5


# ----------------------------------------------------------------------------------------------
# Model description


class Spec:
    """The fields of model.json that the forward pass and the optimizers need."""

    def __init__(self, js):
        self.layers = int(js["layers"])
        self.d_model = int(js["d_model"])
        self.heads = int(js["heads"])
        self.seq_len = int(js["seq_len"])
        self.vocab_size = int(js["vocab_size"])
        self.padded_vocab = int(js["padded_vocab"])
        self.window = int(js.get("window", 0))
        self.parallel_block = bool(js.get("parallel_block", False))
        self.bias = bool(js.get("bias", True))
        self.batch = int(js["batch"])
        self.params = [(p["name"], [int(d) for d in p["shape"]], int(p["offset"]))
                       for p in js["params"]]
        opt = js.get("optim", {})
        self.lr = float(opt.get("lr", 1e-3))
        self.beta1 = float(opt.get("beta1", 0.9))
        self.beta2 = float(opt.get("beta2", 0.95))
        self.eps = float(opt.get("eps", 1e-8))
        self.weight_decay = float(opt.get("weight_decay", 0.0))
        self.grad_clip = float(opt.get("grad_clip", 0.0))
        self.decay = set(js.get("decay", []))
        if self.d_model % self.heads != 0:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        unknown = self.decay - {name for name, _, _ in self.params}
        if unknown:
            raise ValueError(f"decay names unknown tensors: {sorted(unknown)}")

    def total(self):
        """Elements of the flat buffer the params list describes."""
        return max((off + math.prod(shape) for _, shape, off in self.params), default=0)


def views(flat, spec):
    """name -> view of `flat` with the tensor's shape."""
    out = {}
    for name, shape, off in spec.params:
        n = math.prod(shape)
        if off < 0 or off + n > flat.numel():
            raise ValueError(f"tensor {name} [{off}, {off + n}) is outside the buffer "
                             f"of {flat.numel()} elements")
        out[name] = flat[off:off + n].view(*shape)
    return out


# ----------------------------------------------------------------------------------------------
# Forward


def allowed_keys(T, window, device=None):
    """(T, T) bool: query i may attend to key j (causal, and i - j < window when window > 0)."""
    i = torch.arange(T, device=device).view(T, 1)
    j = torch.arange(T, device=device).view(1, T)
    ok = j <= i
    if window > 0:
        ok = ok & (i - j < window)
    return ok


def layer_norm(x, P, prefix):
    return F.layer_norm(x, (x.shape[-1],), P[prefix + ".w"], P.get(prefix + ".b"), LN_EPS)


def linear(x, P, prefix):
    return F.linear(x, P[prefix + ".w"], P.get(prefix + ".b"))


def attention(n, P, prefix, spec, ok):
    B, T, C = n.shape
    H = spec.heads
    D = C // H
    qkv = linear(n, P, prefix + ".qkv").view(B, T, H, 3, D)
    q = qkv[:, :, :, 0, :].transpose(1, 2)  # (B, H, T, D)
    k = qkv[:, :, :, 1, :].transpose(1, 2)
    v = qkv[:, :, :, 2, :].transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, T)
    scores = scores.masked_fill(~ok, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
    out = out.transpose(1, 2).reshape(B, T, C)  # per token (H, D)
    return linear(out, P, prefix + ".proj")


def mlp(n, P, prefix):
    return linear(F.gelu(linear(n, P, prefix + ".fc"), approximate="tanh"), P, prefix + ".proj")


def forward(P, spec, tokens):
    """tokens (B, T+1) int -> (logits (B, T, Vp), mean cross-entropy over the first V columns)."""
    T = tokens.shape[1] - 1
    x = tokens[:, :T].long()
    y = tokens[:, 1:].long()
    ok = allowed_keys(T, spec.window)
    h = P["wte"][x] + P["wpe"][:T]
    for l in range(spec.layers):
        p = f"h.{l}."
        if spec.parallel_block:
            n = layer_norm(h, P, p + "ln1")
            h = h + attention(n, P, p + "attn", spec, ok) + mlp(n, P, p + "mlp")
        else:
            a = h + attention(layer_norm(h, P, p + "ln1"), P, p + "attn", spec, ok)
            h = a + mlp(layer_norm(a, P, p + "ln2"), P, p + "mlp")
    h = layer_norm(h, P, "lnf")
    logits = h @ P["wte"].t()
    V = spec.vocab_size
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), y.reshape(-1))
    return logits, loss


def loss_and_grads(params64, spec, tokens):
    """params64: flat float64 tensor. Returns (logits, loss, flat gradient), all float64."""
    flat = params64.detach().clone().requires_grad_(True)
    logits, loss = forward(views(flat, spec), spec, tokens)
    loss.backward()
    return logits.detach(), loss.detach(), flat.grad.detach()


# ----------------------------------------------------------------------------------------------
# Optimizers (one step from zero state)


def clipped_grads(spec, grads64):
    """Per-tensor gradient copies, clipped as torch.nn.utils.clip_grad_norm_ does when
    grad_clip > 0 (coefficient min(1, clip / (norm + 1e-6)))."""
    G = {name: g.detach().clone() for name, g in views(grads64, spec).items()}
    if spec.grad_clip > 0:
        holders = []
        for name, _, _ in spec.params:
            t = torch.zeros_like(G[name], requires_grad=True)
            t.grad = G[name]
            holders.append(t)
        torch.nn.utils.clip_grad_norm_(holders, spec.grad_clip)
    return G


def adamw_step(spec, params64, G):
    """One torch.optim.AdamW step; decoupled weight decay only on the tensors in spec.decay."""
    W = views(params64.detach().clone(), spec)
    decayed, other = [], []
    tensors = {}
    for name, _, _ in spec.params:
        t = W[name].detach().clone().requires_grad_(True)
        t.grad = G[name].clone()
        tensors[name] = t
        (decayed if name in spec.decay else other).append(t)
    groups = [{"params": decayed, "weight_decay": spec.weight_decay},
              {"params": other, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    opt = torch.optim.AdamW(groups, lr=spec.lr, betas=(spec.beta1, spec.beta2), eps=spec.eps)
    opt.step()
    return assemble(spec, params64, {n: t.detach() for n, t in tensors.items()})


def lamb_step(spec, params64, G):
    """One LAMB step (You et al. 2019), per tensor, t = 1, zero initial moments."""
    W = views(params64.detach().clone(), spec)
    b1, b2, t = spec.beta1, spec.beta2, 1
    out = {}
    for name, _, _ in spec.params:
        w, g = W[name], G[name]
        m = b1 * torch.zeros_like(g) + (1 - b1) * g
        v = b2 * torch.zeros_like(g) + (1 - b2) * g * g
        mhat = m / (1 - b1 ** t)
        vhat = v / (1 - b2 ** t)
        u = mhat / (vhat.sqrt() + spec.eps)
        if name in spec.decay:
            u = u + spec.weight_decay * w
        wn, un = w.norm().item(), u.norm().item()
        trust = wn / un if wn > 0 and un > 0 else 1.0
        out[name] = w - spec.lr * trust * u
    return assemble(spec, params64, out)


def assemble(spec, params64, tensors):
    flat = params64.detach().clone()
    for name, shape, off in spec.params:
        flat[off:off + math.prod(shape)] = tensors[name].reshape(-1)
    return flat


# ----------------------------------------------------------------------------------------------
# The file protocol


def read_inputs(d):
    with open(os.path.join(d, "model.json")) as f:
        spec = Spec(json.load(f))
    params = np.fromfile(os.path.join(d, "params.bin"), dtype="<f4")
    if params.size < spec.total():
        raise ValueError(f"params.bin holds {params.size} floats, the layout needs {spec.total()}")
    tokens = np.fromfile(os.path.join(d, "tokens.bin"), dtype="<i4")
    want = spec.batch * (spec.seq_len + 1)
    if tokens.size != want:
        raise ValueError(f"tokens.bin holds {tokens.size} int32, expected batch x (seq_len + 1) "
                         f"= {want}")
    tokens = tokens.reshape(spec.batch, spec.seq_len + 1)
    if tokens.min() < 0 or tokens.max() >= spec.vocab_size:
        raise ValueError(f"tokens outside [0, {spec.vocab_size})")
    return spec, params, tokens


def write_f32(path, t):
    np.ascontiguousarray(t.detach().cpu().numpy().astype("<f4")).tofile(path)


def run_reference(d):
    """Reads DIR's inputs and writes every ref_* output. Returns float64 results for tests."""
    spec, params, tokens = read_inputs(d)
    params64 = torch.from_numpy(params.astype(np.float64))
    tok = torch.from_numpy(tokens.astype(np.int64))
    logits, loss, grads = loss_and_grads(params64, spec, tok)
    G = clipped_grads(spec, grads)
    adamw = adamw_step(spec, params64, G)
    lamb = lamb_step(spec, params64, G)
    write_f32(os.path.join(d, "ref_logits.bin"), logits)
    with open(os.path.join(d, "ref_loss.txt"), "w") as f:
        f.write(f"{loss.item():.17g}\n")
    write_f32(os.path.join(d, "ref_grads.bin"), grads)
    write_f32(os.path.join(d, "ref_adamw.bin"), adamw)
    write_f32(os.path.join(d, "ref_lamb.bin"), lamb)
    return {"logits": logits, "loss": loss.item(), "grads": grads, "adamw": adamw, "lamb": lamb}


# ----------------------------------------------------------------------------------------------
# Self-test


def tiny_layout(L, C, T, Vp, bias, parallel_block):
    """(params list, decay names) in Myriad's order for a small model."""
    params, decay = [], []
    off = 0

    def add(name, shape, dec):
        nonlocal off
        params.append({"name": name, "shape": shape, "offset": off})
        off += math.prod(shape)
        if dec:
            decay.append(name)

    def norm(p):
        add(p + ".w", [C], False)
        if bias:
            add(p + ".b", [C], False)

    def lin(p, o, i):
        add(p + ".w", [o, i], True)
        if bias:
            add(p + ".b", [o], False)

    add("wte", [Vp, C], True)
    add("wpe", [T, C], True)
    for l in range(L):
        h = f"h.{l}."
        norm(h + "ln1")
        lin(h + "attn.qkv", 3 * C, C)
        lin(h + "attn.proj", C, C)
        if not parallel_block:
            norm(h + "ln2")
        lin(h + "mlp.fc", 4 * C, C)
        lin(h + "mlp.proj", C, 4 * C)
    norm("lnf")
    return params, decay, off


def naive_forward(js, params, tokens):
    """Loop-by-loop NumPy float64 forward, written independently of forward() above."""
    C, H, V = js["d_model"], js["heads"], js["vocab_size"]
    D = C // H
    W = js["window"]
    P = {p["name"]: params[p["offset"]:p["offset"] + math.prod(p["shape"])].reshape(p["shape"])
         for p in js["params"]}
    B, T = tokens.shape[0], tokens.shape[1] - 1

    def ln(x, p):
        mu = x.mean()
        var = ((x - mu) ** 2).mean()
        y = (x - mu) / math.sqrt(var + LN_EPS) * P[p + ".w"]
        return y + P[p + ".b"] if p + ".b" in P else y

    def lin(x, p):
        y = P[p + ".w"] @ x
        return y + P[p + ".b"] if p + ".b" in P else y

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    logits = np.zeros((B, T, js["padded_vocab"]))
    total = 0.0
    for b in range(B):
        h = [P["wte"][tokens[b, t]] + P["wpe"][t] for t in range(T)]
        for l in range(js["layers"]):
            p = f"h.{l}."
            n = [ln(h[t], p + "ln1") for t in range(T)]
            qkv = [lin(n[t], p + "attn.qkv").reshape(H, 3, D) for t in range(T)]
            att = []
            for i in range(T):
                o = np.zeros((H, D))
                for hd in range(H):
                    keys = [j for j in range(i + 1) if W <= 0 or i - j < W]
                    s = np.array([qkv[i][hd, 0] @ qkv[j][hd, 1] / math.sqrt(D) for j in keys])
                    e = np.exp(s - s.max())
                    e /= e.sum()
                    for wgt, j in zip(e, keys):
                        o[hd] += wgt * qkv[j][hd, 2]
                att.append(lin(o.reshape(C), p + "attn.proj"))
            if js["parallel_block"]:
                h = [h[t] + att[t] + lin(gelu(lin(n[t], p + "mlp.fc")), p + "mlp.proj")
                     for t in range(T)]
            else:
                a = [h[t] + att[t] for t in range(T)]
                h = [a[t] + lin(gelu(lin(ln(a[t], p + "ln2"), p + "mlp.fc")), p + "mlp.proj")
                     for t in range(T)]
        for t in range(T):
            z = P["wte"] @ ln(h[t], "lnf")
            logits[b, t] = z
            zv = z[:V]
            m = zv.max()
            total += m + math.log(np.exp(zv - m).sum()) - zv[tokens[b, t + 1]]
    return logits, total / (B * T)


def naive_adamw(js, params, G):
    o = js["optim"]
    lr, b1, b2, eps, wd = o["lr"], o["beta1"], o["beta2"], o["eps"], o["weight_decay"]
    out = params.copy()
    for p in js["params"]:
        s = slice(p["offset"], p["offset"] + math.prod(p["shape"]))
        w, g = params[s], G[s]
        m, v = (1 - b1) * g, (1 - b2) * g * g
        w = w * (1 - lr * (wd if p["name"] in js["decay"] else 0.0))
        out[s] = w - lr / (1 - b1) * m / (np.sqrt(v) / math.sqrt(1 - b2) + eps)
    return out


def naive_lamb(js, params, G):
    o = js["optim"]
    lr, b1, b2, eps, wd = o["lr"], o["beta1"], o["beta2"], o["eps"], o["weight_decay"]
    out = params.copy()
    for p in js["params"]:
        s = slice(p["offset"], p["offset"] + math.prod(p["shape"]))
        w, g = params[s], G[s]
        u = g / (np.abs(g) + eps)  # mhat = g, sqrt(vhat) = |g| at t = 1
        if p["name"] in js["decay"]:
            u = u + wd * w
        wn, un = np.linalg.norm(w), np.linalg.norm(u)
        out[s] = w - lr * (wn / un if wn > 0 and un > 0 else 1.0) * u
    return out


def selftest_case(rng, parallel_block, window, bias, grad_clip, log):
    L, C, H, T, V, Vp, B = 2, 16, 4, 8, 50, 128, 3
    plist, decay, total = tiny_layout(L, C, T, Vp, bias, parallel_block)
    js = {"layers": L, "d_model": C, "heads": H, "seq_len": T, "vocab_size": V,
          "padded_vocab": Vp, "window": window, "parallel_block": parallel_block, "bias": bias,
          "batch": B, "params": plist,
          "optim": {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
                    "grad_clip": grad_clip},
          "decay": decay}
    # Large enough weights that attention is far from uniform and every path matters; the
    # padded rows of wte are nonzero on purpose (they must show in the logits, not the loss).
    params = np.zeros(total, dtype=np.float32)
    for p in plist:
        n = math.prod(p["shape"])
        s = slice(p["offset"], p["offset"] + n)
        if p["name"].endswith(".w") and len(p["shape"]) == 1:
            params[s] = 1.0 + 0.2 * rng.standard_normal(n)
        elif p["name"].endswith(".b"):
            params[s] = 0.2 * rng.standard_normal(n)
        else:
            params[s] = 0.4 * rng.standard_normal(n)
    tokens = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)
    name = (f"{'parallel' if parallel_block else 'sequential'} window={window} "
            f"bias={'on' if bias else 'off'} grad_clip={grad_clip}")
    failures = []

    def check(what, ok, detail):
        if not ok:
            failures.append(f"{what}: {detail}")

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "model.json"), "w") as f:
            json.dump(js, f)
        params.astype("<f4").tofile(os.path.join(d, "params.bin"))
        tokens.astype("<i4").tofile(os.path.join(d, "tokens.bin"))
        res = run_reference(d)
        files = {n: np.fromfile(os.path.join(d, f"ref_{n}.bin"), dtype="<f4")
                 for n in ("logits", "grads", "adamw", "lamb")}
        with open(os.path.join(d, "ref_loss.txt")) as f:
            loss_txt = float(f.read())

    p64 = params.astype(np.float64)
    # The files hold the float64 results rounded to float32.
    for n in ("logits", "grads", "adamw", "lamb"):
        check(f"ref_{n}.bin", np.array_equal(files[n], res[n].numpy().astype(np.float32).ravel()),
              "differs from the float64 result rounded to float32")
    check("ref_loss.txt", loss_txt == res["loss"], f"{loss_txt!r} != {res['loss']!r}")
    check("ref_grads.bin size", files["grads"].size == total, f"{files['grads'].size} != {total}")

    # Forward against the loop-by-loop version.
    nl, nloss = naive_forward(js, p64, tokens)
    err = np.abs(nl - res["logits"].numpy()).max()
    check("logits vs naive", err < 1e-10, f"max abs error {err:.3g}")
    check("loss vs naive", abs(nloss - res["loss"]) < 1e-12, f"{nloss!r} vs {res['loss']!r}")
    check("padded logits present", np.abs(res["logits"].numpy()[..., V:]).max() > 0,
          "padded columns are all zero")

    # Autograd against central differences: per tensor, two random elements and the largest.
    spec = Spec(js)
    grads = res["grads"].numpy()
    tok = torch.from_numpy(tokens.astype(np.int64))
    base = torch.from_numpy(p64)
    h = 1e-5
    worst = 0.0
    checked = 0
    with torch.no_grad():
        for p in plist:
            n = math.prod(p["shape"])
            g = grads[p["offset"]:p["offset"] + n]
            # wte's padded rows get no gradient: pick live rows for the random elements.
            live = V * C if p["name"] == "wte" else n
            idx = set(rng.integers(0, live, size=2).tolist()) | {int(np.abs(g).argmax())}
            for i in idx:
                k = p["offset"] + i
                plus, minus = base.clone(), base.clone()
                plus[k] += h
                minus[k] -= h
                fd = (forward(views(plus, spec), spec, tok)[1].item()
                      - forward(views(minus, spec), spec, tok)[1].item()) / (2 * h)
                e = abs(fd - grads[k]) / max(1e-3, abs(fd), abs(grads[k]))
                worst = max(worst, e)
                checked += 1
                check(f"grad {p['name']}[{i}]", e < 1e-5,
                      f"autograd {grads[k]:.10g} vs finite difference {fd:.10g}")
    pad = grads[V * C:Vp * C]  # wte is the first tensor
    check("padded wte rows' gradient", np.abs(pad).max() == 0, "nonzero")

    # Optimizers against their formulas, from independently clipped gradients.
    gn = np.linalg.norm(grads)
    coef = min(1.0, grad_clip / (gn + 1e-6)) if grad_clip > 0 else 1.0
    Gc = grads * coef
    for n, fn in (("adamw", naive_adamw), ("lamb", naive_lamb)):
        want = fn(js, p64, Gc)
        err = np.abs(want - res[n].numpy()).max()
        check(f"{n} vs formula", err < 1e-12, f"max abs error {err:.3g}")
    changed = np.abs(res["adamw"].numpy() - p64).max()
    check("adamw moved", changed > 0, "params unchanged")

    status = "ok" if not failures else "FAILED"
    log(f"  {name:<48} grad norm {gn:8.4f} clip x{coef:.4f}  {checked} FD checks, "
        f"worst rel err {worst:.2e}  {status}")
    for f_ in failures:
        log(f"    {f_}")
    return not failures


def selftest():
    torch.set_default_dtype(torch.float64)
    rng = np.random.default_rng(20240501)
    print("torch_reference.py selftest (torch %s, float64)" % torch.__version__)
    ok = True
    for parallel_block in (False, True):
        for window in (0, 3):
            for bias in (True, False):
                # Alternate clipping on/off so both paths are covered.
                clip = 0.5 if (window == 0) == bias else 0.0
                ok &= selftest_case(rng, parallel_block, window, bias, clip, print)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------------
# A Hugging Face GPT-2 directory (what `myriad export` writes), read without transformers or the
# safetensors package, run in GPT-2's own layout: Conv1D weights (in, out), c_attn's columns
# (q/k/v, head, dim), the head tied to wte.


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name} is {e['dtype']}, not F32")
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[base + a:base + b], dtype="<f4").reshape(e["shape"])
        out[name] = torch.from_numpy(arr.astype(np.float64))
    return out


def gpt2_forward(cfg, W, tokens):
    """tokens (B, T) long -> logits (B, T, vocab_size), float64."""
    B, T = tokens.shape
    C, H = cfg["n_embd"], cfg["n_head"]
    D = C // H
    eps = cfg.get("layer_norm_epsilon", 1e-5)

    def ln(x, p):
        return F.layer_norm(x, (C,), W[p + ".weight"], W[p + ".bias"], eps)

    def conv1d(x, p):
        return x @ W[p + ".weight"] + W[p + ".bias"]

    causal = torch.ones(T, T, dtype=torch.bool).tril()
    h = W["wte.weight"][tokens] + W["wpe.weight"][:T]
    for l in range(cfg["n_layer"]):
        p = f"h.{l}."
        q, k, v = conv1d(ln(h, p + "ln_1"), p + "attn.c_attn").split(C, dim=-1)
        q, k, v = [t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v)]
        s = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        o = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v
        h = h + conv1d(o.transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
        m = F.gelu(conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")  # gelu_new
        h = h + conv1d(m, p + "mlp.c_proj")
    return ln(h, "ln_f") @ W["wte.weight"].t()


def run_gpt2(hf_dir, io_dir):
    """io_dir/tokens.bin (int32, B x T, B and T in io_dir/tokens.json) -> io_dir/gpt2_logits.bin."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    W = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    with open(os.path.join(io_dir, "tokens.json")) as f:
        shape = json.load(f)
    tokens = np.fromfile(os.path.join(io_dir, "tokens.bin"), dtype="<i4").reshape(shape["batch"], shape["seq_len"])
    logits = gpt2_forward(cfg, W, torch.from_numpy(tokens.astype(np.int64)))
    write_f32(os.path.join(io_dir, "gpt2_logits.bin"), logits)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", help="directory holding model.json, params.bin, tokens.bin")
    ap.add_argument("--selftest", action="store_true", help="check this script and exit")
    ap.add_argument("--gpt2", metavar="HF_DIR", help="run the GPT-2 of HF_DIR on DIR/tokens.bin")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if args.gpt2:
        torch.set_default_dtype(torch.float64)
        try:
            run_gpt2(args.gpt2, args.dir)
        except (OSError, ValueError, KeyError) as e:
            print(f"torch_reference.py: {args.gpt2}: {e}", file=sys.stderr)
            return 2
        return 0
    if not args.dir:
        ap.error("give DIR or --selftest")
    torch.set_default_dtype(torch.float64)
    try:
        run_reference(args.dir)
    except (OSError, ValueError, KeyError) as e:
        print(f"torch_reference.py: {args.dir}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
