#!/usr/bin/python3
"""Python peer for `cemfrac bench generate`: greedy decoding of the same decoder-only LM with a KV cache,
written the way a PyTorch user who cares about speed writes it in eager mode, timed like the C++ side
(same weights, prompts, batch sizes, new tokens, threads, BLAS core).

  model      the model of train_step_peer.py (imported from it: norms, RoPE, SwiGLU, GELU MLP, the name
             map and the safetensors reader), mixer mha only (llama and gpt2 flavours, grouped-query
             heads included), with attention replaced by a cached one.
  cache      per layer, K and V tensors (B, H_kv, context, d_h) allocated once per generation for the
             whole context; each forward writes its positions in place (k_cache[:, :, p:p+N] = k) and
             attends over the filled prefix; grouped-query heads share their K/V through a view
             (B, H_kv, group, N, d_h), not repeat_interleave; no mask at one position per step.
  decode     torch.inference_mode(); the prompt (B, P) in one forward, then one position per forward;
             greedy = argmax over the tokenizer's ids (--vocab-limit), the tokens kept on the tensor side
             and read once at the end; no stop at end-of-text (as `bench generate`).
  timing     prefill = the first forward up to its last-position logits; decode = everything after it
             until the last token is drawn (new_tokens - 1 forwards of one position), one warm-up
             generation then --reps timed ones; medians.
  memory     peak RSS growth of one generation: VmHWM after resetting it (writing 5 to
             /proc/self/clear_refs) minus VmRSS before (glibc's defaults: large tensors are mmapped and
             returned when freed, so this follows the live tensors); null where the reset is refused.
  check      --weights FILE (written by `cemfrac bench generate`) holds cemfrac's weights under its names,
             the prompts (__prompts__, int64 (B_max, P)), cemfrac's last-position logits of the prompt
             (__logits0__), its first greedy tokens (__first__) and the logits after feeding them
             (__logits1__). The peer computes the same two sets of logits (feeding cemfrac's first
             tokens, so a near tie cannot make the comparison moot) and reports the largest absolute
             difference and the largest |logit|; cemfrac decides agreement and compares the tokens.

Run with Debian's interpreter (python3-torch): /usr/bin/python3 bench/peers/decode_peer.py --help.
Prints one JSON object on stdout.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import train_step_peer as base  # noqa: E402


class CachedAttention(base.Attention):
    """train_step_peer's Attention (same parameters and names) with a preallocated KV cache."""

    def reset(self, B):
        n = self.mask.shape[0]
        w = self.qkv.weight
        self.k_cache = torch.empty(B, self.h_kv, n, self.d_h, dtype=w.dtype, device=w.device)
        self.v_cache = torch.empty_like(self.k_cache)

    def forward(self, x, cos, sin, pos):
        B, N, _ = x.shape
        H, H_kv, d_h = self.h, self.h_kv, self.d_h
        q, k, v = self.qkv(x).split([H * d_h, H_kv * d_h, H_kv * d_h], -1)
        q = q.view(B, N, H, d_h).transpose(1, 2)
        k = k.view(B, N, H_kv, d_h).transpose(1, 2)
        v = v.view(B, N, H_kv, d_h).transpose(1, 2)
        if self.rope:
            q = q * cos + base.rotate_half(q) * sin
            k = k * cos + base.rotate_half(k) * sin
        T = pos + N
        self.k_cache[:, :, pos:T] = k
        self.v_cache[:, :, pos:T] = v
        keys, values = self.k_cache[:, :, :T], self.v_cache[:, :, :T]  # (B, H_kv, T, d_h)
        g = H // H_kv
        q = q.reshape(B, H_kv, g, N, d_h)
        att = (q @ keys.unsqueeze(2).transpose(-2, -1)) * (1.0 / math.sqrt(d_h))  # (B, H_kv, g, N, T)
        if N > 1:
            att = att.masked_fill(~self.mask[pos:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ values.unsqueeze(2)).reshape(B, H, N, d_h).transpose(1, 2).reshape(B, N, H * d_h)
        return self.out(y)


def build(c):
    """train_step_peer's LM with CachedAttention as its mha."""
    plain = base.MIXERS["mha"]
    base.MIXERS["mha"] = CachedAttention
    try:
        return base.LM(c)
    finally:
        base.MIXERS["mha"] = plain  # train_step_peer's own models stay uncached


def forward(model, tokens, pos):
    """tokens (B, N) at positions pos.. -> last-position logits (B, V), caches extended."""
    N = tokens.shape[1]
    z = model.wte(tokens)
    if model.wpe is not None:
        z = z + model.wpe.weight[pos:pos + N]
    cos = model.cos[pos:pos + N] if model.cos is not None else None
    sin = model.sin[pos:pos + N] if model.sin is not None else None
    for block in model.blocks:
        z = z + block.attn(block.norm1(z), cos, sin, pos)
        z = z + block.mlp(block.norm2(z))
    return model.head(model.norm_f(z[:, -1]))


def reset(model, B):
    for block in model.blocks:
        block.attn.reset(B)


def generate(model, prompts, new_tokens, limit):
    """Greedy: (tokens (B, new_tokens), prefill_s, decode_s)."""
    B, P = prompts.shape
    t0 = time.perf_counter()
    reset(model, B)
    logits = forward(model, prompts, 0)[:, :limit]
    t1 = time.perf_counter()
    out = torch.empty(B, new_tokens, dtype=torch.int64)
    for step in range(new_tokens):
        nxt = logits.argmax(-1)
        out[:, step] = nxt
        if step + 1 == new_tokens:
            break
        logits = forward(model, nxt.view(B, 1), P + step)[:, :limit]
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-json", required=True, help="cemfrac config.json fields (the model)")
    p.add_argument("--weights", required=True, help="safetensors file from `cemfrac bench generate`")
    p.add_argument("--batches", default="1,8", help="batch sizes, comma-separated (each <= B_max)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--vocab-limit", type=int, default=0, help="argmax over ids below this (0 = all)")
    p.add_argument("--reps", type=int, default=3, help="timed generations after one warm-up")
    p.add_argument("--threads", type=int, default=0, help="0 = leave torch's default")
    args = p.parse_args()
    c = json.loads(args.config_json)
    if c.get("layer_overrides"):
        sys.exit("decode_peer.py: this peer does not model per-layer overrides")
    if c["mixer"] != "mha" or c["ffn"] not in ("swiglu", "gelu_mlp"):
        sys.exit(f"decode_peer.py: this peer models mixer mha with ffn swiglu or gelu_mlp only, not "
                 f"{c['mixer']} + {c['ffn']}")
    why_not = base.unsupported(c)
    if why_not:
        sys.exit(f"decode_peer.py: this peer does not model {why_not}")

    lib = base.openblas()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        if lib is not None:
            lib.openblas_set_num_threads(ctypes.c_int(args.threads))
    model = build(c)
    model.eval()
    tensors, _ = base.read_safetensors(args.weights)
    prompts = tensors.pop("__prompts__")
    logits0 = tensors.pop("__logits0__")
    first = tensors.pop("__first__")
    logits1 = tensors.pop("__logits1__")
    base.load_weights(model, tensors)
    limit = args.vocab_limit or c["vocab_size"]

    with torch.inference_mode():
        # The check: the same logits from the same weights and prompts.
        B_max, P = prompts.shape
        reset(model, B_max)
        mine0 = forward(model, prompts, 0)[:, :limit]
        mine1 = forward(model, first.view(B_max, 1), P)[:, :limit]
        check = {"max_abs_diff": max((mine0 - logits0).abs().max().item(),
                                     (mine1 - logits1).abs().max().item()),
                 "max_abs_logit": max(logits0.abs().max().item(), logits1.abs().max().item())}

        results = []
        for B in [int(b) for b in args.batches.split(",") if b]:
            x = prompts[:B].contiguous()
            reset_ok = reset_peak_rss()
            rss0 = rss_kib("VmRSS")
            tokens, _, _ = generate(model, x, args.new_tokens, limit)  # warm-up, memory
            peak = (rss_kib("VmHWM") - rss0) * 1024 if reset_ok else None
            prefill, decode = [], []
            for _ in range(args.reps):
                _, a, b = generate(model, x, args.new_tokens, limit)
                prefill.append(a)
                decode.append(b)
            d_h = c["d_model"] // c["n_heads"]
            h_kv = c["n_kv_heads"] or c["n_heads"]
            results.append({
                "batch": B, "prefill_s": prefill, "decode_s": decode,
                "prefill_median_s": statistics.median(prefill),
                "decode_median_s": statistics.median(decode),
                "prefill_tokens_per_s": B * P / statistics.median(prefill),
                "decode_tokens_per_s": B * (args.new_tokens - 1) / statistics.median(decode),
                "peak_rss_growth_bytes": peak,
                "cache_bytes": 2 * c["n_layers"] * B * h_kv * c["context"] * d_h * 4,
                "tokens": tokens.tolist(),
            })

    print(json.dumps({
        "python": sys.version.split()[0], "torch": torch.__version__,
        "threads": torch.get_num_threads(), "blas_core": base.blas_core(lib),
        "parameters": sum(q.numel() for q in model.parameters()),
        "prompt_len": int(P), "new_tokens": args.new_tokens, "reps": args.reps,
        "check": check, "results": results,
    }))


if __name__ == "__main__":
    main()
