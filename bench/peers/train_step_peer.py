#!/usr/bin/python3
"""Python peer for `cemfrac bench train`: one training step of the same decoder-only LM written the way
a PyTorch user writes it in eager mode, timed like the C++ side (same model, batch, optimizer, steps,
threads, BLAS core).

  model      token embedding, L pre-norm blocks  z += attn(norm1(z)); z += ffn(norm2(z)),  final norm,
             head. Llama flavour: RMSNorm, RoPE (rotate-half), no biases, SwiGLU, untied head,
             grouped-query attention by repeating K/V heads. GPT-2 flavour: LayerNorm, learned
             positions, biases, GELU (tanh) MLP, tied head. Attention is explicit: q k^T / sqrt(d_h),
             causal mask (a buffer built once), softmax, times v (1.13 has no public fused attention).
  init       N(0, init_std) for matrices and embeddings, residual output projections (attention out,
             FFN down) N(0, init_std / sqrt(2L)), norm weights 1, biases 0 (as cemfrac)
  step       zero_grad(set_to_none) -> forward -> F.cross_entropy -> backward ->
             clip_grad_norm_ -> torch.optim.AdamW.step (two groups: weight decay on matrices, none on
             norms, biases and embeddings; torch's default implementation, i.e. foreach=False in 1.13)
  data       random token ids (seeded), one (micro_batch, seq_len + 1) batch reused every step

Run with Debian's interpreter (python3-torch): /usr/bin/python3 bench/peers/train_step_peer.py --help.
The configuration comes as the JSON `cemfrac bench train` passes (--config-json). Prints one JSON
object on stdout. Start it with OPENBLAS_CORETYPE set to the core cemfrac runs; it reports the core the
loaded OpenBLAS really uses.
"""
import argparse
import ctypes
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def openblas():
    """The OpenBLAS library torch loaded (from /proc/self/maps), or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libopenblas" in path:
                try:
                    return ctypes.CDLL(path)
                except OSError:
                    return None
    return None


def blas_core(lib):
    if lib is None:
        return "unknown (no OpenBLAS loaded)"
    lib.openblas_get_corename.restype = ctypes.c_char_p
    return lib.openblas_get_corename().decode()


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(c):
    if c["norm"] == "rmsnorm":
        return RMSNorm(c["d_model"], c["norm_eps"])
    return nn.LayerNorm(c["d_model"], eps=c["norm_eps"], elementwise_affine=True)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h = c["n_heads"]
        self.h_kv = c["n_kv_heads"] or self.h
        self.d_h = c["d_model"] // self.h
        self.qkv = nn.Linear(c["d_model"], (self.h + 2 * self.h_kv) * self.d_h, bias=c["bias"])
        self.out = nn.Linear(self.h * self.d_h, c["d_model"], bias=c["bias"])
        self.out.residual = True
        self.rope = c["positions"] == "rope"
        n = c["context"]
        self.register_buffer("mask", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)

    def forward(self, x, cos, sin):
        B, N, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d_h, self.h_kv * self.d_h, self.h_kv * self.d_h], -1)
        q = q.view(B, N, self.h, self.d_h).transpose(1, 2)
        k = k.view(B, N, self.h_kv, self.d_h).transpose(1, 2)
        v = v.view(B, N, self.h_kv, self.d_h).transpose(1, 2)
        if self.rope:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        if self.h_kv != self.h:
            k = k.repeat_interleave(self.h // self.h_kv, dim=1)
            v = v.repeat_interleave(self.h // self.h_kv, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_h))
        att = att.masked_fill(~self.mask[:N, :N], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, N, self.h * self.d_h)
        return self.out(y)


class SwiGLU(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = nn.Linear(c["d_model"], c["d_ff"], bias=False)
        self.up = nn.Linear(c["d_model"], c["d_ff"], bias=False)
        self.down = nn.Linear(c["d_ff"], c["d_model"], bias=False)
        self.down.residual = True

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeluMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = nn.Linear(c["d_model"], c["d_ff"], bias=c["bias"])
        self.proj = nn.Linear(c["d_ff"], c["d_model"], bias=c["bias"])
        self.proj.residual = True

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm1 = make_norm(c)
        self.attn = Attention(c)
        self.norm2 = make_norm(c)
        self.mlp = SwiGLU(c) if c["ffn"] == "swiglu" else GeluMLP(c)

    def forward(self, z, cos, sin):
        z = z + self.attn(self.norm1(z), cos, sin)
        return z + self.mlp(self.norm2(z))


class LM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        D, V = c["d_model"], c["vocab_size"]
        self.wte = nn.Embedding(V, D)
        self.wpe = nn.Embedding(c["context"], D) if c["positions"] == "learned" else None
        self.blocks = nn.ModuleList([Block(c) for _ in range(c["n_layers"])])
        self.norm_f = make_norm(c)
        self.head = nn.Linear(D, V, bias=False)
        if c["tie_embeddings"]:
            self.head.weight = self.wte.weight
        std, out_std = c["init_std"], c["init_std"] / math.sqrt(2 * c["n_layers"])
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, out_std if getattr(m, "residual", False) else std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, std)
        if c["positions"] == "rope":
            d_h = D // c["n_heads"]
            freq = c["rope_theta"] ** (-torch.arange(0, d_h // 2, dtype=torch.float64) * 2.0 / d_h)
            angle = torch.outer(torch.arange(c["context"], dtype=torch.float64), freq)
            angle = torch.cat((angle, angle), dim=-1)  # (context, d_h): both halves rotate alike
            self.register_buffer("cos", angle.cos().float(), persistent=False)
            self.register_buffer("sin", angle.sin().float(), persistent=False)
        else:
            self.cos = self.sin = None

    def forward(self, tokens):
        N = tokens.shape[1]
        z = self.wte(tokens)
        if self.wpe is not None:
            z = z + self.wpe.weight[:N]
        cos = self.cos[:N] if self.cos is not None else None
        sin = self.sin[:N] if self.sin is not None else None
        for block in self.blocks:
            z = block(z, cos, sin)
        return self.head(self.norm_f(z))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-json", required=True,
                   help='{"model": {cemfrac config.json fields}, "train": {micro_batch, seq_len, lr, '
                        'beta1, beta2, adam_eps, weight_decay, grad_clip, seed}}')
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--threads", type=int, default=0, help="0 = leave torch's default")
    args = p.parse_args()
    cfg = json.loads(args.config_json)
    c, t = cfg["model"], cfg["train"]
    if c["mixer"] != "mha" or c["ffn"] not in ("swiglu", "gelu_mlp") or c.get("layer_overrides"):
        sys.exit(f"train_step_peer.py: only mixer mha with ffn swiglu/gelu_mlp and no per-layer "
                 f"overrides (got mixer {c['mixer']}, ffn {c['ffn']})")
    if c["norm"] == "layernorm" and not c["bias"]:
        sys.exit("train_step_peer.py: layernorm without bias is not written here")

    lib = openblas()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        if lib is not None:
            lib.openblas_set_num_threads(ctypes.c_int(args.threads))  # cemfrac sets both too
    torch.manual_seed(t["seed"])
    model = LM(c)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())

    decay, no_decay = [], []
    for name, prm in model.named_parameters():
        # Matrices (projections, head) decay; norms, biases and embeddings do not.
        (decay if prm.dim() >= 2 and "wte" not in name and "wpe" not in name else no_decay).append(prm)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["adam_eps"])

    B, S, V = t["micro_batch"], t["seq_len"], c["vocab_size"]
    gen = torch.Generator().manual_seed(t["seed"])
    data = torch.randint(0, V, (B, S + 1), generator=gen)
    inputs, targets = data[:, :S].contiguous(), data[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, V), targets.view(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if t["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        t3 = time.perf_counter()
        return loss.item(), (t1 - t0, t2 - t1, t3 - t2)

    losses, times, phases = [], [], []
    for _ in range(args.warmup):
        losses.append(step()[0])
    cpu = []

    def cpu_seconds():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    for _ in range(args.steps):
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        loss, ph = step()
        times.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds() - c0)
        losses.append(loss)
        phases.append(ph)

    def med(i):
        return statistics.median(x[i] for x in phases) if phases else 0.0

    print(json.dumps({
        "python": sys.version.split()[0], "torch": torch.__version__,
        "threads": torch.get_num_threads(), "blas_core": blas_core(lib),
        "parameters": n_params, "adamw_foreach": opt.defaults.get("foreach"),
        "steps": args.steps, "warmup": args.warmup,
        "step_s": times, "median_s": statistics.median(times) if times else 0.0,
        "min_s": min(times) if times else 0.0,
        "cpu_s": cpu, "cpu_median_s": statistics.median(cpu) if cpu else 0.0,
        "malloc_env": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")
                       if k in os.environ},
        "phases_median_s": {"forward": med(0), "backward": med(1), "clip_and_optimizer": med(2)},
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
    }))


if __name__ == "__main__":
    main()
