#!/usr/bin/python3
"""Forward+backward of cemfrac.ops.continued_fraction from Python, against the same ladder function as
a PyTorch custom autograd Function and as plain autograd (bench/peers/ladder_peer.py), all timed in
one process the same way (one warm-up, then best and median of --reps), plus the cost of one call
through the Python boundary.

  PYTHONPATH=build/python /usr/bin/python3 bench/python/ladder_op.py [--depth 8] [--ladders 1048576]

Rows (2^20 ladders of depth d by default, float32):
  cemfrac (..., d, L)   cemfrac.ops.continued_fraction(a, dim=-2): the kernel's own layout, no copy
  cemfrac (..., d)      the same ladders laid out depth-last (dim=-1): one transposing copy more
  custom_function       torch.autograd.Function, Proposition 1 backward (ladder_peer.py)
  autograd              the recurrence differentiated by autograd (ladder_peer.py)
The call overhead is the median time of a forward on one ladder (no grad) minus nothing: at that
size the kernel's own work is a few nanoseconds, so the time is the Python -> C++ round trip
(argument parsing, dispatch, output allocation).
The machine's load average is printed with the numbers: on a shared machine they are noise-bound.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "peers"))
import ladder_peer  # noqa: E402

import cemfrac  # noqa: E402


time_it = ladder_peer.time_it  # one warm-up, then best and median of reps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--ladders", type=int, default=1 << 20)
    p.add_argument("--width", type=int, default=1024, help="ladders per row of the (R, d, L) layout")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    p.add_argument("--eps", type=float, default=0.01)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    d, width = args.depth, args.width
    rows = max(1, args.ladders // width)
    load_before = os.getloadavg()
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(rows, d, width, generator=gen) * 6 - 3  # (R, d, L)
    g = torch.rand(rows, width, generator=gen) * 2 - 1
    a_last = a.transpose(1, 2).contiguous()  # (R, L, d): depth-last, the same ladders

    def fb(fn, x):
        def run():
            xx = x.detach().requires_grad_(True)
            torch.autograd.grad(fn(xx), xx, g)
        return run

    cf = cemfrac.ops.continued_fraction
    rows_out = {
        "cemfrac (..., d, L)": time_it(fb(lambda x: cf(x, eps=args.eps, dim=-2), a), args.reps),
        "cemfrac (..., d)": time_it(fb(lambda x: cf(x, eps=args.eps, dim=-1), a_last), args.reps),
        "custom_function": time_it(fb(lambda x: ladder_peer.continuant_custom(x, args.eps), a), args.reps),
        "autograd": time_it(fb(lambda x: ladder_peer.continuant_autograd(x, args.eps), a), args.reps),
    }
    tiny = torch.rand(1, d, 1) + 0.5
    calls = 2000

    def many():
        for _ in range(calls):
            cf(tiny, dim=-2)

    per_call = time_it(many, 5)
    overhead_us = per_call["median_ms"] * 1e3 / calls
    load_after = os.getloadavg()
    base = rows_out["cemfrac (..., d, L)"]["median_ms"]
    out = {
        "what": "forward+backward, float32, eps=%g" % args.eps, "depth": d, "ladders": rows * width,
        "rows": rows, "width": width, "threads": torch.get_num_threads(), "reps": args.reps,
        "torch": torch.__version__, "cemfrac": cemfrac.__version__,
        "load_average_before": load_before, "load_average_after": load_after,
        "results": rows_out,
        "ratio_to_cemfrac_median": {k: v["median_ms"] / base for k, v in rows_out.items()},
        "call_overhead_us": overhead_us,
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"ladders {rows * width} (rows {rows} x {width}), depth {d}, float32, threads {out['threads']}, "
          f"reps {args.reps}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"{'implementation':<22}{'best ms':>10}{'median ms':>11}{'x cemfrac':>11}")
    for k, v in rows_out.items():
        print(f"{k:<22}{v['best_ms']:>10.2f}{v['median_ms']:>11.2f}{v['median_ms'] / base:>11.2f}")
    print(f"one call through the Python boundary (1 ladder, no grad): {overhead_us:.1f} us")


if __name__ == "__main__":
    main()
