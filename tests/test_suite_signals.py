"""The suite's own set-up: commands the tests start can be interrupted, wherever it runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

PROBE = '''
import signal, subprocess, sys

def test_a_child_can_be_interrupted():
    out = subprocess.run([sys.executable, "-c", "import signal; "
                          "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "True", out
'''


def test_a_suite_started_with_sigint_ignored_starts_commands_that_take_it(tmp_path):
    """`nohup pytest &` and some CI runners start the suite with SIGINT ignored; the Ctrl-C tests'
    commands would inherit that and never stop. conftest.py gives them the default back."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                        str(tmp_path / "test_probe.py")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(HERE)},
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
