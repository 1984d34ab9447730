#!/usr/bin/env python3
"""The first GPU run in one command (scripts/gpu_check.sh runs this; docs/gpu.md, "The GPU check").

  scripts/gpu_check.sh [--out DIR] [--build DIR] [--python PY] [--prefix DIR] [--no-build]
                       [--peak-tflops X] [--jobs N]
  scripts/gpu_check.sh --validate REPORT.json

Steps, each timed, its outcome recorded as passed, failed or skipped (with the reason):
  machine   nvidia-smi's GPU, driver and memory; the interpreter's torch and whether it sees CUDA
  build     CMake against that interpreter's torch (CEMFRAC_CUDA=ON, the GPU's own architecture) and
            the dependency prefix carried with the tree (.gpu-prefix, scripts/gpu-prefix.sh); the
            targets the check runs (the CLI and tests/cuda); then scripts/check_prefix_build.py
  cuda      tests/cuda's executable (label `cuda`): every test passed, or skipped naming why
  ladder    `bench ladder --device cuda`: the fused ladder kernel against the HBM floor
  train     `bench train --device cuda --precision bf16` of llama-162m, cem-both-162m, gpt2-124m and
            CoFrGeNet-F at GPT-2-124M's shape, MFU against the stated dense bf16 peak and against a
            bf16 matmul measured in the same run
Without a CUDA device (every CI run, through the pip leg) the GPU steps are skipped with the reason
and the report is still written, in the same format. Writes DIR/gpu-check.json and DIR/gpu-check.md;
exits 0 when no step failed (skips included), 1 otherwise, 2 on bad arguments. Targets (the GPU
issue's) are reported as met or not; missing one does not fail the check.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = 1
STATUSES = ("passed", "failed", "skipped")
# Dense bf16 tensor-core peaks from the vendors' data sheets, TFLOP/s (no sparsity), by the name
# nvidia-smi gives. H200 SXM has the H100 SXM's arithmetic.
STATED_PEAKS = [("H100 80GB HBM3", 989.0), ("H100 SXM", 989.0), ("H200", 989.0), ("H100 PCIe", 756.0),
                ("A100", 312.0)]
TRAIN_RUNS = [
    ("llama-162m", "configs/llama-162m.toml", []),
    ("cem-both-162m", "configs/cem-both-162m.toml", []),
    ("gpt2-124m", "configs/gpt2-124m.toml", []),
    ("cofrgenet-f-124m", "configs/gpt2-124m.toml",
     ["model.ffn=cffn", "model.cofrgenet.ladders=3", "model.cofrgenet.depth=5"]),
]
LADDER_ARGS = ["--ladders", "16777216", "--width", "4096", "--depths", "1,2,4,8", "--reps", "20"]
TARGETS = {  # name: (limit, "at_most" | "at_least", what)
    "ladder_forward_backward_x_floor": (1.5, "at_most", "fused ladder forward+backward time / HBM floor, worst depth"),
    "llama_162m_bf16_mfu": (0.40, "at_least", "llama-162m bf16 training MFU against the stated dense bf16 peak"),
    "cem_both_over_llama_step": (1.2, "at_most", "cem-both-162m bf16 step time / llama-162m's"),
    "cofrgenet_f_over_gpt2_step": (1.0, "at_most", "CoFrGeNet-F bf16 step time / GPT-2-124M's at equal width"),
}


def run(cmd, timeout, cwd=ROOT, env=None):
    """(exit code, stdout, stderr); 124 on timeout, 127 when the program is missing."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, e.stdout or "", f"timed out after {timeout} s"
    except FileNotFoundError as e:
        return 127, "", str(e)


def tail(text, n=1500):
    text = text if isinstance(text, str) else (text or b"").decode("utf-8", "replace")
    return text[-n:]


class Report:
    def __init__(self, out):
        self.out = out
        self.data = {"schema": SCHEMA, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "machine": {}, "steps": [], "targets": [], "results": {}}
        self.t0 = time.monotonic()

    def step(self, name, status, seconds, detail):
        assert status in STATUSES
        detail = re.sub(r"\s+", " ", detail).strip()
        self.data["steps"].append({"name": name, "status": status, "seconds": round(seconds, 1), "detail": detail})
        print(f"gpu_check: {name}: {status} ({seconds:.0f} s) {detail}", flush=True)

    def target(self, name, value):
        limit, sense, what = TARGETS[name]
        met = None if value is None else (value <= limit if sense == "at_most" else value >= limit)
        self.data["targets"].append({"name": name, "what": what, "value": value, "limit": limit,
                                     "sense": sense, "met": met})

    def write(self):
        self.data["seconds"] = round(time.monotonic() - self.t0, 1)
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "gpu-check.json"), "w") as f:
            json.dump(self.data, f, indent=2)
            f.write("\n")
        with open(os.path.join(self.out, "gpu-check.md"), "w") as f:
            f.write(markdown(self.data))
        problems = validate(self.data)
        if problems:
            sys.exit("gpu_check: the report breaks its own format: " + "; ".join(problems))


