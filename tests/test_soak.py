"""The server's soak (benchmarks/soak.py) in its short form: mixed traffic with faults on the
embedded model, a SIGTERM at a random moment, then 12 SIGTERMs of a tiny model's server while
streams run and end at different steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


def test_the_server_holds_under_mixed_faulty_traffic_and_always_stops():
    r = subprocess.run([sys.executable, str(SCRIPT), "--seconds", "6", "--clients", "6", "--seed", "1",
                        "--shutdowns", "12", "--json"], capture_output=True, text=True, timeout=600)
    assert r.stdout, r.stderr
    report = json.loads(r.stdout)
    soak, stops = report["soak"], report["shutdowns"]
    assert soak["failures"] == [] and stops["failures"] == [], json.dumps(report, indent=1)
    assert r.returncode == 0, r.stderr
    kinds = {name.rsplit(" ", 1)[0] for name in soak["by_kind"]}
    # every kind of request was sent (a seed that left one out would test less)
    assert kinds >= {"chat", "stream", "n", "grammar", "schema", "cancel", "disconnect", "hostile",
                     "completion", "second model", "burst"}, kinds
    assert soak["stop"]["exit_code"] == 0 and soak["stop"]["line"].startswith("infer: stopped (SIGTERM)")
    assert stops["rounds"] == 12 and stops["exit_s_max"] <= 6
    # resident memory after 6 s of this traffic (with the second model loaded now and then):
    # about +130 MiB, growing more slowly the longer it runs (benchmarks/README.md, "Soak")
    assert soak["rss_mib"]["growth"] < 400, soak["rss_mib"]
