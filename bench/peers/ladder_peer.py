#!/usr/bin/python3
"""Python peer for `cemfrac bench ladder --peer`: the same ladder function written three ways in
PyTorch, timed the same way as the C++ side (same shapes, threads, warm-up, best and median of reps).

  custom_function   a torch.autograd.Function: tail continuants by the recurrence, the sign-preserving
                    clamp of K_d, one reciprocal; backward by Proposition 1 from the stored continuants
                    and the cached reciprocal (the design of the one public implementation)
  autograd          the same forward, K_{d-1} / K̂_d, differentiated by autograd through the recurrence
  literal           the nested fraction with d guarded reciprocals, differentiated by autograd

Run with Debian's interpreter (python3-torch): /usr/bin/python3 bench/peers/ladder_peer.py --help.
Prints one JSON object on stdout.
"""
import argparse
import json
import statistics
import sys
import time

import torch


def tail_continuants(a):
    """a: (R, d, L) -> list [K_0, ..., K_d] of (R, L); K_j = a_{d-j+1} K_{j-1} + K_{j-2}."""
    d = a.shape[1]
    prev = torch.zeros_like(a[:, 0])
    cur = torch.ones_like(prev)
    tails = [cur]
    for k in range(d, 0, -1):
        prev, cur = cur, a[:, k - 1] * cur + prev
        tails.append(cur)
    return tails


def guard(z, eps):
    """sgn(z) max(|z|, eps) with sgn(0) = +1."""
    return torch.where(z >= 0, z.clamp_min(eps), z.clamp_max(-eps))


class ContinuantFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, eps):
        d = a.shape[1]
        tails = tail_continuants(a)
        r = guard(tails[d], eps).reciprocal()
        # Slot k-1 holds K_{d-k}, the continuant that multiplies grad a_k.
        k_saved = torch.stack([tails[d - k] for k in range(1, d + 1)], dim=1)
        ctx.save_for_backward(k_saved, r)
        return tails[d - 1] * r

    @staticmethod
    def backward(ctx, grad_f):
        k_saved, r = ctx.saved_tensors
        d = k_saved.shape[1]
        # df/da_k = (-1)^k (K_{d-k} r)^2
        signs = torch.tensor([(-1.0) ** k for k in range(1, d + 1)], dtype=r.dtype).view(1, d, 1)
        q = k_saved * r.unsqueeze(1)
        return signs * q * q * grad_f.unsqueeze(1), None


def continuant_custom(a, eps):
    return ContinuantFunction.apply(a, eps)


def continuant_autograd(a, eps):
    tails = tail_continuants(a)
    d = a.shape[1]
    return tails[d - 1] / guard(tails[d], eps)


def continuant_literal(a, eps):
    d = a.shape[1]
    t = guard(a[:, d - 1], eps).reciprocal()
    for k in range(d - 1, 0, -1):
        t = guard(a[:, k - 1] + t, eps).reciprocal()
    return t


IMPLS = {"custom_function": continuant_custom, "autograd": continuant_autograd,
         "literal": continuant_literal}


def time_it(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"best_ms": min(times) * 1e3, "median_ms": statistics.median(times) * 1e3}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depths", default="1,2,4,6,8")
    p.add_argument("--ladders", type=int, default=1 << 20, help="ladders in total (rows x width)")
    p.add_argument("--width", type=int, default=1024, help="ladders per row")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="0 = leave torch's default")
    p.add_argument("--eps", type=float, default=0.01)
    p.add_argument("--check", action="store_true", help="only check the three against each other")
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rows = max(1, args.ladders // args.width)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": sys.version.split()[0],
           "rows": rows, "width": args.width, "reps": args.reps, "results": []}
    gen = torch.Generator().manual_seed(0)
    for d in [int(x) for x in args.depths.split(",") if x]:
        a = torch.rand(rows, d, args.width, generator=gen) * 6 - 3
        g = torch.rand(rows, args.width, generator=gen) * 2 - 1
        # The custom Function and autograd agree wherever the guard is inactive (inside the clamp the
        # first uses Proposition 1 with K̂_d, autograd the exact derivative): check on a positive input.
        small = (a[:4].abs() + 0.5).double().requires_grad_(True)
        gs = g[:4].double()
        f1 = continuant_custom(small, args.eps)
        f2 = continuant_autograd(small, args.eps)
        g1, = torch.autograd.grad(f1, small, gs)
        g2, = torch.autograd.grad(f2, small, gs)
        check = {"forward_max_abs_diff": (f1 - f2).abs().max().item(),
                 "grad_max_rel_diff": ((g1 - g2).abs() / g2.abs().clamp_min(1e-12)).max().item()}
        entry = {"depth": d, "check": check}
        if not args.check:
            for name, fn in IMPLS.items():
                def forward():
                    with torch.no_grad():
                        fn(a, args.eps)

                def forward_backward():
                    x = a.detach().requires_grad_(True)
                    torch.autograd.grad(fn(x, args.eps), x, g)

                entry[name] = {"forward": time_it(forward, args.reps),
                               "forward_backward": time_it(forward_backward, args.reps)}
        out["results"].append(entry)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
