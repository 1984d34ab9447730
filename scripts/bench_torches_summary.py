"""Summarises scripts/bench_torches.sh's output folder as a Markdown table (medians over repeats).
    python3 scripts/bench_torches_summary.py results/torches-<date>
"""
import glob
import json
import os
import statistics
import sys


def load(folder, row, build):
    return [json.load(open(f)) for f in sorted(glob.glob(os.path.join(folder, f"{row}.{build}.*.json")))]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(folder):
    out = ["| row | host (LibTorch 1.13, OpenBLAS) | pip (torch 2.11.0, MKL) | pip / host |", "|---|---|---|---|"]
    for cfg in ("small-llama", "small-cem-both", "small-cofrgenet-f"):
        h, p = load(folder, f"train-{cfg}", "host"), load(folder, f"train-{cfg}", "pip")
        if not h or not p:
            continue
        hs, ps = med([j["cpp"]["median_s"] for j in h]), med([j["cpp"]["median_s"] for j in p])
        hp, pp = med([j["peer"]["median_s"] for j in h]), med([j["peer"]["median_s"] for j in p])
        hm, pm = med([j["cpp"]["mfu"] for j in h]), med([j["cpp"]["mfu"] for j in p])
        hr, pr = med([j["ratio_median"] for j in h]), med([j["ratio_median"] for j in p])
        out.append(f"| `bench train` {cfg}: cemfrac step | {hs:.3f} s (MFU {hm:.1%}) | {ps:.3f} s (MFU {pm:.1%}) | {ps / hs:.2f} |")
        out.append(f"| ... its PyTorch eager peer (same torch) | {hp:.3f} s | {pp:.3f} s | {pp / hp:.2f} |")
        out.append(f"| ... cemfrac / peer | {hr:.3f} | {pr:.3f} | |")
    h, p = load(folder, "ladder-d8", "host"), load(folder, "ladder-d8", "pip")
    if h and p:
        def pick(js, impl, phase):
            return med([j["results"][0][impl][phase]["median_ms"] for j in js])
        for impl, name in (("kernel", "ladder kernel"), ("fused", "fused op (dispatcher)"),
                           ("peer_custom_function", "peer: PyTorch custom Function")):
            for phase in ("forward", "forward_backward"):
                a, b = pick(h, impl, phase), pick(p, impl, phase)
                out.append(f"| `bench ladder` d=8, {name}, {phase.replace('_', '+')} | {a:.2f} ms | {b:.2f} ms | {b / a:.2f} |")
        floor = h[0]["results"][0]["floor_forward_backward_ms"]
        out.append(f"| ... bandwidth floor, forward+backward | {floor:.2f} ms | {p[0]['results'][0]['floor_forward_backward_ms']:.2f} ms | |")
    h, p = load(folder, "layers", "host"), load(folder, "layers", "pip")
    if h and p:
        def rows(js):
            d = {}
            for j in js:
                for r in j["rows"]:
                    d.setdefault((r["kind"], r["variant"]), []).append(r["forward_backward_ms"]["median"])
            return {k: med(v) for k, v in d.items()}
        hr, pr = rows(h), rows(p)
        for k in hr:
            if k in pr:
                name = k[0] + ("" if k[1] == "default" else f" ({k[1]})")
                out.append(f"| `bench layers` {name}, forward+backward | {hr[k]:.2f} ms | {pr[k]:.2f} ms | {pr[k] / hr[k]:.2f} |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
