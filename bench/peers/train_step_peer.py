#!/usr/bin/python3
"""Python peer for `cemfrac bench train`: one training step of the same decoder-only LM written the way
a PyTorch user writes it in eager mode, timed like the C++ side (same model, batch, optimizer, steps,
threads, BLAS core).

  model      token embedding, L pre-norm blocks  z += attn(norm1(z)); z += ffn(norm2(z)),  final norm,
             head. Mixers: mha (also grouped-query), cem_attention, cattn_m; FFNs: swiglu, gelu_mlp,
             cem_mlp, cffn (the options the small-/tiny- cem-both, cem-full, cofrgenet-f and cofrgenet
             presets use; any other option is refused with one line). Llama flavour: RMSNorm, RoPE (rotate-half), no biases, SwiGLU, untied head,
             grouped-query attention by repeating K/V heads. GPT-2 flavour: LayerNorm, learned
             positions, biases, GELU (tanh) MLP, tied head. Attention is explicit: q k^T / sqrt(d_h),
             causal mask (a buffer built once), softmax, times v (1.13 has no public fused attention).
  init       N(0, init_std) for matrices and embeddings, residual output projections (attention out,
             FFN down) N(0, init_std / sqrt(2L)), norm weights 1, biases 0 (as cemfrac)
  step       zero_grad(set_to_none) -> forward -> F.cross_entropy -> backward ->
             clip_grad_norm_ -> torch.optim.AdamW.step (two groups: weight decay on matrices, none on
             norms, biases and embeddings; torch's default implementation, i.e. foreach=False in 1.13)
  data       random token ids (seeded), one (micro_batch, seq_len + 1) batch reused every step
  device     --device (cemfrac passes its own): the model and batch are moved there after the weights
             load; on CUDA each clock read waits for the device (torch.cuda.synchronize)
  weights    --weights FILE (what `cemfrac bench train` passes): a safetensors file with cemfrac's
             initial weights under cemfrac's names, the batch ("__batch__", int64) and the names of
             the weight-decay group (metadata "decay"); loaded by an explicit name map, so both sides
             start from the same model and compute step 0's loss on the same batch.

The JSON carries first_loss and first_grad_norm (step 0's, before clipping, its squares summed in
float64 outside the step's timing), which `cemfrac bench train` compares with its own. --float64
(what `cemfrac bench train --check-float64` passes, with --warmup 1 --steps 0) casts the model to
float64 before loading the weights, so that step 0 is computed in float64 on both sides and only a
difference of the models, not rounding, can separate them.

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

    def cemfrac_names(self):
        return linear_names(w_qkv=self.qkv, w_o=self.out)


class SwiGLU(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = nn.Linear(c["d_model"], c["d_ff"], bias=c["bias"])
        self.up = nn.Linear(c["d_model"], c["d_ff"], bias=c["bias"])
        self.down = nn.Linear(c["d_ff"], c["d_model"], bias=c["bias"])
        self.down.residual = True

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))

    def cemfrac_names(self):
        return linear_names(w_gate=self.gate, w_up=self.up, w_down=self.down)


class GeluMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = nn.Linear(c["d_model"], c["d_ff"], bias=c["bias"])
        self.proj = nn.Linear(c["d_ff"], c["d_model"], bias=c["bias"])
        self.proj.residual = True

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    def cemfrac_names(self):
        return linear_names(w_fc=self.fc, w_proj=self.proj)


def linear_names(**linears):
    """cemfrac's keys of nn.Linear modules: w_x -> weight, b_x -> bias (when there is one)."""
    out = {}
    for key, lin in linears.items():
        out[key] = lin.weight
        if lin.bias is not None:
            out["b_" + key[2:]] = lin.bias
    return out


def normal_param(shape, std):
    return nn.Parameter(torch.empty(*shape).normal_(0.0, std))


def const_param(shape, value):
    return nn.Parameter(torch.full(shape, float(value)))


SOFTPLUS_INV_ONE = math.log(math.e - 1.0)  # softplus of it is 1: eta and p start at 1


# ---------------------------------------------------------------------------------------------------
# CEM (docs/layers/cem.md): attention and gated MLP as T gradient steps x <- x + eta P (-grad E(x; h)),
# x^(0) = h, returning x^(T) - h; keys (and the MLP's gate) computed once from h.

