#!/usr/bin/python3
"""Float64 PyTorch reference for Myriad's CPU backend tests.

    /usr/bin/python3 tools/torch_reference.py DIR      # read DIR/model.json, params.bin, tokens.bin
                                                       # (and docs.bin when there: documents)
    /usr/bin/python3 tools/torch_reference.py --selftest
    /usr/bin/python3 tools/torch_reference.py --gpt2 HF_DIR DIR   # GPT-2 logits of DIR/tokens.bin
    /usr/bin/python3 tools/torch_reference.py --hf-write FAMILY DIR [--hf-generation 5]
                                                       # DIR/hf/, DIR/hf_logits.bin

Given a model description, a flat float32 parameter buffer and a batch of tokens, computes in
float64 the logits, the loss, the gradients (by torch autograd) and the parameters after one
AdamW step and after one LAMB step, and writes them next to the inputs. The model is Myriad's
GPT-2 or, through optional model.json fields, its Llama family (RMSNorm, rotary positions,
SwiGLU, grouped-query attention, an untied head). tools/README.md gives the exact file protocol.
--selftest checks this script itself (autograd against finite differences, the forward and its
pieces against loop-by-loop NumPy versions, both optimizer steps against their formulas, the
Hugging Face Llama writer against the forward) and exits nonzero on failure.

--hf-write converts a model.json + params.bin into a Hugging Face LlamaForCausalLM,
Qwen3ForCausalLM, Qwen3MoeForCausalLM or MixtralForCausalLM directory (config.json, model.safetensors written here, independently of Myriad's exporter) and
runs that directory with a separate forward in Hugging Face's own layout on DIR/tokens.bin,
so that a C++ test can import a directory Myriad did not write, and compare against logits that
a wrong reordering of rows would change.
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
        self.document_end_loss = bool(js.get("document_end_loss", True))
        self.parallel_block = bool(js.get("parallel_block", False))
        self.bias = bool(js.get("bias", True))
        self.batch = int(js["batch"])
        # The Llama family's choices; each default is GPT-2's.
        self.norm = str(js.get("norm", "layernorm"))
        self.norm_eps = float(js.get("norm_eps", 1e-5))  # RMSNorm's; LayerNorm's is LN_EPS
        self.positions = str(js.get("positions", "learned"))
        self.rope_theta = float(js.get("rope_theta", 10000.0))
        self.rope_scaling = rope_scaling(js.get("rope_scaling"))
        self.mlp = str(js.get("mlp", "gelu"))
        self.mlp_hidden = int(js.get("mlp_hidden", 4 * self.d_model))
        self.kv_heads = int(js.get("kv_heads", self.heads))
        self.head_dim = int(js.get("head_dim", 0)) or self.d_model // self.heads
        self.qk_norm = str(js.get("qk_norm", ""))  # "", "head" (Qwen3), "all" (OLMoE)
        self.tied = bool(js.get("tied", True))
        # A mixture of experts (docs/notes/moe.md): absent or 0 experts, a dense model.
        self.experts = int(js.get("experts", 0))
        self.top_k = int(js.get("experts_per_token", 0))
        self.expert_hidden = int(js.get("expert_hidden", 0))
        self.shared_hidden = int(js.get("shared_hidden", 0))  # the shared experts' features, all of them
        self.dense_layers = int(js.get("dense_layers", 0))
        self.moe_every = int(js.get("moe_every", 1))
        self.router_score = str(js.get("router_score", "softmax"))
        self.router_norm_topk = bool(js.get("router_norm_topk", True))
        self.router_scale = float(js.get("router_scale", 1.0))
        self.router_groups = int(js.get("router_groups", 1))
        self.router_top_groups = int(js.get("router_top_groups", 1))
        self.capacity_factor = float(js.get("capacity_factor", 0.0))
        self.aux_loss = float(js.get("aux_loss", 0.0))
        self.z_loss = float(js.get("z_loss", 0.0))
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
        if "head_dim" not in js and self.d_model % self.heads != 0:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        if self.kv_heads <= 0 or self.heads % self.kv_heads != 0:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        for key, value, allowed in (("norm", self.norm, ("layernorm", "rmsnorm")),
                                    ("positions", self.positions, ("learned", "rope")),
                                    ("mlp", self.mlp, ("gelu", "swiglu"))):
            if value not in allowed:
                raise ValueError(f"{key} {value!r} is not one of {allowed}")
        if self.positions == "rope" and self.head_dim % 2 != 0:
            raise ValueError(f"rope needs an even head dimension, not {self.head_dim}")
        if self.mlp_hidden <= 0:
            raise ValueError(f"mlp_hidden {self.mlp_hidden} is not positive")
        unknown = self.decay - {name for name, _, _ in self.params}
        if unknown:
            raise ValueError(f"decay names unknown tensors: {sorted(unknown)}")

    def layer_is_moe(self, l):
        """Qwen's decoder_sparse_step after DeepSeek's first_k_dense_replace."""
        return self.experts > 0 and l >= self.dense_layers and (l + 1) % self.moe_every == 0

    def total(self):
        """Elements of the flat buffer the params list describes."""
        return max((off + math.prod(shape) for _, shape, off in self.params), default=0)


def rope_scaling(js):
    """model.json's (or a Hugging Face config's) rope_scaling -> None or a dict of floats.
    Both spellings of the kind are taken: "type" (model.json) and "rope_type" (HF's config)."""
    if js is None:
        return None
    kind = js.get("type", js.get("rope_type"))
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not \"llama3\"")
    s = {k: float(js[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                   "original_max_position_embeddings")}
    if s["factor"] <= 0 or s["high_freq_factor"] <= s["low_freq_factor"]:
        raise ValueError(f"rope_scaling {js}: needs factor > 0 and high_freq_factor > "
                         f"low_freq_factor")
    return s


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


def document_keys(ok, docs):
    """(B, T, T) bool: ok (T, T) within each position's document, docs (B, T) the row index where
    it begins: the block-diagonal causal mask of packed documents, written out."""
    T = ok.shape[0]
    j = torch.arange(T).view(1, 1, T)
    return ok.view(1, T, T) & (j >= docs.view(docs.shape[0], T, 1))


def layer_norm(x, P, prefix):
    return F.layer_norm(x, (x.shape[-1],), P[prefix + ".w"], P.get(prefix + ".b"), LN_EPS)


def rms_norm(x, w, eps):
    """Hugging Face's LlamaRMSNorm: no mean subtracted, no bias."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def norm(x, P, prefix, spec):
    if spec.norm == "rmsnorm":
        return rms_norm(x, P[prefix + ".w"], spec.norm_eps)
    return layer_norm(x, P, prefix)


def linear(x, P, prefix):
    return F.linear(x, P[prefix + ".w"], P.get(prefix + ".b"))


def rope_frequencies(theta, D, scaling):
    """(D/2,) float64: pair i's angle per position, theta^(-2i/D), then, with Llama 3.1's
    scaling (transformers' _compute_llama3_parameters, written from its definition): pairs whose
    wavelength 2 pi / f is below original / high_freq_factor are kept, those above
    original / low_freq_factor slowed down by factor, and those in between blended linearly in
    original / wavelength."""
    f = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    if scaling is None:
        return f
    k, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / f
    smooth = (original / wavelength - lo) / (hi - lo)
    blended = (1 - smooth) * f / k + smooth * f
    return torch.where(wavelength < original / hi, f,
                       torch.where(wavelength > original / lo, f / k, blended))


def rotate(x, freqs):
    """Rotary positions on x (..., T, D), position t = row t: rotate-half, HF's convention, which
    pairs x[i] with x[i + D/2] (not x[2i] with x[2i + 1]), so HF's q/k weights need no
    permutation."""
    T, half = x.shape[-2], x.shape[-1] // 2
    angle = torch.arange(T, dtype=freqs.dtype).view(T, 1) * freqs.view(1, half)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def attend(q, k, v, ok):
    """q (B, H, T, D), k and v (B, Hkv, T, D) -> (B, H, T, D). Query head h reads key/value head
    h // G: the query heads are grouped against one broadcast key/value head rather than the
    key/value heads copied (Hugging Face's repeat_kv, which the selftest compares with)."""
    B, H, T, D = q.shape
    G = H // k.shape[1]
    if G > 1:
        q = q.reshape(B, H // G, G, T, D)
        k, v = k.unsqueeze(2), v.unsqueeze(2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, T), or (B, Hkv, G, T, T)
    if ok.dim() == 3:  # per row (documents): (B, 1, T, T) against the heads
        ok = ok.unsqueeze(1) if G == 1 else ok.view(B, 1, 1, T, T)
    scores = scores.masked_fill(~ok, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.reshape(B, H, T, D) if G > 1 else out


def attention(n, P, prefix, spec, ok, freqs):
    B, T, C = n.shape
    H, Hkv = spec.heads, spec.kv_heads
    G, D = H // Hkv, spec.head_dim
    # Per token (Hkv, G+2, D): each key/value group's G query heads, then its key, its value.
    qkv = linear(n, P, prefix + ".qkv").view(B, T, Hkv, G + 2, D)
    q = qkv[:, :, :, :G, :].reshape(B, T, H, D).transpose(1, 2)  # (B, H, T, D), h = g*G + j
    k = qkv[:, :, :, G, :].transpose(1, 2)  # (B, Hkv, T, D)
    v = qkv[:, :, :, G + 1, :].transpose(1, 2)
    if spec.qk_norm == "head":  # Qwen3: each head over its D features
        q = rms_norm(q, P[prefix + ".q_norm.w"], spec.norm_eps)
        k = rms_norm(k, P[prefix + ".k_norm.w"], spec.norm_eps)
    elif spec.qk_norm == "all":  # OLMoE: a token's queries together, its keys together
        def whole(x, w):
            flat = x.transpose(1, 2).reshape(B, T, -1)
            return rms_norm(flat, w, spec.norm_eps).view(B, T, -1, D).transpose(1, 2)
        q, k = whole(q, P[prefix + ".q_norm.w"]), whole(k, P[prefix + ".k_norm.w"])
    if freqs is not None:
        q, k = rotate(q, freqs), rotate(k, freqs)
    out = attend(q, k, v, ok)  # (B, H, T, D)
    out = out.transpose(1, 2).reshape(B, T, H * D)  # per token (H, D)
    return linear(out, P, prefix + ".proj")


def mlp(n, P, prefix, spec):
    u = linear(n, P, prefix + ".fc")
    if spec.mlp == "swiglu":
        # Gate and up interleaved per feature, (F, 2): a contiguous split of the features keeps
        # each tensor-parallel rank's gates with their ups.
        u = u.view(*u.shape[:-1], spec.mlp_hidden, 2)
        a = F.silu(u[..., 0]) * u[..., 1]
    else:
        a = F.gelu(u, approximate="tanh")
    return linear(a, P, prefix + ".proj")


def moe(n, P, prefix, spec, router):
    """A mixture of experts' MLP on n (B, T, C), written as directly as possible: every expert
    runs on every token, and each token takes its k chosen experts' rows (no permutation, unlike
    Myriad's). The k best scores win (a stable sort: a tie goes to the lower expert); the weights
    are the chosen scores, renormalized when router_norm_topk, times router_scale. Adds this
    layer's balance loss E sum_e f_e P_e (f_e the share of the N k slots sent to e, held
    constant; P_e the mean score) and z-loss (mean logsumexp^2) to router["aux"] and
    router["z"], and its rows per expert to router["counts"]."""
    B, T, C = n.shape
    x = n.reshape(B * T, C)
    N, E, k, Fe = B * T, spec.experts, spec.top_k, spec.expert_hidden
    logits = x @ P[prefix + ".router.w"].t()  # (N, E)
    scores = torch.softmax(logits, -1) if spec.router_score == "softmax" else torch.sigmoid(logits)
    keys = scores.detach()
    if prefix + ".router.bias" in P:  # DeepSeek-V3's: for the choice only, never in the weights
        keys = keys + P[prefix + ".router.bias"].detach()
    G = spec.router_groups
    if G > 1:  # only the router_top_groups groups whose two best keys sum highest
        per = E // G
        group_keys = keys.view(N, G, per).topk(min(2, per), dim=-1).values.sum(-1)  # (N, G)
        top = torch.sort(group_keys, dim=-1, descending=True, stable=True).indices[:, :spec.router_top_groups]
        allowed = torch.zeros(N, G, dtype=torch.bool).scatter(1, top, True)
        keys = keys.masked_fill(~allowed.repeat_interleave(per, dim=1), float("-inf"))
    ranked = torch.sort(keys, dim=-1, descending=True, stable=True)
    choice = ranked.indices[:, :k]  # (N, k)
    if k < E:  # tokens whose k-th and (k+1)-th scores are equal: the tie rule decides
        router["ties"] = router.get("ties", 0) + int((ranked.values[:, k - 1] == ranked.values[:, k]).sum())
    chosen = scores.gather(1, choice)
    w = chosen / chosen.sum(-1, keepdim=True) if spec.router_norm_topk else chosen
    w = w * spec.router_scale
    keep = torch.ones(N, k, dtype=torch.bool)
    if spec.capacity_factor > 0:  # each expert keeps its rows of the highest weights, ties to the lower slot
        cap = math.ceil(spec.capacity_factor * N * k / E)
        flat_w, flat_c = w.detach().reshape(-1), choice.reshape(-1)
        for e in range(E):
            slots = (flat_c == e).nonzero().flatten()  # ascending slot n k + j
            if len(slots) > cap:
                ranked_slots = slots[torch.sort(flat_w[slots], descending=True, stable=True).indices]
                keep.view(-1)[ranked_slots[cap:]] = False
        router["dropped"] = router.get("dropped", 0) + int((~keep).sum())
    fc = P[prefix + ".experts.fc.w"].view(E, Fe, 2, C)  # expert e's features, each (gate, up)
    proj = P[prefix + ".experts.proj.w"].view(E, C, Fe)
    y = torch.stack([(F.silu(x @ fc[e, :, 0].t()) * (x @ fc[e, :, 1].t())) @ proj[e].t() for e in range(E)])  # (E, N, C)
    picked = y[choice, torch.arange(N).view(N, 1)]  # (N, k, C)
    out = ((w * keep).unsqueeze(-1) * picked).sum(1)
    if spec.shared_hidden > 0:
        sfc = P[prefix + ".shared.fc.w"].view(spec.shared_hidden, 2, C)
        out = out + (F.silu(x @ sfc[:, 0].t()) * (x @ sfc[:, 1].t())) @ P[prefix + ".shared.proj.w"].t()
    counts = F.one_hot(choice, E).sum((0, 1))
    f = counts.to(scores.dtype) / (N * k)
    router["aux"] = router.get("aux", 0) + E * (f * scores.mean(0)).sum()  # (f holds no gradient)
    router["z"] = router.get("z", 0) + (torch.logsumexp(logits, -1) ** 2).mean()
    router.setdefault("counts", []).append([int(c) for c in counts])
    return out.view(B, T, C)


def mlp_of(n, P, l, spec, router):
    p = f"h.{l}.mlp"
    return moe(n, P, p, spec, router) if spec.layer_is_moe(l) else mlp(n, P, p, spec)


def forward(P, spec, tokens, docs=None, router=None):
    """tokens (B, T+1) int -> (logits (B, T, Vp), mean cross-entropy over the first V columns).
    docs (B, T+1), when given, keeps attention inside the documents packed in each row; with
    spec.document_end_loss false the loss leaves out the targets that begin a document."""
    T = tokens.shape[1] - 1
    x = tokens[:, :T].long()
    y = tokens[:, 1:].long()
    ok = allowed_keys(T, spec.window)
    if docs is not None:
        ok = document_keys(ok, docs[:, :T])
        if not spec.document_end_loss:
            y = y.masked_fill(docs[:, 1:] == torch.arange(1, T + 1).view(1, T), -100)
    freqs = None
    if spec.positions == "rope":
        freqs = rope_frequencies(spec.rope_theta, spec.head_dim, spec.rope_scaling)
        h = P["wte"][x]
    else:
        h = P["wte"][x] + P["wpe"][:T]
    router = {} if router is None else router
    for l in range(spec.layers):
        p = f"h.{l}."
        if spec.parallel_block:
            n = norm(h, P, p + "ln1", spec)
            h = h + attention(n, P, p + "attn", spec, ok, freqs) + mlp_of(n, P, l, spec, router)
        else:
            a = h + attention(norm(h, P, p + "ln1", spec), P, p + "attn", spec, ok, freqs)
            h = a + mlp_of(norm(a, P, p + "ln2", spec), P, l, spec, router)
    h = norm(h, P, "lnf", spec)
    logits = h @ P["wte" if spec.tied else "lm_head"].t()
    V = spec.vocab_size
    loss = F.cross_entropy(logits[..., :V].reshape(-1, V), y.reshape(-1), ignore_index=-100)
    return logits, loss


def loss_and_grads(params64, spec, tokens, docs=None):
    """params64: flat float64 tensor. Returns (logits, loss, flat gradient), all float64."""
    flat = params64.detach().clone().requires_grad_(True)
    router = {}
    logits, loss = forward(views(flat, spec), spec, tokens, docs, router)
    # The routers' losses count in the gradient, not in the loss reported (the model's).
    total = loss + spec.aux_loss * router.get("aux", 0) + spec.z_loss * router.get("z", 0)
    total.backward()
    loss_and_grads.router = router
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
    docs = None
    if os.path.exists(os.path.join(d, "docs.bin")):
        docs = torch.from_numpy(np.fromfile(os.path.join(d, "docs.bin"), dtype="<i4").astype(np.int64))
        docs = docs.view(spec.batch, spec.seq_len + 1)
    logits, loss, grads = loss_and_grads(params64, spec, tok, docs)
    G = clipped_grads(spec, grads)
    adamw = adamw_step(spec, params64, G)
    lamb = lamb_step(spec, params64, G)
    write_f32(os.path.join(d, "ref_logits.bin"), logits)
    with open(os.path.join(d, "ref_loss.txt"), "w") as f:
        f.write(f"{loss.item():.17g}\n")
    write_f32(os.path.join(d, "ref_grads.bin"), grads)
    write_f32(os.path.join(d, "ref_adamw.bin"), adamw)
    write_f32(os.path.join(d, "ref_lamb.bin"), lamb)
    router = loss_and_grads.router
    if "counts" in router:  # what the routing did, so that a test can tell its case happened
        with open(os.path.join(d, "ref_router.json"), "w") as f:
            json.dump({"counts": router["counts"], "ties": router.get("ties", 0), "dropped": router.get("dropped", 0),
                       "aux": float(router["aux"]),
                       "z": float(router["z"])}, f)
    return {"logits": logits, "loss": loss.item(), "grads": grads, "adamw": adamw, "lamb": lamb}


# ----------------------------------------------------------------------------------------------
# Self-test


def tiny_layout(js):
    """(params list, decay names, total) in Myriad's order for the small model `js` describes."""
    L, C, H, T, Vp = js["layers"], js["d_model"], js["heads"], js["seq_len"], js["padded_vocab"]
    bias, D = js.get("bias", True), C // H
    Hkv, Fh = js.get("kv_heads", H), js.get("mlp_hidden", 4 * C)
    rms = js.get("norm", "layernorm") == "rmsnorm"
    params, decay = [], []
    off = 0

    def add(name, shape, dec):
        nonlocal off
        params.append({"name": name, "shape": shape, "offset": off})
        off += math.prod(shape)
        if dec:
            decay.append(name)

    def norm_(p):
        add(p + ".w", [C], False)
        if bias and not rms:
            add(p + ".b", [C], False)

    def lin(p, o, i):
        add(p + ".w", [o, i], True)
        if bias:
            add(p + ".b", [o], False)

    add("wte", [Vp, C], True)
    if js.get("positions", "learned") == "learned":
        add("wpe", [T, C], True)
    for l in range(L):
        h = f"h.{l}."
        norm_(h + "ln1")
        lin(h + "attn.qkv", (H + 2 * Hkv) * D, C)
        lin(h + "attn.proj", C, H * D)
        if not js.get("parallel_block", False):
            norm_(h + "ln2")
        lin(h + "mlp.fc", (2 if js.get("mlp", "gelu") == "swiglu" else 1) * Fh, C)
        lin(h + "mlp.proj", C, Fh)
    norm_("lnf")
    if not js.get("tied", True):
        add("lm_head", [Vp, C], True)
    return params, decay, off


def random_params(rng, plist, total):
    """Large enough weights that attention is far from uniform and every path matters; the
    padded rows of wte (and lm_head) are nonzero on purpose (they must show in the logits, not
    the loss)."""
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
    return params


def naive_rope_frequencies(theta, D, scaling):
    """Pair by pair, from the definition of Llama 3.1's scaling (see rope_frequencies)."""
    out = []
    for i in range(D // 2):
        f = 1.0 / theta ** (2 * i / D)
        if scaling is not None:
            k, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
            original = scaling["original_max_position_embeddings"]
            wavelength = 2 * math.pi / f
            if wavelength < original / hi:
                pass  # high frequency: as it was
            elif wavelength > original / lo:
                f = f / k  # low frequency: slowed down
            else:
                s = (original / wavelength - lo) / (hi - lo)
                f = (1 - s) * f / k + s * f
        out.append(f)
    return np.array(out)


def naive_rotate(x, t, freqs):
    """One head vector x (D,) at position t."""
    half = len(x) // 2
    y = np.empty_like(x)
    for i in range(half):
        c, s = math.cos(t * freqs[i]), math.sin(t * freqs[i])
        y[i] = x[i] * c - x[i + half] * s
        y[i + half] = x[i + half] * c + x[i] * s
    return y


def naive_attend(q, k, v, W):
    """q (T, H, D), k and v (T, Hkv, D) of one sequence -> (T, H, D), loop by loop."""
    T, H, D = q.shape
    G = H // k.shape[1]
    out = np.zeros((T, H, D))
    for i in range(T):
        keys = [j for j in range(i + 1) if W <= 0 or i - j < W]
        for hd in range(H):
            g = hd // G
            s = np.array([q[i, hd] @ k[j, g] / math.sqrt(D) for j in keys])
            e = np.exp(s - s.max())
            e /= e.sum()
            for wgt, j in zip(e, keys):
                out[i, hd] += wgt * v[j, g]
    return out


def naive_forward(js, params, tokens):
    """Loop-by-loop NumPy float64 forward, written independently of forward() above."""
    C, H, V = js["d_model"], js["heads"], js["vocab_size"]
    D = C // H
    Hkv = js.get("kv_heads", H)
    G = H // Hkv
    Fh = js.get("mlp_hidden", 4 * C)
    W = js["window"]
    rms = js.get("norm", "layernorm") == "rmsnorm"
    eps = js.get("norm_eps", 1e-5)
    rope = js.get("positions", "learned") == "rope"
    swiglu = js.get("mlp", "gelu") == "swiglu"
    head = "wte" if js.get("tied", True) else "lm_head"
    P = {p["name"]: params[p["offset"]:p["offset"] + math.prod(p["shape"])].reshape(p["shape"])
         for p in js["params"]}
    B, T = tokens.shape[0], tokens.shape[1] - 1
    if rope:
        freqs = naive_rope_frequencies(js.get("rope_theta", 10000.0), D, js.get("rope_scaling"))

    def ln(x, p):
        if rms:
            return x / math.sqrt((x * x).mean() + eps) * P[p + ".w"]
        mu = x.mean()
        var = ((x - mu) ** 2).mean()
        y = (x - mu) / math.sqrt(var + LN_EPS) * P[p + ".w"]
        return y + P[p + ".b"] if p + ".b" in P else y

    def lin(x, p):
        y = P[p + ".w"] @ x
        return y + P[p + ".b"] if p + ".b" in P else y

    def act(u):
        if swiglu:
            return np.array([u[2 * f] / (1 + math.exp(-u[2 * f])) * u[2 * f + 1]
                             for f in range(Fh)])
        return 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))

    def attn(n, p):
        q, k, v = np.zeros((T, H, D)), np.zeros((T, Hkv, D)), np.zeros((T, Hkv, D))
        for t in range(T):
            r = lin(n[t], p + "attn.qkv").reshape(Hkv, G + 2, D)
            for hd in range(H):
                q[t, hd] = r[hd // G, hd % G]
            k[t], v[t] = r[:, G], r[:, G + 1]
            if rope:
                q[t] = [naive_rotate(x, t, freqs) for x in q[t]]
                k[t] = [naive_rotate(x, t, freqs) for x in k[t]]
        o = naive_attend(q, k, v, W)
        return [lin(o[t].reshape(H * D), p + "attn.proj") for t in range(T)]

    logits = np.zeros((B, T, js["padded_vocab"]))
    total = 0.0
    for b in range(B):
        h = [P["wte"][tokens[b, t]] + (0 if rope else P["wpe"][t]) for t in range(T)]
        for l in range(js["layers"]):
            p = f"h.{l}."
            n = [ln(h[t], p + "ln1") for t in range(T)]
            att = attn(n, p)
            if js["parallel_block"]:
                h = [h[t] + att[t] + lin(act(lin(n[t], p + "mlp.fc")), p + "mlp.proj")
                     for t in range(T)]
            else:
                a = [h[t] + att[t] for t in range(T)]
                h = [a[t] + lin(act(lin(ln(a[t], p + "ln2"), p + "mlp.fc")), p + "mlp.proj")
                     for t in range(T)]
        for t in range(T):
            z = P[head] @ ln(h[t], "lnf")
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


def selftest_case(rng, parallel_block, window, bias, grad_clip, log, arch=None):
    """One model through the whole file protocol. `arch`: extra model.json fields (the Llama
    family's, and d_model/heads to override the GPT-2 cases' 16/4)."""
    L, C, H, T, V, Vp, B = 2, 16, 4, 8, 50, 128, 3
    js = {"layers": L, "d_model": C, "heads": H, "seq_len": T, "vocab_size": V,
          "padded_vocab": Vp, "window": window, "parallel_block": parallel_block, "bias": bias,
          "batch": B}
    js.update(arch or {})
    C = js["d_model"]
    plist, decay, total = tiny_layout(js)
    js.update({"params": plist,
               "optim": {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                         "weight_decay": 0.1, "grad_clip": grad_clip},
               "decay": decay})
    params = random_params(rng, plist, total)
    tokens = rng.integers(0, V, size=(B, T + 1)).astype(np.int32)
    name = (f"{'parallel' if parallel_block else 'sequential'} window={window} "
            f"bias={'on' if bias else 'off'} grad_clip={grad_clip}")
    if arch:
        name = (("par " if parallel_block else "") + arch_name(js)
                + f" w={window} b={'on' if bias else 'off'} c={grad_clip}")
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
            # The padded vocabulary rows get no gradient: pick live rows for the random elements.
            live = V * C if p["name"] in ("wte", "lm_head") else n
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
    for p in plist:
        if p["name"] in ("wte", "lm_head"):
            pad = grads[p["offset"] + V * C:p["offset"] + Vp * C]
            check(f"padded {p['name']} rows' gradient", np.abs(pad).max() == 0, "nonzero")

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


def arch_name(js):
    """A short name of a model's Llama-family choices, for the selftest's lines."""
    H = js["heads"]
    Hkv = js.get("kv_heads", H)
    parts = ["rms" if js.get("norm") == "rmsnorm" else "ln",
             "rope" if js.get("positions") == "rope" else "wpe", js.get("mlp", "gelu"),
             f"G={H // Hkv}", "tied" if js.get("tied", True) else "untied"]
    if js.get("rope_scaling"):
        parts.append("llama3")
    return " ".join(parts)


def selftest_pieces(rng, log):
    """The Llama family's pieces one by one against loop-by-loop NumPy versions: a mistake shows
    here by name before it shows as a logits mismatch of a whole model."""
    failures = []

    def check(what, err, tol):
        if not err < tol:
            failures.append(f"{what}: max abs error {err:.3g}")

    # RoPE frequencies, with and without scaling; each scaled case must reach all three of the
    # scaling's regimes (kept, slowed, blended) or it would not test them.
    llama31 = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    small = {"type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 128}
    for theta, D, js in ((10000.0, 8, None), (500000.0, 128, llama31), (10000.0, 8, small),
                         (10000.0, 64, small)):
        s = rope_scaling(js)
        got = rope_frequencies(theta, D, s).numpy()
        want = naive_rope_frequencies(theta, D, s)
        check(f"rope_frequencies theta={theta} D={D} {js and js['factor']}",
              np.abs(got / want - 1).max(), 1e-14)
        if s:
            f = theta ** (-np.arange(0, D, 2) / D)
            wl = 2 * math.pi / f
            o = s["original_max_position_embeddings"]
            regimes = {int(w < o / s["high_freq_factor"]) - int(w > o / s["low_freq_factor"])
                       for w in wl}  # 1 kept, -1 slowed, 0 blended
            if regimes != {-1, 0, 1}:
                failures.append(f"rope case theta={theta} D={D} misses a scaling regime")
            if np.abs(got - f).max() == 0:
                failures.append(f"rope case theta={theta} D={D}: scaling changed nothing")

    # Rotation of every head at every position.
    for D, s in ((8, None), (16, small)):
        x = torch.from_numpy(rng.standard_normal((2, 3, 12, D)))
        freqs = rope_frequencies(10000.0, D, rope_scaling(s))
        got = rotate(x, freqs).numpy()
        want = np.array([[[naive_rotate(x[b, h, t].numpy(), t, freqs.numpy())
                           for t in range(12)] for h in range(3)] for b in range(2)])
        check(f"rotate D={D}", np.abs(got - want).max(), 1e-14)

    # Grouped-query attention: against the loop version and against copied key/value heads.
    B, H, T, D = 2, 4, 7, 8
    for Hkv in (4, 2, 1):
        for W in (0, 3):
            q = torch.from_numpy(rng.standard_normal((B, H, T, D)))
            k, v = (torch.from_numpy(rng.standard_normal((B, Hkv, T, D))) for _ in range(2))
            ok = allowed_keys(T, W)
            got = attend(q, k, v, ok)
            per_token = [t.transpose(1, 2).numpy() for t in (q, k, v)]  # (B, T, heads, D)
            want = np.stack([naive_attend(*(t[b] for t in per_token), W).transpose(1, 0, 2)
                             for b in range(B)])
            check(f"attend G={H // Hkv} window={W} vs loops", np.abs(got.numpy() - want).max(),
                  1e-13)
            G = H // Hkv
            copied = attend(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1), ok)
            check(f"attend G={G} window={W} vs copied heads", (got - copied).abs().max().item(),
                  1e-14)

    # SwiGLU (interleaved gate/up) and RMSNorm, row by row.
    C, Fh = 8, 6
    spec = Spec({"layers": 1, "d_model": C, "heads": 1, "seq_len": 1, "vocab_size": 1,
                 "padded_vocab": 1, "batch": 1, "params": [], "mlp": "swiglu", "mlp_hidden": Fh,
                 "norm": "rmsnorm", "norm_eps": 1e-3})
    P = {"m.fc.w": torch.from_numpy(rng.standard_normal((2 * Fh, C))),
         "m.fc.b": torch.from_numpy(rng.standard_normal(2 * Fh)),
         "m.proj.w": torch.from_numpy(rng.standard_normal((C, Fh))),
         "n.w": torch.from_numpy(rng.standard_normal(C))}
    x = torch.from_numpy(rng.standard_normal((3, 5, C)))
    got = mlp(x, P, "m", spec).numpy()
    Pn = {k_: t.numpy() for k_, t in P.items()}
    want = np.zeros((3, 5, C))
    for i in range(3):
        for t in range(5):
            u = Pn["m.fc.w"] @ x[i, t].numpy() + Pn["m.fc.b"]
            a = [u[2 * f] / (1 + math.exp(-u[2 * f])) * u[2 * f + 1] for f in range(Fh)]
            want[i, t] = Pn["m.proj.w"] @ np.array(a)
    check("swiglu mlp", np.abs(got - want).max(), 1e-12)
    got = norm(x, P, "n", spec).numpy()
    want = np.array([[[x[i, t, c].item() / math.sqrt(sum(x[i, t].numpy() ** 2) / C + 1e-3)
                       * Pn["n.w"][c] for c in range(C)] for t in range(5)] for i in range(3)])
    check("rmsnorm", np.abs(got - want).max(), 1e-13)

    log(f"  {'llama pieces: rope, rotate, GQA attend, swiglu, rmsnorm':<48} "
        f"{'ok' if not failures else 'FAILED'}")
    for f_ in failures:
        log(f"    {f_}")
    return not failures


def selftest_hf_llama(rng, log):
    """--hf-write llama on tiny Llamas: the HF-layout forward of what it wrote must give the
    Myriad-layout forward's logits, and must not when rows are misplaced."""
    failures = []
    cases = 0
    for Hkv in (4, 2, 1):
        for tied in (False, True):
            js = {"layers": 2, "d_model": 32, "heads": 4, "seq_len": 8, "vocab_size": 50,
                  "padded_vocab": 128, "batch": 2, "bias": False, "norm": "rmsnorm",
                  "norm_eps": 1e-6, "positions": "rope", "rope_theta": 500.0, "mlp": "swiglu",
                  "mlp_hidden": 24, "kv_heads": Hkv, "tied": tied,
                  "rope_scaling": None if Hkv == 4 else
                  {"type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}
            js["params"], _, total = tiny_layout(js)
            params = random_params(rng, js["params"], total)
            tokens = rng.integers(0, 50, size=(2, 9)).astype(np.int32)
            what = f"hf llama G={4 // Hkv} {'tied' if tied else 'untied'}"
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "model.json"), "w") as f:
                    json.dump(js, f)
                params.astype("<f4").tofile(os.path.join(d, "params.bin"))
                tokens.astype("<i4").tofile(os.path.join(d, "tokens.bin"))
                run_hf_write(d)
                hf = np.fromfile(os.path.join(d, "hf_logits.bin"), dtype="<f8").reshape(2, 8, 50)
                with open(os.path.join(d, "hf", "config.json")) as f:
                    cfg = json.load(f)
                W = read_safetensors(os.path.join(d, "hf", "model.safetensors"))
            spec = Spec(js)
            logits, _ = forward(views(torch.from_numpy(params.astype(np.float64)), spec),
                                spec, torch.from_numpy(tokens.astype(np.int64)))
            err = np.abs(hf - logits[..., :50].numpy()).max()
            cases += 1
            if not err < 1e-12:
                failures.append(f"{what}: HF-layout logits differ by {err:.3g}")
            want = {"model.embed_tokens.weight": [50, 32], "model.norm.weight": [32]}
            for l in range(2):
                p = f"model.layers.{l}."
                want.update({p + "input_layernorm.weight": [32],
                             p + "post_attention_layernorm.weight": [32],
                             p + "self_attn.q_proj.weight": [32, 32],
                             p + "self_attn.k_proj.weight": [8 * Hkv, 32],
                             p + "self_attn.v_proj.weight": [8 * Hkv, 32],
                             p + "self_attn.o_proj.weight": [32, 32],
                             p + "mlp.gate_proj.weight": [24, 32],
                             p + "mlp.up_proj.weight": [24, 32],
                             p + "mlp.down_proj.weight": [32, 24]})
            if not tied:
                want["lm_head.weight"] = [50, 32]
            got = {n: list(t.shape) for n, t in W.items()}
            if got != want:
                odd = sorted(n for n in set(got) | set(want) if got.get(n) != want.get(n))
                failures.append(f"{what}: tensors {[(n, got.get(n), want.get(n)) for n in odd]}")
            heads = (cfg["num_key_value_heads"], cfg["tie_word_embeddings"], cfg["head_dim"])
            if heads != (Hkv, tied, 8):
                failures.append(f"{what}: config.json {cfg}")
            # The check must see a misplaced row: two query heads of one group exchanged, or
            # gate and up exchanged, must change the logits.
            if Hkv == 2 and not tied:
                q, gate, up = (W[n] for n in ("model.layers.0.self_attn.q_proj.weight",
                                              "model.layers.1.mlp.gate_proj.weight",
                                              "model.layers.1.mlp.up_proj.weight"))
                for swap, changed in (
                        ("q heads", {"model.layers.0.self_attn.q_proj.weight":
                                     torch.cat((q[8:16], q[:8], q[16:]))}),
                        ("gate/up", {"model.layers.1.mlp.gate_proj.weight": up,
                                     "model.layers.1.mlp.up_proj.weight": gate})):
                    bad = hf_forward(cfg, {**W, **changed},
                                        torch.from_numpy(tokens[:, :8].astype(np.int64)))
                    if not np.abs(bad.numpy() - hf).max() > 1e-3:
                        failures.append(f"{what}: {swap} exchanged leaves the logits unchanged")
    log(f"  {'hf llama writer: G=1,2,4, tied and untied':<48} {cases} cases, HF-layout forward "
        f"{'ok' if not failures else 'FAILED'}")
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
    # The Llama family: whole models, then mixes of its choices with GPT-2's (each choice is
    # independent of the others in the forward), with bias on for RoPE after the QKV bias.
    llama = {"d_model": 32, "norm": "rmsnorm", "positions": "rope", "mlp": "swiglu",
             "mlp_hidden": 24}
    scaled = {"type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32}
    for parallel_block, window, bias, clip, arch in (
            (False, 0, False, 0.5, {**llama, "kv_heads": 2, "tied": False, "rope_scaling": scaled}),
            (False, 3, True, 0.0, {**llama, "norm_eps": 1e-6, "rope_theta": 500.0}),
            (True, 0, False, 0.0, {**llama, "kv_heads": 1, "tied": False}),
            (False, 0, True, 0.5, {"positions": "rope", "kv_heads": 2}),
            (True, 3, True, 0.0, {"norm": "rmsnorm", "mlp": "swiglu", "tied": False})):
        ok &= selftest_case(rng, parallel_block, window, bias, clip, print, arch)
    ok &= selftest_pieces(rng, print)
    ok &= selftest_hf_llama(rng, print)
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


# ----------------------------------------------------------------------------------------------
# A Hugging Face Llama directory (LlamaForCausalLM) written from a Myriad Llama, independently of
# `myriad export`, and run by its own forward in Hugging Face's layout (q/k/v/o_proj,
# gate/up/down_proj, repeat_kv), which shares nothing with forward() above but
# rope_frequencies: a row put in the wrong place changes its logits.


HF_FAMILIES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}


def hf_config(spec, family, generation=4):
    """config.json's fields for one of HF_FAMILIES, as transformers 4 writes them (rope_theta
    and rope_scaling, Qwen3-MoE's num_experts) or 5 (rope_parameters, num_local_experts)."""
    s = spec.rope_scaling
    scaling = None if s is None else {
        "rope_type": "llama3", "factor": s["factor"],
        "low_freq_factor": s["low_freq_factor"], "high_freq_factor": s["high_freq_factor"],
        "original_max_position_embeddings": int(s["original_max_position_embeddings"])}
    cfg = {"architectures": [HF_FAMILIES[family]],
           "model_type": family,
           "hidden_size": spec.d_model,
           "intermediate_size": spec.mlp_hidden,
           "num_hidden_layers": spec.layers,
           "num_attention_heads": spec.heads,
           "num_key_value_heads": spec.kv_heads,
           "head_dim": spec.head_dim,
           "rms_norm_eps": spec.norm_eps,
           "max_position_embeddings": spec.seq_len,
           "vocab_size": spec.vocab_size,
           "tie_word_embeddings": spec.tied,
           "hidden_act": "silu",
           "torch_dtype": "float32"}
    if generation >= 5:
        cfg["rope_parameters"] = {"rope_theta": spec.rope_theta, **(scaling or {"rope_type": "default"})}
    else:
        cfg["rope_theta"], cfg["rope_scaling"] = spec.rope_theta, scaling
    if family == "llama":
        cfg.update({"attention_bias": False, "mlp_bias": False})
    if family in ("qwen3", "qwen3_moe"):
        cfg.update({"attention_bias": False, "use_sliding_window": False, "sliding_window": None})
    if family == "qwen3_moe":
        cfg.update({"num_local_experts" if generation >= 5 else "num_experts": spec.experts,
                    "num_experts_per_tok": spec.top_k,
                    "moe_intermediate_size": spec.expert_hidden,
                    "norm_topk_prob": spec.router_norm_topk,
                    "decoder_sparse_step": spec.moe_every,
                    "mlp_only_layers": list(range(spec.dense_layers))})
    if family == "mixtral":
        cfg.update({"num_local_experts": spec.experts, "num_experts_per_tok": spec.top_k,
                    "intermediate_size": spec.expert_hidden, "sliding_window": None})
    return cfg


def hf_tensors(spec, P, family):
    """Myriad's float32 tensors (name -> array) -> Hugging Face's: rows reordered, never
    changed. Both rotate halves, so a head's rows keep their order; the padded vocabulary rows
    are dropped."""
    C, H, Hkv, Fh, V = spec.d_model, spec.heads, spec.kv_heads, spec.mlp_hidden, spec.vocab_size
    D, G, E, Fe = spec.head_dim, H // Hkv, spec.experts, spec.expert_hidden
    out = {"model.embed_tokens.weight": P["wte"][:V]}
    for l in range(spec.layers):
        m, h = f"h.{l}.", f"model.layers.{l}."
        qkv = P[m + "attn.qkv.w"].reshape(Hkv, G + 2, D, C)
        out.update({
            h + "input_layernorm.weight": P[m + "ln1.w"],
            h + "self_attn.q_proj.weight": qkv[:, :G].reshape(H * D, C),  # head g*G + j
            h + "self_attn.k_proj.weight": qkv[:, G].reshape(Hkv * D, C),
            h + "self_attn.v_proj.weight": qkv[:, G + 1].reshape(Hkv * D, C),
            h + "self_attn.o_proj.weight": P[m + "attn.proj.w"],
            h + "post_attention_layernorm.weight": P[m + "ln2.w"]})
        if spec.qk_norm == "head":
            out[h + "self_attn.q_norm.weight"] = P[m + "attn.q_norm.w"]
            out[h + "self_attn.k_norm.weight"] = P[m + "attn.k_norm.w"]
        if spec.layer_is_moe(l):
            fc = P[m + "mlp.experts.fc.w"].reshape(E, Fe, 2, C)
            proj = P[m + "mlp.experts.proj.w"].reshape(E, C, Fe)
            moe = h + ("block_sparse_moe." if family == "mixtral" else "mlp.")
            out[moe + "gate.weight"] = P[m + "mlp.router.w"]
            names = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
            for e in range(E):
                x = f"{moe}experts.{e}."
                out.update({x + names[0] + ".weight": fc[e, :, 0], x + names[1] + ".weight": fc[e, :, 1],
                            x + names[2] + ".weight": proj[e]})
        else:
            fc = P[m + "mlp.fc.w"].reshape(Fh, 2, C)
            out.update({h + "mlp.gate_proj.weight": fc[:, 0], h + "mlp.up_proj.weight": fc[:, 1],
                        h + "mlp.down_proj.weight": P[m + "mlp.proj.w"]})
    out["model.norm.weight"] = P["lnf.w"]
    if not spec.tied:
        out["lm_head.weight"] = P["lm_head"][:V]
    return out


def write_safetensors(path, tensors):
    """name -> float32 array, in the format's own terms: the header's length (8 bytes, little
    endian), the JSON header padded with spaces to 8 bytes, the raw little-endian data."""
    header = {"__metadata__": {"format": "pt"}}  # transformers refuses a file without it
    blobs, off = [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


def hf_forward(cfg, W, tokens):
    """tokens (B, T) long -> logits (B, T, vocab_size), float64, as transformers' LlamaForCausalLM,
    Qwen3ForCausalLM, Qwen3MoeForCausalLM or MixtralForCausalLM computes them (eager attention, no
    cache), by cfg["model_type"]: Qwen3's RMSNorm of each head's q and k before the rotation;
    the MoE blocks' softmax router over every expert, torch.topk, the k weights renormalized
    (Mixtral always, Qwen3-MoE with norm_topk_prob), each expert's SwiGLU on its tokens."""
    B, T = tokens.shape
    family = cfg["model_type"]
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    scaling = params if params.get("rope_type", "default") != "default" else cfg.get("rope_scaling")

    def rms(x, w):
        variance = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(variance + eps))

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)

    def repeat_kv(x):
        return x[:, :, None].expand(B, Hkv, H // Hkv, T, D).reshape(B, H, T, D)

    def swiglu(x, gate, up, down):
        return (F.silu(x @ gate.t()) * (x @ up.t())) @ down.t()

    def sparse(l):
        if family == "mixtral":
            return True
        if family != "qwen3_moe" or l in cfg.get("mlp_only_layers", []):
            return False
        E = cfg.get("num_experts", cfg.get("num_local_experts", 0))
        return E > 0 and (l + 1) % cfg.get("decoder_sparse_step", 1) == 0

    def moe(x, p):  # x (N, C)
        names = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        E = cfg.get("num_experts", cfg.get("num_local_experts"))
        k = cfg["num_experts_per_tok"]
        weights = torch.softmax(x @ W[p + "gate.weight"].t(), dim=-1)
        top, chosen = torch.topk(weights, k, dim=-1)
        if family == "mixtral" or cfg.get("norm_topk_prob", False):
            top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(E):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if len(token) == 0:
                continue
            g, u, d = (W[f"{p}experts.{e}.{n}.weight"] for n in names)
            out.index_add_(0, token, swiglu(x[token], g, u, d) * top[token, slot, None])
        return out

    inv_freq = rope_frequencies(theta, D, rope_scaling(scaling))
    freqs = torch.arange(T, dtype=torch.float64).view(T, 1) * inv_freq.view(1, -1)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    h = W["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        n = rms(h, W[p + "input_layernorm.weight"])
        q = (n @ W[p + "self_attn.q_proj.weight"].t()).view(B, T, H, D)
        k = (n @ W[p + "self_attn.k_proj.weight"].t()).view(B, T, Hkv, D)
        if family in ("qwen3", "qwen3_moe"):
            q, k = rms(q, W[p + "self_attn.q_norm.weight"]), rms(k, W[p + "self_attn.k_norm.weight"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = (n @ W[p + "self_attn.v_proj.weight"].t()).view(B, T, Hkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k), repeat_kv(v)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        o = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v
        h = h + o.transpose(1, 2).reshape(B, T, H * D) @ W[p + "self_attn.o_proj.weight"].t()
        n = rms(h, W[p + "post_attention_layernorm.weight"])
        if sparse(l):
            moe_prefix = p + ("block_sparse_moe." if family == "mixtral" else "mlp.")
            h = h + moe(n.reshape(B * T, -1), moe_prefix).view(B, T, -1)
        else:
            h = h + swiglu(n, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"],
                           W[p + "mlp.down_proj.weight"])
    h = rms(h, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    return h @ head.t()


def run_hf_write(d, family="llama", generation=4):
    """DIR/model.json, params.bin, tokens.bin -> DIR/hf/{config.json, model.safetensors} of
    `family` (HF_FAMILIES) in transformers `generation`'s config form, and DIR/hf_logits.bin
    (float64, batch x seq_len x vocab_size, of tokens[:, :seq_len])."""
    spec, params, tokens = read_inputs(d)
    wrong = [f"{k} {v!r}" for k, v, want in (
        ("norm", spec.norm, "rmsnorm"), ("positions", spec.positions, "rope"),
        ("mlp", spec.mlp, "swiglu"), ("bias", spec.bias, False),
        ("parallel_block", spec.parallel_block, False), ("window", spec.window, 0),
        ("qk_norm", spec.qk_norm, "head" if family.startswith("qwen3") else ""),
        ("moe", spec.experts > 0, family in ("qwen3_moe", "mixtral")),
        ("shared_hidden", spec.shared_hidden, 0),
        ("router_score", spec.router_score, "softmax"),
        ("router_scale", spec.router_scale, 1.0),
        ("router_groups", spec.router_groups, 1),
        ("router_norm_topk", spec.router_norm_topk if family == "mixtral" else True, True),
        ("moe layers", (spec.dense_layers, spec.moe_every) if family == "mixtral" else (0, 1), (0, 1)))
        if v != want]
    if family not in HF_FAMILIES:
        raise ValueError(f"family {family!r} is not one of {sorted(HF_FAMILIES)}")
    if wrong:
        raise ValueError(f"not a model that {HF_FAMILIES[family]} computes: {', '.join(wrong)}")
    P = {name: t.numpy() for name, t in views(torch.from_numpy(params), spec).items()}
    hf = os.path.join(d, "hf")
    os.makedirs(hf, exist_ok=True)
    with open(os.path.join(hf, "config.json"), "w") as f:
        f.write(json.dumps(hf_config(spec, family, generation), indent=2) + "\n")
    write_safetensors(os.path.join(hf, "model.safetensors"), hf_tensors(spec, P, family))
    # Run what was written, read back from the disk, not what is in memory.
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    W = read_safetensors(os.path.join(hf, "model.safetensors"))
    x = torch.from_numpy(tokens[:, :spec.seq_len].astype(np.int64))
    logits = hf_forward(cfg, W, x)
    np.ascontiguousarray(logits.numpy().astype("<f8")).tofile(os.path.join(d, "hf_logits.bin"))
    return logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", help="directory holding model.json, params.bin, tokens.bin")
    ap.add_argument("--selftest", action="store_true", help="check this script and exit")
    ap.add_argument("--gpt2", metavar="HF_DIR", help="run the GPT-2 of HF_DIR on DIR/tokens.bin")
    ap.add_argument("--hf-write", nargs=2, metavar=("FAMILY", "DIR"),
                    help="write DIR's model as a Hugging Face FAMILY (llama, qwen3, qwen3_moe, "
                         "mixtral) directory DIR/hf and its logits DIR/hf_logits.bin")
    ap.add_argument("--hf-generation", type=int, default=4, choices=(4, 5),
                    help="the transformers generation whose config.json form --hf-write writes")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if args.gpt2:
        return in_float64(args.gpt2, lambda: run_gpt2(args.gpt2, args.dir))
    if args.hf_write:
        family, d = args.hf_write
        return in_float64(d, lambda: run_hf_write(d, family, args.hf_generation))
    if not args.dir:
        ap.error("give DIR or --selftest")
    return in_float64(args.dir, lambda: run_reference(args.dir))


def in_float64(where, run):
    """Runs `run` in float64; a bad input (a missing file, a wrong field) is exit 2, named."""
    torch.set_default_dtype(torch.float64)
    try:
        run()
    except (OSError, ValueError, KeyError) as e:
        print(f"torch_reference.py: {where}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
