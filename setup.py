"""setuptools entry for `pip install --no-build-isolation .` (pyproject.toml, docs/python.md).

The extension cemfrac._C is built by the project's own CMake (target cemfrac_python), configured for
the interpreter that runs this file and the LibTorch under its `torch`: torch.utils.cmake_prefix_path
when that torch ships its CMake files (a pip wheel does), else CMake's own search (Debian's
python3-torch runs the LibTorch of libtorch-dev). Build directory: $CEMFRAC_PIP_BUILD_DIR, else
build-pip-torch<version> in the source tree (one per torch, so switching torch never mixes builds).
The CUDA kernels are built when torch is a CUDA build and nvcc is found (CEMFRAC_CUDA=ON/OFF decides
otherwise).
$CEMFRAC_PIP_BUILD_DIR may name a build directory configured otherwise (scripts/build.sh's build/):
its configuration is kept and only the module is brought up to date, after checking that its
interpreter imports the same torch as this one.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SRC = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    sys.stderr.write(f"cemfrac setup: error: {msg}\n")
    sys.exit(1)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            import torch
            import torch.utils
        except ImportError as e:
            fail(f"{sys.executable} cannot import torch ({e}); install torch first, then build with "
                 "pip install --no-build-isolation .")
        if not getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True):
            fail(f"torch {torch.__version__} is built with the pre-C++11 libstdc++ ABI, which the system "
                 "libraries cemfrac links (fmt, sentencepiece, ...) do not use: unsupported (docs/python.md)")
        for tool in ("cmake", "ninja"):
            if shutil.which(tool) is None:
                fail(f"{tool} not found on PATH (Debian: apt-get install cmake ninja-build)")
        build = os.environ.get("CEMFRAC_PIP_BUILD_DIR") or os.path.join(
            SRC, "build-pip-torch" + torch.__version__.split("+")[0])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        if os.path.exists(os.path.join(build, "CMakeCache.txt")) and not os.path.exists(
                os.path.join(build, ".cemfrac-pip")):
            self.check_foreign_build(build, torch)  # e.g. scripts/build.sh's build/: reuse it as it is
        else:
            self.configure(build, torch)
        subprocess.run(["cmake", "--build", build, "--target", "cemfrac_python", "--", f"-j{jobs}"],
                       check=True)
        pkg = os.path.join(build, "python", "cemfrac")
        built = [f for f in os.listdir(pkg) if f.startswith("_C.") and f.endswith(".so")]
        if len(built) != 1:
            fail(f"expected one _C*.so in {pkg}, found {built}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(pkg, built[0]), dest)

    @staticmethod
    def configure(build, torch):
        args = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DCEMFRAC_PYTHON=ON",
                f"-DCEMFRAC_PYTHON_EXECUTABLE={sys.executable}",
                "-DCEMFRAC_BUILD_TESTS=OFF", "-DCEMFRAC_BUILD_BENCH=OFF"]
        prefixes = []
        prefix = getattr(torch.utils, "cmake_prefix_path", "")
        if prefix and os.path.isdir(os.path.join(prefix, "Torch")):
            prefixes.append(prefix)
        try:  # pybind11 from pip: its CMake files are inside the package, not where CMake looks
            import pybind11
            prefixes.append(pybind11.get_cmake_dir())
        except ImportError:
            pass  # Debian's pybind11-dev, found by CMake's own search
        if prefixes:
            args.append("-DCMAKE_PREFIX_PATH=" + ";".join(prefixes))
        cuda, nvcc = CMakeBuild.cuda_setting(torch)
        args.append(f"-DCEMFRAC_CUDA={cuda}")
        if cuda == "ON" and os.path.exists(nvcc):
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        print(f"cemfrac setup: torch {torch.__version__}, CUDA kernels {cuda}", flush=True)
        subprocess.run(["cmake", "-S", SRC, "-B", build, *args], check=True)
        open(os.path.join(build, ".cemfrac-pip"), "w").close()

    @staticmethod
    def cuda_setting(torch):
        """CEMFRAC_CUDA=ON/OFF from the environment, else ON exactly when torch is a CUDA build and nvcc
        is found (CUDACXX, PATH, /usr/local/cuda): a GPU user's pip install gets the CUDA kernels."""
        nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        want = os.environ.get("CEMFRAC_CUDA", "").upper()
        if want in ("ON", "1", "OFF", "0"):
            return ("ON" if want in ("ON", "1") else "OFF"), nvcc
        if want:
            fail(f"CEMFRAC_CUDA={os.environ['CEMFRAC_CUDA']}: expected ON or OFF")
        on = getattr(torch.version, "cuda", None) and os.path.exists(nvcc)
        return ("ON" if on else "OFF"), nvcc

    @staticmethod
    def check_foreign_build(build, torch):
        """A build directory configured by someone else keeps its configuration; its Python module is
        usable only when its interpreter imports this interpreter's torch (the same files)."""
        cache = {}
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                key, sep, value = line.partition("=")
                if sep and not line.startswith(("#", "//")):
                    cache[key.split(":")[0]] = value.strip()
        exe, version = cache.get("CEMFRAC_PYTHON_EXECUTABLE"), cache.get("CEMFRAC_PYTHON_TORCH_VERSION")
        if exe is None or version is None:
            fail(f"{build} is not a cemfrac build directory with the Python module (its CMake cache "
                 "has no CEMFRAC_PYTHON_EXECUTABLE / CEMFRAC_PYTHON_TORCH_VERSION)")
        if version != torch.__version__:
            fail(f"{build} was configured for torch {version}, this interpreter imports torch "
                 f"{torch.__version__}: use another CEMFRAC_PIP_BUILD_DIR")
        probe = "import os, torch; print(torch.__version__, os.path.realpath(torch.__file__))"
        theirs = subprocess.run([exe, "-c", probe], capture_output=True, text=True).stdout.strip()
        ours = f"{torch.__version__} {os.path.realpath(torch.__file__)}"
        if theirs != ours:
            fail(f"{build} builds for {exe} (torch: {theirs or 'not importable'}), this interpreter "
                 f"imports torch {ours}: use another CEMFRAC_PIP_BUILD_DIR")


# setuptools' own scratch files, out of the CMake build directories (egg_base must exist).
SCRATCH = os.path.join("build-setuptools", "py%d.%d" % sys.version_info[:2])
os.makedirs(os.path.join(SRC, SCRATCH), exist_ok=True)
setup(
    package_dir={"": "python"},
    packages=["cemfrac"],
    ext_modules=[CMakeExtension("cemfrac._C")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": SCRATCH}, "egg_info": {"egg_base": SCRATCH}},
    zip_safe=False,
)
