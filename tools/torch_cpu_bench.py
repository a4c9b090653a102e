#!/usr/bin/python3
"""PyTorch CPU training-throughput reference for Myriad's CPU benchmark.

    /usr/bin/python3 tools/torch_cpu_bench.py --config configs/demo.toml \
        [--set section.key=value ...] [--steps N] [--warmup K] [--threads T]

Builds the Myriad GPT (same layout and arithmetic as the C++ model) in float32 from a Myriad TOML
config, trains it on random tokens with the same step structure as Myriad (gradient accumulation
over global_batch / micro_batch micro-batches, global-norm clipping at 1.0, AdamW), and prints
one JSON line with the measured throughput.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
import tomllib


def _set_thread_env():
    """Sets the threading environment before torch loads. Debian's torch does its GEMMs in
    OpenBLAS, which has its own thread pool sized to every core regardless of
    torch.set_num_threads, and torch's OpenMP workers spin while OpenBLAS runs: on a small
    machine the two pools then fight over the cores (measured: 2 threads 3x slower than 1).
    So OpenBLAS gets --threads too and idle OpenMP workers sleep. Values already in the
    environment win."""
    threads = str(os.cpu_count() or 1)
    argv = sys.argv[1:]
    for i, a in enumerate(argv):  # main() parses and checks --threads properly later
        if a == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
        elif a.startswith("--threads="):
            threads = a.partition("=")[2]
    os.environ.setdefault("OPENBLAS_NUM_THREADS", threads if threads.isdigit() else "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


if __name__ == "__main__":
    _set_thread_env()

import torch  # noqa: E402 (after the thread environment is set)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# Myriad's defaults (src/core/config.h) for keys the config leaves out.
DEFAULTS = {
    "model": {"layers": 8, "d_model": 128, "heads": 4, "seq_len": 128, "vocab_size": 256,
              "window": 0, "parallel_block": False, "bias": True, "init_std": 0.02},
    "train": {"global_batch": 8, "micro_batch": 4, "seed": 1234},
    "optim": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1},
}


# ----------------------------------------------------------------------------------------------
# Config


def parse_value(text):
    """A --set value as TOML would read it; bare words that are not TOML stay strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_config(path, overrides):
    with open(path, "rb") as f:
        root = tomllib.load(f)
    for item in overrides:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) != 2 or not all(parts):
            raise ValueError(f"--set {item}: expected section.key=value")
        section = root.setdefault(parts[0], {})
        if not isinstance(section, dict):
            raise ValueError(f"--set {item}: {parts[0]} is not a section")
        section[parts[1]] = parse_value(value.strip())
    cfg = {}
    for section, keys in DEFAULTS.items():
        given = root.get(section, {})
        cfg[section] = {k: given.get(k, default) for k, default in keys.items()}
    m, t = cfg["model"], cfg["train"]
    if m["d_model"] % m["heads"] != 0:
        raise ValueError(f"model.d_model {m['d_model']} is not a multiple of model.heads "
                         f"{m['heads']}")
    if t["micro_batch"] <= 0 or t["global_batch"] % t["micro_batch"] != 0:
        raise ValueError(f"train.global_batch {t['global_batch']} is not a multiple of "
                         f"train.micro_batch {t['micro_batch']}")
    m["padded_vocab"] = (m["vocab_size"] + 127) // 128 * 128
    return cfg


# ----------------------------------------------------------------------------------------------
# Model


class Norm(nn.Module):
    """LayerNorm (eps 1e-5) whose bias is optional; torch 1.13's nn.LayerNorm always has one."""

    def __init__(self, dim, bias):
        super().__init__()
        self.w = nn.Parameter(torch.ones(dim))
        self.b = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.w, self.b, 1e-5)


