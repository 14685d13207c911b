"""Deterministic cost of a command: instructions and estimated cycles under valgrind's cachegrind.

On a shared, noisy machine a ratio of wall times swings with the load; the
instruction count of a run does not. :func:`count` runs a command once under
``valgrind --tool=cachegrind --cache-sim=yes`` and returns its instructions
(``Ir``), an estimate of its cycles (``Ir + 10 x L1 misses + 100 x last-level
misses``, the usual rule of thumb) and the instructions per C function (numpy's
loops, the interpreter's eval loop, dict lookups). Subtract a run that does
everything but the measured work to count that work alone.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Dict, Sequence


def count(command: Sequence[str], *, functions: bool = True) -> Dict:
    """Run ``command`` once under cachegrind; return ``{"Ir", "est_cycles", "functions"}``.

    Slow: valgrind runs Python about 50x slower. Raises ``CalledProcessError`` if the command fails.
    """
    out = f"/tmp/cachegrind-{os.getpid()}.out"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--cachegrind-out-file={out}", *command],
                   check=True, env=env, capture_output=True)
    try:
        with open(out) as fh:
            lines = fh.read().splitlines()
        names = next(line for line in lines if line.startswith("events:")).split()[1:]
        values = next(line for line in lines if line.startswith("summary:")).split()[1:]
        c = dict(zip(names, map(int, values)))
        by_function: Dict[str, int] = {}  # C function -> instructions
        if functions:
            annotated = subprocess.run(["cg_annotate", "--show=Ir", "--threshold=0.05", out], check=True,
                                       capture_output=True, text=True).stdout
            for line in annotated.splitlines():
                match = re.match(r"^\s*(-?[\d,]+) \(\s*-?[\d.]+%\)\s+(\S.*)$", line)
                if match and "PROGRAM TOTALS" not in match.group(2):
                    name = match.group(2).rsplit(":", 1)[-1]
                    by_function[name] = by_function.get(name, 0) + int(match.group(1).replace(",", ""))
    finally:
        os.unlink(out)
    return {"Ir": c["Ir"], "est_cycles": c["Ir"] + 10 * (c["I1mr"] + c["D1mr"] + c["D1mw"])
            + 100 * (c["ILmr"] + c["DLmr"] + c["DLmw"]), "functions": by_function}


def minus(run: Dict, base: Dict) -> Dict:
    """``run``'s counts less ``base``'s (a run without the measured work)."""
    return {"Ir": run["Ir"] - base["Ir"], "est_cycles": run["est_cycles"] - base["est_cycles"],
            "functions": {f: v - base["functions"].get(f, 0) for f, v in run["functions"].items()}}
