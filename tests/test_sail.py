"""The embedded engine's checks (tests/sail_checks.py), in a pytest process of their own: PySpark
cannot hold a Sail (Spark Connect) session beside the classic one this worker may already hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKS = Path(__file__).with_name("sail_checks.py")


def test_the_sail_checks_pass_in_a_process_of_their_own():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(CHECKS)],
        cwd=CHECKS.parent.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1] and "failed" not in run.stdout.splitlines()[-1], run.stdout[-2000:]
