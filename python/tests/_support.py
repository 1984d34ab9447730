"""Shared by the Python tests: imports cemfrac, or skips with the reason when it is not importable.

ctest runs these files with CEMFRAC_PYTHON_REQUIRED=1 (the module was configured to be built), and
then an import failure is an error, never a skip. By hand, without the module:
    PYTHONPATH=build/python /usr/bin/python3 -m pytest python/tests
"""
import os
import sys

import pytest

try:
    import torch  # noqa: F401
    import cemfrac  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("CEMFRAC_PYTHON_REQUIRED") == "1":
        raise
    pytest.skip(f"cemfrac Python module not importable ({e}); build it (scripts/build.sh) and run with "
                f"PYTHONPATH=build/python under /usr/bin/python3 (this is {sys.executable})",
                allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CEMFRAC_BUILD_DIR", os.path.join(ROOT, "build"))
CEMFRAC_EXE = os.environ.get("CEMFRAC_EXE", os.path.join(BUILD, "tools", "cemfrac"))

# Unit roundoff of each dtype.
U = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24}