class Attention(nn.Module):
    def __init__(self, m):
        super().__init__()
        C = m["d_model"]
        self.heads = m["heads"]
        self.qkv = nn.Linear(C, 3 * C, bias=m["bias"])  # output rows ordered (H, 3, D)
        self.proj = nn.Linear(C, C, bias=m["bias"])     # input columns ordered (H, D)
        T, W = m["seq_len"], m["window"]
        i = torch.arange(T).view(T, 1)
        j = torch.arange(T).view(1, T)
        blocked = (j > i) | ((i - j >= W) if W > 0 else torch.zeros(T, T, dtype=torch.bool))
        self.register_buffer("blocked", blocked, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        D = C // H
        qkv = self.qkv(x).view(B, T, H, 3, D).permute(3, 0, 2, 1, 4)  # (3, B, H, T, D)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        scores = scores.masked_fill(self.blocked[:T, :T], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, m):
        super().__init__()
        C = m["d_model"]
        self.fc = nn.Linear(C, 4 * C, bias=m["bias"])
        self.proj = nn.Linear(4 * C, C, bias=m["bias"])

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.parallel = m["parallel_block"]
        self.ln1 = Norm(m["d_model"], m["bias"])
        self.attn = Attention(m)
        self.ln2 = None if self.parallel else Norm(m["d_model"], m["bias"])
        self.mlp = MLP(m)

    def forward(self, h):
        if self.parallel:
            n = self.ln1(h)
            return h + self.attn(n) + self.mlp(n)
        a = h + self.attn(self.ln1(h))
        return a + self.mlp(self.ln2(a))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.vocab_size = m["vocab_size"]
        C = m["d_model"]
        self.wte = nn.Parameter(torch.empty(m["padded_vocab"], C))  # tied with the LM head
        self.wpe = nn.Parameter(torch.empty(m["seq_len"], C))
        self.h = nn.ModuleList(Block(m) for _ in range(m["layers"]))
        self.lnf = Norm(C, m["bias"])
        self.init_weights(m["init_std"], m["layers"])

    @torch.no_grad()
    def init_weights(self, std, layers):
        # Myriad's scheme: normal(0, std) matrices and embeddings, residual projections scaled
        # by 1/sqrt(2L), zero biases, unit norms, zero padded embedding rows.
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if name.endswith(".w") else 0.0)
            else:
                scale = 1 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 1.0
                p.normal_(0.0, std * scale)
        self.wte[self.vocab_size:].zero_()

    def forward(self, tokens):
        """tokens (B, T+1) -> mean cross-entropy of predicting tokens[:, 1:]."""
        T = tokens.shape[1] - 1
        x, y = tokens[:, :T], tokens[:, 1:]
        h = self.wte[x] + self.wpe[:T]
        for block in self.h:
            h = block(h)
        logits = self.lnf(h) @ self.wte.t()  # (B, T, Vp)
        V = self.vocab_size
        return F.cross_entropy(logits[..., :V].reshape(-1, V), y.reshape(-1))


def make_optimizer(model, o):
    # Decay matrices and embeddings, not biases or norms (as Myriad's ParamLayout marks them).
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]},
              {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])


# ----------------------------------------------------------------------------------------------
# Benchmark


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="Myriad TOML config")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a config key (repeatable)")
    ap.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=None, help="default: train.seed")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")
    try:
        cfg = load_config(args.config, args.set)
    except (OSError, ValueError, tomllib.TOMLDecodeError) as e:
        print(f"torch_cpu_bench.py: {e}", file=sys.stderr)
        return 2
    m, t = cfg["model"], cfg["train"]

    torch.set_num_threads(args.threads)
    seed = t["seed"] if args.seed is None else args.seed
    torch.manual_seed(seed)
    model = GPT(m)
    opt = make_optimizer(model, cfg["optim"])
    gen = torch.Generator().manual_seed(seed + 1)
    accum = t["global_batch"] // t["micro_batch"]
    shape = (t["micro_batch"], m["seq_len"] + 1)

    def step():
        for _ in range(accum):
            tokens = torch.randint(0, m["vocab_size"], shape, generator=gen)
            (model(tokens) / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)

    tokens_per_step = t["global_batch"] * m["seq_len"]
    print(json.dumps({
        "impl": "pytorch-cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tokens_per_s": round(statistics.median(tokens_per_step / s for s in times), 1),
        "step_ms_median": round(1000 * statistics.median(times), 3),
        "params": sum(p.numel() for p in model.parameters()),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