class Preconditioner(nn.Module):
    """P g = softplus(p) g + U V^T g + V U^T g, without forming the D x D matrix."""

    def __init__(self, D, r):
        super().__init__()
        self.p = const_param((D,), SOFTPLUS_INV_ONE)
        self.u = normal_param((D, r), 0.02)
        self.v = const_param((D, r), 0.0)

    def forward(self, g):
        return F.softplus(self.p) * g + (g @ self.v) @ self.u.t() + (g @ self.u) @ self.v.t()

    def cemfrac_names(self):
        return {"precond.p": self.p, "precond.u": self.u, "precond.v": self.v}


class CemStep(nn.Module):
    """The pieces both CEM sub-layers share: eta = softplus(eta_raw) (or 1) and the preconditioner."""

    def __init__(self, c):
        super().__init__()
        cem = c["cem"]
        self.steps = cem["steps"]
        self.eta_raw = None if cem["freeze_eta"] or cem["precond"] else const_param((1,), SOFTPLUS_INV_ONE)
        self.precond = Preconditioner(c["d_model"], cem["precond_rank"]) if cem["precond"] else None

    def scale(self, d):
        """eta P d."""
        if self.precond is not None:
            d = self.precond(d)
        return d if self.eta_raw is None else F.softplus(self.eta_raw) * d

    def names(self):
        out = {} if self.eta_raw is None else {"eta_raw": self.eta_raw}
        if self.precond is not None:
            out.update(self.precond.cemfrac_names())
        return out


class CemAttention(nn.Module):
    """Tied K = V = W_K h (rotated), queries W_Q x, output W_Q^T; beta = 1/sqrt(d_h); optional D+LR
    diagonal x_i^T diag(delta_k) h_j in the logits (per head or shared), read out as delta_k * (P_k h)."""

    def __init__(self, c):
        super().__init__()
        D, self.h = c["d_model"], c["n_heads"]
        self.d_h = D // self.h
        self.w_q = normal_param((D, D), c["init_std"])
        self.w_k = normal_param((D, D), c["init_std"])
        self.step = CemStep(c)
        self.dlr = c["cem"]["dlr"]
        self.delta = None
        if self.dlr == "per_head":
            self.delta = const_param((self.h, D), 0.0)
        elif self.dlr == "shared":
            self.delta = const_param((D,), 0.0)
        self.rope = c["positions"] == "rope"
        n = c["context"]
        self.register_buffer("mask", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)

    def forward(self, hin, cos, sin):
        B, N, D = hin.shape
        H, d_h = self.h, self.d_h
        beta = 1.0 / math.sqrt(d_h)
        hidden = ~self.mask[:N, :N]
        k = F.linear(hin, self.w_k).view(B, N, H, d_h).transpose(1, 2)  # keys = values, once
        if self.rope:
            k = k * cos + rotate_half(k) * sin
        hs = hin.unsqueeze(1)                                            # (B, 1, N, D)
        dk = self.delta.view(1, H, 1, D) if self.dlr == "per_head" else None
        x, disp = hin, None
        for t in range(self.step.steps):
            q = F.linear(x, self.w_q).view(B, N, H, d_h).transpose(1, 2)
            if self.rope:
                q = q * cos + rotate_half(q) * sin
            s = q @ k.transpose(-2, -1)                                  # (B, H, N, N)
            if self.dlr == "per_head":
                s = s + (x.unsqueeze(1) * dk) @ hs.transpose(-2, -1)
            elif self.dlr == "shared":
                s = s + ((x * self.delta) @ hin.transpose(-2, -1)).unsqueeze(1)
            probs = F.softmax((s * beta).masked_fill(hidden, float("-inf")), dim=-1)
            a = probs @ k                                                # (B, H, N, d_h)
            if self.rope:
                a = a * cos - rotate_half(a) * sin                       # rotate back: R_{-i}
            d = a.transpose(1, 2).reshape(B, N, D) @ self.w_q            # W_Q^T, the same tensor
            if self.dlr == "per_head":
                d = d + ((probs @ hs) * dk).sum(1)
            elif self.dlr == "shared":
                d = d + self.delta * (probs.sum(1) @ hin)
            disp = self.step.scale(d)
            if t + 1 < self.step.steps:
                x = x + disp
        return disp if self.step.steps == 1 else x + disp - hin

    def cemfrac_names(self):
        out = {"w_q": self.w_q, "w_k": self.w_k, **self.step.names()}
        if self.delta is not None:
            out["delta"] = self.delta
        return out