def markdown(d):
    m = d["machine"]
    lines = ["# cemfrac GPU check", "",
             f"Started {d['started']}, {d['seconds']:.0f} s in all. Commit {m.get('commit', '?')}.", "",
             f"GPU: {m.get('gpu', 'none')}; driver {m.get('driver', '-')}; torch {m.get('torch', '-')} "
             f"(CUDA {m.get('torch_cuda', '-')}), CUDA visible: {m.get('cuda_available')}; "
             f"{m.get('cpus', '?')} CPUs; nvcc {m.get('nvcc', '-')}.", "",
             "| step | status | seconds | detail |", "|---|---|---:|---|"]
    for s in d["steps"]:
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | {s['detail'].replace('|', '/')} |")
    lines += ["", "| target | value | limit | met |", "|---|---:|---:|---|"]
    for t in d["targets"]:
        v = "-" if t["value"] is None else f"{t['value']:.3f}"
        sign = "<=" if t["sense"] == "at_most" else ">="
        met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
        lines.append(f"| {t['what']} | {v} | {sign} {t['limit']} | {met} |")
    tr = d["results"].get("train", {})
    if tr:
        lines += ["", "| model | fp32 step s | bf16 step s | bf16 tokens/s | bf16 MFU (stated peak) | bf16 MFU (bf16 matmul now) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, r in tr.items():
            lines.append(f"| {name} | {r['fp32_median_s']:.4f} | {r['bf16_median_s']:.4f} | {r['bf16_tokens_per_s']:.0f} | "
                         f"{100 * (r['bf16_mfu_stated'] or 0):.1f}% | {100 * r['bf16_mfu_measured']:.1f}% |")
    return "\n".join(lines) + "\n"


def validate(d):
    """The report's format (docs/gpu.md): the list of what is wrong, empty when it is right."""
    problems = []
    if d.get("schema") != SCHEMA:
        problems.append(f"schema is {d.get('schema')!r}, not {SCHEMA}")
    for key in ("started", "machine", "steps", "targets", "results", "seconds"):
        if key not in d:
            problems.append(f"no '{key}'")
    names = [s.get("name") for s in d.get("steps", [])]
    for want in ("machine", "build", "cuda", "ladder", "train"):
        if want not in names:
            problems.append(f"no step '{want}'")
    for s in d.get("steps", []):
        if s.get("status") not in STATUSES or not isinstance(s.get("seconds"), (int, float)) or not s.get("detail"):
            problems.append(f"step {s.get('name')!r} lacks a status, seconds or detail")
    if sorted(t.get("name") for t in d.get("targets", [])) != sorted(TARGETS):
        problems.append("the targets are not " + ", ".join(sorted(TARGETS)))
    for t in d.get("targets", []):
        if t.get("met") not in (True, False, None) or (t.get("value") is None) != (t.get("met") is None):
            problems.append(f"target {t.get('name')!r}: value and met disagree")
    return problems


def machine(report, py):
    m = report.data["machine"]
    m["cpus"] = os.cpu_count()
    rc, out, _ = run(["git", "rev-parse", "--short=12", "HEAD"], 30)
    m["commit"] = out.strip() if rc == 0 else "not a git checkout"
    rc, out, _ = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], 60)
    if rc == 0 and out.strip():
        name, driver, mem = [x.strip() for x in out.strip().splitlines()[0].split(",")]
        m.update(gpu=name, driver=driver, gpu_memory=mem)
    rc, out, _ = run(["nvcc", "--version"], 60)
    found = re.search(r"release ([0-9.]+)", out) if rc == 0 else None
    m["nvcc"] = found.group(1) if found else None
    probe = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
             "'torch_cuda': torch.version.cuda, 'cuda_available': c, 'capability': "
             "list(torch.cuda.get_device_capability()) if c else None, 'torch_device': "
             "torch.cuda.get_device_name() if c else None, 'cmake_prefix': torch.utils.cmake_prefix_path, "
             "'torch_root': __import__('os').path.dirname(torch.__file__)}))")
    rc, out, err = run([py, "-c", "import torch.utils\n" + probe], 120)
    if rc != 0:
        return f"{py} cannot import torch: {tail(err, 300)}"
    m.update(json.loads(out.strip().splitlines()[-1]))
    return ""


