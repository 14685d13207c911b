"""What every committed figure records beside it: the machine, and one JSON line per row.

Shared by the scripts under bench/perf, bench/checks, bench/studies and bench/peers (each puts
bench/ on sys.path to import it).
"""

from __future__ import annotations

import json
import os
import platform

import numpy as np


def machine() -> dict:
    """CPU model, CPU count, Python and numpy versions: recorded beside every committed figure."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "nproc": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__}


def emit(row: dict, out: str | None) -> None:
    """Print ``row`` as one JSON line, and append it to the JSONL file ``out`` if given."""
    line = json.dumps(row)
    print(line)
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")