class CemMlp(nn.Module):
    """Option A: E = -sum_m (W_G h)_m Phi((W_U x)_m); step x += eta P W_U^T [SiLU(W_U x) * W_G h]."""

    def __init__(self, c):
        super().__init__()
        D, M = c["d_model"], c["d_ff"]
        self.w_u = normal_param((M, D), c["init_std"])
        self.w_g = normal_param((M, D), c["init_std"])
        self.step = CemStep(c)

    def forward(self, h):
        gate = F.linear(h, self.w_g)  # once
        x, disp = h, None
        for t in range(self.step.steps):
            disp = self.step.scale((F.silu(F.linear(x, self.w_u)) * gate) @ self.w_u)
            if t + 1 < self.step.steps:
                x = x + disp
        return disp if self.step.steps == 1 else x + disp - h

    def cemfrac_names(self):
        return {"w_u": self.w_u, "w_g": self.w_g, **self.step.names()}


# ---------------------------------------------------------------------------------------------------
# CoFrGeNet (docs/layers/cofrgenet.md, docs/layers/ladders.md): continued-fraction ladders.

class Ladder(torch.autograd.Function):
    """f = 1/(a_1 + 1/(a_2 + ... + 1/a_d)) = K_{d-1} / K^_d for every ladder of a (..., d, L), through
    the tail continuants K_j = a_{d-j+1} K_{j-1} + K_{j-2} (K_{-1} = 0, K_0 = 1), one reciprocal per
    ladder, K^_d = sgn(K_d) max(|K_d|, eps). Backward in closed form (the continuant identity):
    df/da_k = (-1)^k (K_{d-k} / K^_d)^2, the continuants recomputed from a (only a and 1/K^_d saved)."""

    @staticmethod
    def forward(ctx, a, eps):
        d = a.shape[-2]
        prev = torch.zeros_like(a[..., 0, :])
        cur = torch.ones_like(prev)
        for k in range(d, 0, -1):
            prev, cur = cur, a[..., k - 1, :] * cur + prev
        r = torch.where(cur >= 0, cur.clamp_min(eps), cur.clamp_max(-eps)).reciprocal()
        ctx.save_for_backward(a, r)
        return prev * r

    @staticmethod
    def backward(ctx, grad):
        a, r = ctx.saved_tensors
        d = a.shape[-2]
        grad_a = torch.empty_like(a)
        prev = torch.zeros_like(r)
        cur = torch.ones_like(r)                # K_0
        for j in range(0, d):                   # K_j pairs with a_{d-j}
            k = d - j
            q = cur * r
            w = grad * q * q
            grad_a[..., k - 1, :] = -w if k % 2 == 1 else w
            if j + 1 < d:
                prev, cur = cur, a[..., k - 1, :] * cur + prev
        return grad_a, None


class LadderBank(nn.Module):
    """L p-variate ladders of depth d: a_k = W_k x + b_k (rows of all depths in one matmul)."""

    def __init__(self, p, L, d, bias, eps):
        super().__init__()
        self.L, self.d, self.eps = L, d, eps
        std = 0.1 / math.sqrt(p)
        self.w = nn.ParameterList([normal_param((L, p), std) for _ in range(d)])
        self.b = nn.ParameterList([const_param((L,), 1.0) for _ in range(d)]) if bias else None

    def forward(self, x):
        w = torch.cat(list(self.w), 0)                                      # (d L, p)
        b = torch.cat(list(self.b), 0) if self.b is not None else None
        a = F.linear(x, w, b).view(*x.shape[:-1], self.d, self.L)           # (..., d, L)
        return Ladder.apply(a, self.eps)                                    # (..., L)

    def cemfrac_names(self):
        out = {f"w_ladder_{k + 1}": w for k, w in enumerate(self.w)}
        if self.b is not None:
            out.update({f"b_ladder_{k + 1}": b for k, b in enumerate(self.b)})
        return out