def stated_peak(name, override):
    if override:
        return override
    for key, peak in STATED_PEAKS:
        if name and key in name:
            return peak
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build-gpu", "gpu-check"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build-gpu"))
    ap.add_argument("--python", default=shutil.which("python3") or "python3")
    ap.add_argument("--prefix", default=os.path.join(ROOT, ".gpu-prefix"))
    ap.add_argument("--no-build", action="store_true", help="use --build as it is (built already)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="stated dense bf16 peak (default: by GPU name)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--validate", metavar="REPORT", help="check a report's format and exit")
    a = ap.parse_args()
    a.python = shutil.which(a.python) or a.python  # the build records it (bench peers run under it)
    if a.validate:
        with open(a.validate) as f:
            problems = validate(json.load(f))
        print("gpu_check: " + ("; ".join(problems) if problems else f"{a.validate} is a valid report"))
        return 1 if problems else 0

    os.makedirs(a.out, exist_ok=True)
    report = Report(a.out)
    t = time.monotonic()
    why = machine(report, a.python)
    m = report.data["machine"]
    report.step("machine", "failed" if why else "passed", time.monotonic() - t,
                why or f"GPU {m.get('gpu') or 'none'}, torch {m.get('torch')}, CUDA visible: {m.get('cuda_available')}")
    gpu = bool(m.get("cuda_available"))
    no_gpu = "no CUDA device visible to torch on this machine" + ("" if m.get("gpu") else " (no nvidia-smi GPU)")

    # ---- build ----
    t = time.monotonic()
    exe = os.path.join(a.build, "tools", "cemfrac")
    cuda_tests = os.path.join(a.build, "tests", "cuda_tests")
    build_ok = False
    if why:
        report.step("build", "skipped", 0, "no torch to build against")
    elif not os.path.isfile(os.path.join(a.prefix, ".cemfrac-prefix")):
        report.step("build", "failed", 0, f"no dependency prefix at {a.prefix}: make it with scripts/gpu-prefix.sh "
                    "on a Debian machine and carry it with the tree")
    else:
        log = []
        rc = 0
        if not a.no_build:
            cap = m.get("capability")
            arch = f"{cap[0]}{cap[1]}-real" if cap else "80-real;90-real;90-virtual"
            cmd = ["cmake", "-S", ROOT, "-B", a.build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                   "-DCEMFRAC_CUDA=ON", f"-DCEMFRAC_CUDA_ARCHITECTURES={arch}", "-DCEMFRAC_PYTHON=OFF",
                   f"-DCEMFRAC_PYTHON_EXECUTABLE={a.python}",
                   f"-DCMAKE_PREFIX_PATH={a.prefix}/usr;{m['cmake_prefix']}",
                   f"-DPKG_CONFIG_EXECUTABLE={a.prefix}/bin/pkg-config"]
            rc, out, err = run(cmd, 300)
            log.append(tail(out + err))
            if rc == 0:
                rc, out, err = run(["cmake", "--build", a.build, "--target", "cemfrac", "cuda_tests", "--",
                                    f"-j{a.jobs}"], 540)
                log.append(tail(out + err))
        if rc == 0:
            rc, out, err = run([sys.executable, os.path.join(ROOT, "scripts", "check_prefix_build.py"), a.build,
                                a.prefix, m["torch_root"]], 300)
            log.append(tail(out + err, 600))
        build_ok = rc == 0 and os.path.isfile(exe)
        with open(os.path.join(a.out, "build.log"), "w") as f:
            f.write("\n".join(log))
        report.step("build", "passed" if build_ok else "failed", time.monotonic() - t,
                    ("built " if not a.no_build else "used ") + a.build + "; " +
                    (out.strip().splitlines()[-1] if build_ok and out.strip() else tail("\n".join(log), 400)))

    # ---- cuda tests ----
    t = time.monotonic()
    if not build_ok or not os.path.isfile(cuda_tests):
        report.step("cuda", "skipped", 0, "no build" if not build_ok else f"{cuda_tests} was not built")
    else:
        js = os.path.join(a.out, "cuda-tests.json")
        rc, out, err = run([cuda_tests, f"--gtest_output=json:{js}"], 300)
        try:
            with open(js) as f:
                g = json.load(f)
            cases = [c for s in g.get("testsuites", []) for c in s.get("testsuite", [])]
            failed = [c["name"] for c in cases if c.get("failures")]
            skipped = [c["name"] for c in cases if c.get("result") == "SKIPPED"]
            report.data["results"]["cuda_tests"] = {"tests": len(cases), "failed": failed, "skipped": skipped}
            detail = f"{len(cases)} tests, {len(failed)} failed, {len(skipped)} skipped"
            if skipped and not gpu:
                detail += f" ({no_gpu})"
            status = "failed" if failed or rc != 0 else ("skipped" if len(skipped) == len(cases) else "passed")
        except (OSError, ValueError) as e:
            status, detail = "failed", f"exit {rc}, no JSON ({e}): {tail(err, 300)}"
        report.step("cuda", status, time.monotonic() - t, detail)

    # ---- ladder ----
    t = time.monotonic()
    worst = None
    if not gpu or not build_ok:
        report.step("ladder", "skipped", 0, no_gpu if not gpu else "no build")
    else:
        rc, out, err = run([exe, "--device", "cuda", "bench", "ladder", "--json", "--no-peer"] + LADDER_ARGS, 300)
        if rc == 0:
            j = json.loads(out)
            rows = {}
            for r in j["results"]:
                fb = r["fused"]["forward_backward"]["best_ms"]
                rows[r["depth"]] = {"fused_fb_ms": fb, "floor_fb_ms": r["floor_forward_backward_ms"],
                                    "x_floor": fb / r["floor_forward_backward_ms"],
                                    "kernel_fb_ms": r["kernel"]["forward_backward"]["best_ms"],
                                    "reference_fb_ms": r["reference"]["forward_backward"]["best_ms"]}
            worst = max(v["x_floor"] for v in rows.values())
            report.data["results"]["ladder"] = {"copy_gbs": j["copy_gbs"], "ladders": j["ladders"], "depths": rows}
            with open(os.path.join(a.out, "bench-ladder.json"), "w") as f:
                f.write(out)
            report.step("ladder", "passed", time.monotonic() - t,
                        f"HBM copy {j['copy_gbs']:.0f} GB/s; fused forward+backward {worst:.2f}x the floor at worst")
        else:
            report.step("ladder", "failed", time.monotonic() - t, f"exit {rc}: {tail(err, 400)}")
    report.target("ladder_forward_backward_x_floor", worst)

    # ---- train ----
    t = time.monotonic()
    peak = stated_peak(m.get("gpu") or m.get("torch_device"), a.peak_tflops)
    train = {}
    if not gpu or not build_ok:
        report.step("train", "skipped", 0, no_gpu if not gpu else "no build")
    else:
        failures = []
        for name, config, sets in TRAIN_RUNS:
            cmd = [exe, "--device", "cuda", "bench", "train", "--config", os.path.join(ROOT, config), "--json",
                   "--precision", "bf16", "--steps", "10", "--warmup", "3"]
            if peak:
                cmd += ["--peak-tflops", str(peak)]
            for s in sets:
                cmd += ["--set", s]
            rc, out, err = run(cmd, 240)
            if rc != 0:
                failures.append(f"{name}: exit {rc}: {tail(err, 300)}")
                continue
            j = json.loads(out)
            with open(os.path.join(a.out, "bench-train.jsonl"), "a") as f:
                f.write(json.dumps({"name": name, "report": j}) + "\n")
            b = j["cpp_bf16"]
            train[name] = {"parameters": j["parameters"], "tokens_per_step": j["tokens_per_step"],
                           "fp32_median_s": j["cpp"]["median_s"], "bf16_median_s": b["median_s"],
                           "bf16_tokens_per_s": b["tokens_per_s"], "bf16_mfu_stated": b.get("mfu_vs_stated_peak"),
                           "bf16_mfu_measured": b["mfu"], "bf16_matmul_tflops": j["bf16_matmul_gflops"]["peak"] / 1e3,
                           "peer_ratio_fp32": j.get("ratio_median")}
        report.data["results"]["train"] = train
        report.data["results"]["stated_peak_tflops"] = peak
        report.step("train", "failed" if failures else "passed", time.monotonic() - t,
                    "; ".join(failures) if failures else
                    f"{len(train)} models, bf16, MFU against {peak or 'no stated'} TFLOP/s and the bf16 matmul now")
    llama = train.get("llama-162m")
    report.target("llama_162m_bf16_mfu", llama["bf16_mfu_stated"] if llama else None)
    cem, gpt2, cfg = train.get("cem-both-162m"), train.get("gpt2-124m"), train.get("cofrgenet-f-124m")
    report.target("cem_both_over_llama_step", cem["bf16_median_s"] / llama["bf16_median_s"] if cem and llama else None)
    report.target("cofrgenet_f_over_gpt2_step", cfg["bf16_median_s"] / gpt2["bf16_median_s"] if cfg and gpt2 else None)

    report.write()
    failed = [s["name"] for s in report.data["steps"] if s["status"] == "failed"]
    print(f"gpu_check: report {os.path.join(a.out, 'gpu-check.md')}; "
          + (f"FAILED: {', '.join(failed)}" if failed else "no step failed"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
