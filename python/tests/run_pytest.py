"""Runs pytest for ctest (python/CMakeLists.txt, pip_install.sh, scripts/pip-leg.sh) and makes a skip
visible: pytest exits 0 when tests were skipped, so ctest would count a file whose tests all skipped as
passed. Here a run in which nothing failed but at least one test was skipped (or xfailed) exits 77,
the tests' SKIP_RETURN_CODE: ctest lists the file under "not run" with the reasons in its output.
    python run_pytest.py [pytest args...]
"""
import sys

import pytest

SKIP_RETURN_CODE = 77


class _Count:
    def __init__(self):
        self.skipped = []

    def pytest_runtest_logreport(self, report):
        if report.skipped:  # a skip, or an xfail (report.wasxfail): either way the test did not pass
            self.skipped.append(report.nodeid)

    def pytest_collectreport(self, report):
        if report.skipped:  # a whole file skipped while it was collected (pytest.skip at module level)
            self.skipped.append(report.nodeid)


def main():
    count = _Count()
    rc = int(pytest.main(sys.argv[1:], plugins=[count]))
    # A file skipped at collection leaves nothing to run: pytest says 5 (no tests collected).
    if rc in (0, int(pytest.ExitCode.NO_TESTS_COLLECTED)) and count.skipped:
        print(f"run_pytest: {len(count.skipped)} skipped (exit {SKIP_RETURN_CODE}, reported as skipped): "
              + ", ".join(count.skipped))
        return SKIP_RETURN_CODE
    return rc


if __name__ == "__main__":
    sys.exit(main())