class Cffn(nn.Module):
    """x^ = x * act(G x); y = U x^ + V f(W x^ + b)."""

    def __init__(self, c):
        super().__init__()
        cf, p = c["cofrgenet"], c["d_model"]
        out_std = c["init_std"] / math.sqrt(2 * c["n_layers"])
        self.act = torch.sigmoid if cf["gate"] == "sigmoid" else F.silu
        self.w_gate = normal_param((p, p), c["init_std"])
        self.w_direct = normal_param((p, p), out_std)
        self.ladders = LadderBank(p, cf["ladders"], cf["depth"], cf["ladder_bias"], cf["eps"])
        self.w_out = normal_param((p, cf["ladders"]), out_std)

    def forward(self, x):
        x_hat = x * self.act(F.linear(x, self.w_gate))
        return F.linear(self.ladders(x_hat), self.w_out) + F.linear(x_hat, self.w_direct)

    def cemfrac_names(self):
        return {"w_gate": self.w_gate, "w_direct": self.w_direct, "w_out": self.w_out,
                **self.ladders.cemfrac_names()}


class CAttnM(nn.Module):
    """Logits over positions from the ladders: s_h = z(x_t)^T F_h, causal softmax, times X W^v (heads
    are slices of d_model / H channels), then W^o when configured."""

    def __init__(self, c):
        super().__init__()
        cf, p = c["cofrgenet"], c["d_model"]
        self.H, self.l = cf["m_heads"], cf["length"] or c["context"]
        out_std = c["init_std"] / math.sqrt(2 * c["n_layers"])
        self.ladders = LadderBank(p, cf["m_ladders"], cf["m_depth"], cf["ladder_bias"], cf["eps"])
        self.w_logits = normal_param((self.H, cf["m_ladders"], self.l), c["init_std"])
        self.w_v = normal_param((p, p), c["init_std"] if cf["m_out_proj"] else out_std)
        self.w_o = normal_param((p, p), out_std) if cf["m_out_proj"] else None
        mask = torch.zeros(self.l, self.l).masked_fill(
            torch.ones(self.l, self.l, dtype=torch.bool).triu(1), float("-inf"))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x, cos, sin):
        B, N, p = x.shape
        z = self.ladders(x)                                              # (B, N, L)
        s = z.unsqueeze(1) @ self.w_logits[:, :, :N] + self.mask[:N, :N]  # (B, H, N, N)
        v = F.linear(x, self.w_v).view(B, N, self.H, p // self.H).transpose(1, 2)
        o = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, N, p)
        return o if self.w_o is None else F.linear(o, self.w_o)

    def cemfrac_names(self):
        out = {"w_logits": self.w_logits, "w_v": self.w_v, **self.ladders.cemfrac_names()}
        if self.w_o is not None:
            out["w_o"] = self.w_o
        return out


MIXERS = {"mha": lambda c: Attention(c), "cem_attention": CemAttention, "cattn_m": CAttnM}
FFNS = {"swiglu": SwiGLU, "gelu_mlp": GeluMLP, "cem_mlp": CemMlp, "cffn": Cffn}


def unsupported(c):
    """Why this peer cannot model config c ("" when it can): the options the presets above use."""
    if c.get("layer_overrides"):
        return "per-layer overrides"
    if c["mixer"] not in MIXERS:
        return f"mixer '{c['mixer']}'"
    if c["ffn"] not in FFNS:
        return f"ffn '{c['ffn']}'"
    if c["norm"] == "layernorm" and not c["bias"]:
        return "layernorm without bias"
    if c.get("rope_scaling", {}).get("type", "none") != "none":
        return "rope_scaling"
    cem, cf = c.get("cem", {}), c.get("cofrgenet", {})
    if "cem" in (c["mixer"][:3], c["ffn"][:3]):
        want = {"rope_mode": "exact", "dlr_distance": False, "precond_psd": False, "mlp_form": "a",
                "recursion_keys": "fixed", "prox": "none", "step_norm": "none"}
        for key, value in want.items():
            if cem.get(key, value) != value:
                return f"cem.{key} = {cem[key]!r} (this peer writes {value!r} only)"
        if c["mixer"] == "cem_attention" and c["positions"] == "rope" and c.get("n_kv_heads", 0) not in (0, c["n_heads"]):
            return "cem_attention with grouped-query heads"
    if c["mixer"] == "cattn_m" or c["ffn"] == "cffn":
        want = {"impl": "fused", "backward": "surrogate", "truncate": False, "glu": False,
                "direct_raw": False, "univariate": False}
        for key, value in want.items():
            if key == "impl" and cf.get(key) == "reference":
                continue  # the same function as fused
            if cf.get(key, value) != value:
                return f"cofrgenet.{key} = {cf[key]!r} (this peer writes {value!r} only)"
    return ""


