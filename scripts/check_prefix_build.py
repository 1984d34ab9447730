#!/usr/bin/env python3
"""Proves that a cemfrac build used only the libraries of a dependency prefix (scripts/gpu-prefix.sh)
and the torch it was pointed at, not a system copy of either:

  scripts/check_prefix_build.py BUILD PREFIX TORCH_ROOT

  1. CMake: every package found from the prefix (fmt_DIR, nlohmann_json_DIR, CLI11_DIR,
     tomlplusplus_DIR, GTest_DIR, benchmark_DIR when found, the pkg-config libraries of SentencePiece
     and PCRE2, pkg-config itself) and Torch_DIR under TORCH_ROOT (CMakeCache.txt).
  2. The compiler: no header of these packages, and no LibTorch header, was read from a system folder
     (/usr/include, /usr/local/include): `ninja -t deps` lists every header each object read, and the
     prefix's and TORCH_ROOT's headers must be among them.
  3. The loader: the executable's libfmt and libpcre2-8, the SentencePiece shim's libsentencepiece,
     and libtorch resolve inside the prefix and TORCH_ROOT (ldd).

Prints one line per check and exits 1 naming the first path that breaks the rule. Run by the pip leg
after its build (CI) and by scripts/gpu_check.sh on the GPU machine.
"""
import os
import re
import subprocess
import sys

PACKAGES_DIRS = ["fmt_DIR", "nlohmann_json_DIR", "CLI11_DIR", "tomlplusplus_DIR", "GTest_DIR"]
OPTIONAL_DIRS = ["benchmark_DIR"]  # Google Benchmark (bench/): in the prefix when the build found one
PKG_LIBS = ["pkgcfg_lib_SENTENCEPIECE_sentencepiece", "pkgcfg_lib_PCRE2_pcre2-8", "PKG_CONFIG_EXECUTABLE"]
# Headers that must come from the prefix, by their path under an include folder.
PREFIX_HEADERS = re.compile(r"^(fmt/|nlohmann/|CLI/|toml\+\+/|sentencepiece_|pcre2\.h|gtest/|gmock/|benchmark/)")
TORCH_HEADERS = re.compile(r"^(torch/|ATen/|c10/|caffe2/)")
SYSTEM_INCLUDES = ["/usr/include/", "/usr/local/include/"]


def fail(msg):
    print(f"check_prefix_build: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def under(path, root):
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def cmake_cache(build):
    cache = {}
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^([^#/][^:=]*):[A-Z]+=(.*)$", line.rstrip("\n"))
            if m:
                cache[m.group(1)] = m.group(2)
    return cache


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    build, prefix, torch_root = sys.argv[1:]
    for p in (build, prefix, torch_root):
        if not os.path.isdir(p):
            fail(f"{p} is not a folder")

    cache = cmake_cache(build)
    for key in PACKAGES_DIRS + PKG_LIBS:
        value = cache.get(key, "")
        if not value or not under(value, prefix):
            fail(f"CMakeCache.txt: {key} = '{value}' is not inside the prefix {prefix}")
    for key in OPTIONAL_DIRS:
        value = cache.get(key, "")
        if value and not value.endswith("-NOTFOUND") and not under(value, prefix):
            fail(f"CMakeCache.txt: {key} = '{value}' is not inside the prefix {prefix}")
    torch_dir = cache.get("Torch_DIR", "")
    if not under(torch_dir, torch_root):
        fail(f"CMakeCache.txt: Torch_DIR = '{torch_dir}' is not inside {torch_root}")
    print(f"check_prefix_build: cmake found {len(PACKAGES_DIRS) + len(PKG_LIBS)} packages in the prefix, "
          f"torch in {torch_root}")

    deps = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True, check=True).stdout
    from_prefix = from_torch = 0
    for line in deps.splitlines():
        if line[:1] not in (" ", "\t") or not line.strip():
            continue  # "<object>: #deps N, ..." heads each object's list
        # ninja writes the paths under the build folder relative to it (e.g. a venv inside it).
        path = os.path.normpath(os.path.join(build, line.strip()))
        for inc in SYSTEM_INCLUDES:
            if path.startswith(inc):
                rel = path[len(inc):]
                if PREFIX_HEADERS.match(rel) or TORCH_HEADERS.match(rel):
                    fail(f"the compiler read {path} from the system, not from the prefix or torch")
        if under(path, prefix):
            from_prefix += 1
        elif under(path, torch_root):
            from_torch += 1
    if from_prefix == 0 or from_torch == 0:
        fail(f"ninja -t deps lists {from_prefix} header(s) from the prefix and {from_torch} from torch: "
             "was the build run (and with depfiles)?")
    print(f"check_prefix_build: header reads: {from_prefix} from the prefix, {from_torch} from torch, "
          "none of theirs from /usr/include or /usr/local/include")

    checks = [(os.path.join(build, "tools", "cemfrac"), {"libfmt.so": prefix, "libpcre2-8.so": prefix,
                                                         "libtorch.so": torch_root, "libc10.so": torch_root})]
    shims = [os.path.join(d, f) for d, _, fs in os.walk(build) for f in fs
             if f.startswith("libcemfrac_spm") and ".so" in f]
    if not shims:
        fail(f"no SentencePiece shim (libcemfrac_spm*.so) under {build}")
    checks.append((shims[0], {"libsentencepiece.so": prefix}))
    for binary, wanted in checks:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        for lib, root in wanted.items():
            lines = [l for l in out.splitlines() if l.strip().startswith(lib)]
            if not lines:
                fail(f"ldd {binary}: {lib} is not loaded")
            target = lines[0].split("=>")[-1].split("(")[0].strip()
            if not target.startswith("/") or not under(target, root):
                fail(f"ldd {binary}: {lib} resolves to '{target}', not inside {root}")
    print("check_prefix_build: the loader takes libfmt, libpcre2-8 and libsentencepiece from the prefix, "
          "libtorch and libc10 from torch")


if __name__ == "__main__":
    main()