def names_of(module):
    """cemfrac's parameter keys (relative to the module) -> this module's parameters."""
    if isinstance(module, (RMSNorm, nn.LayerNorm)):
        return {"weight": module.weight, **({"bias": module.bias} if getattr(module, "bias", None) is not None else {})}
    return module.cemfrac_names()


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm1 = make_norm(c)
        self.attn = MIXERS[c["mixer"]](c)
        self.norm2 = make_norm(c)
        self.mlp = FFNS[c["ffn"]](c)

    def forward(self, z, cos, sin):
        z = z + self.attn(self.norm1(z), cos, sin)
        return z + self.mlp(self.norm2(z))

    def cemfrac_names(self):
        out = {}
        for part in ("norm1", "attn", "norm2", "mlp"):
            for key, prm in names_of(getattr(self, part)).items():
                out[f"{part}.{key}"] = prm
        return out


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
            self.rope_angle = angle  # float64, for --float64 (cemfrac rounds its tables per dtype)
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

    def cemfrac_names(self):
        """Every parameter under its cemfrac checkpoint key (cemfrac's LmModel::parameter_table)."""
        out = {"wte.weight": self.wte.weight}
        if self.wpe is not None:
            out["wpe.weight"] = self.wpe.weight
        for i, block in enumerate(self.blocks):
            out.update({f"blocks.{i}.{k}": v for k, v in block.cemfrac_names().items()})
        out.update({f"norm_f.{k}": v for k, v in names_of(self.norm_f).items()})
        if not self.c["tie_embeddings"]:
            out["head.weight"] = self.head.weight
        assert len({id(v) for v in out.values()}) == len(list(self.parameters())), "name map misses parameters"
        return out


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                      "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                      "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """(name -> tensor, metadata) of a safetensors file: 8-byte little-endian header length, a JSON
    header {name: {dtype, shape, data_offsets}}, then the little-endian data."""
    assert sys.byteorder == "little", "this reader assumes a little-endian machine"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dtype = SAFETENSORS_DTYPES[e["dtype"]]
        if end > begin:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        else:
            t = torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(e["shape"])
    return tensors, meta


def load_weights(model, tensors):
    """Copies tensors[name] into the parameter the explicit name map gives; the names and shapes must
    match exactly (one line listing what differs otherwise)."""
    names = model.cemfrac_names()
    missing = sorted(set(names) - set(tensors))
    extra = sorted(set(tensors) - set(names))
    shapes = [f"{k}: file {list(tensors[k].shape)} vs peer {list(names[k].shape)}"
              for k in sorted(set(names) & set(tensors)) if tensors[k].shape != names[k].shape]
    if missing or extra or shapes:
        sys.exit(f"train_step_peer.py: the weights do not fit the peer's model: missing {missing}, "
                 f"extra {extra}, shapes {shapes}")
    with torch.no_grad():
        for k, prm in names.items():
            prm.copy_(tensors[k])
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-json", required=True,
                   help='{"model": {cemfrac config.json fields}, "train": {micro_batch, seq_len, lr, '
                        'beta1, beta2, adam_eps, weight_decay, grad_clip, seed}}')
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps (0: only the warm-up)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--threads", type=int, default=0, help="0 = leave torch's default")
    p.add_argument("--weights", default="",
                   help="safetensors file from `cemfrac bench train`: the initial weights under "
                        "cemfrac's names, the batch as __batch__ (int64, (micro_batch, seq_len + 1)) "
                        "and the decay group's names (metadata 'decay', comma-separated)")
    p.add_argument("--device", default="cpu",
                   help="where to compute (cpu, cuda, cuda:N); on CUDA the device is synchronised "
                        "before every clock read, as cemfrac does")
    p.add_argument("--float64", action="store_true",
                   help="compute in float64 (the model is cast before the weights are loaded)")
    args = p.parse_args()
    if args.steps < 0 or args.warmup < 0 or args.steps + args.warmup < 1:
        sys.exit("train_step_peer.py: --steps and --warmup must be >= 0 and run at least one step")
    cfg = json.loads(args.config_json)
    c, t = cfg["model"], cfg["train"]
    why_not = unsupported(c)
    if why_not:
        sys.exit(f"train_step_peer.py: this peer does not model {why_not}")

    lib = openblas()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        if lib is not None:
            lib.openblas_set_num_threads(ctypes.c_int(args.threads))  # cemfrac sets both too
    torch.manual_seed(t["seed"])
    model = LM(c)
    if args.float64:
        model.double()
        if model.cos is not None:  # the tables from the float64 angles, not from float32 ones
            model.cos, model.sin = model.rope_angle.cos(), model.rope_angle.sin()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())

    B, S, V = t["micro_batch"], t["seq_len"], c["vocab_size"]
    decay, no_decay = [], []
    if args.weights:
        tensors, meta = read_safetensors(args.weights)
        data = tensors.pop("__batch__", None)
        if data is None or list(data.shape) != [B, S + 1]:
            sys.exit(f"train_step_peer.py: {args.weights} holds no __batch__ of shape [{B}, {S + 1}]")
        names = load_weights(model, tensors)
        decay_names = set(filter(None, meta.get("decay", "").split(",")))
        for name, prm in names.items():  # cemfrac's own groups
            (decay if name in decay_names else no_decay).append(prm)
    else:
        gen = torch.Generator().manual_seed(t["seed"])
        data = torch.randint(0, V, (B, S + 1), generator=gen)
        for name, prm in model.named_parameters():
            # Matrices (projections, head) decay; norms, biases and embeddings do not.
            (decay if prm.dim() >= 2 and "wte" not in name and "wpe" not in name else no_decay).append(prm)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"train_step_peer.py: --device {args.device}: this torch sees no CUDA device")
    model.to(device)  # in place: the optimizer groups above hold the same Parameter objects
    data = data.to(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["adam_eps"])

    inputs, targets = data[:, :S].contiguous(), data[:, 1:].contiguous()

    grad_norms = []  # before clipping

    def cpu_seconds():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def step():
        """One training step; returns its loss, its phases and the wall and CPU seconds of the
        check's own work inside it (which the caller leaves out of the step's times)."""
        opt.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, V), targets.view(-1))
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        check_s = check_cpu = 0.0
        if not grad_norms:
            # Step 0's gradient norm for the check against cemfrac, summed in float64 from the
            # gradients as they are: torch's float32 norm reduction rounds far more than the
            # gradients do (1.13, gpt2-124m: torch.norm of the 38.6M-element wte gradient 4.3e-3
            # off its float64 value, clip_grad_norm_'s total 1.0e-4; these gradients' norm summed
            # in float64, 1.3e-9). cemfrac sums its squares in float64 too.
            c0, u0 = time.perf_counter(), cpu_seconds()
            grads = [q.grad for q in model.parameters() if q.grad is not None]
            grad_norms.append(math.sqrt(sum(float(g.double().square().sum()) for g in grads)))
            check_s, check_cpu = time.perf_counter() - c0, cpu_seconds() - u0
        if t["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        sync()
        t3 = time.perf_counter()
        return loss.item(), (t1 - t0, t2 - t1, t3 - t2 - check_s), (check_s, check_cpu)

    losses, times, phases = [], [], []
    for _ in range(args.warmup):
        losses.append(step()[0])
    cpu = []

    for _ in range(args.steps):
        sync()
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        loss, ph, (check_s, check_cpu) = step()
        times.append(time.perf_counter() - t0 - check_s)
        cpu.append(cpu_seconds() - c0 - check_cpu)
        losses.append(loss)
        phases.append(ph)

    def med(i):
        return statistics.median(x[i] for x in phases) if phases else 0.0

    print(json.dumps({
        "python": sys.version.split()[0], "torch": torch.__version__,
        "threads": torch.get_num_threads(), "blas_core": blas_core(lib),
        "parameters": n_params, "adamw_foreach": opt.defaults.get("foreach"),
        "device": str(device),
        "steps": args.steps, "warmup": args.warmup,
        "step_s": times, "median_s": statistics.median(times) if times else 0.0,
        "min_s": min(times) if times else 0.0,
        "cpu_s": cpu, "cpu_median_s": statistics.median(cpu) if cpu else 0.0,
        "malloc_env": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")
                       if k in os.environ},
        "phases_median_s": {"forward": med(0), "backward": med(1), "clip_and_optimizer": med(2)},
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "first_grad_norm": grad_norms[0] if grad_norms else None,
    }))


if __name__ == "__main__":
    main()
