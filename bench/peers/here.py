"""Run a bench/peers script against the radixkv of the current directory, from any venv.

    bench/peers/.venv/bin/python bench/peers/here.py bench/peers/compare.py [compare.py's options]

The peers' venv installs radixkv editable from the checkout that built it; its
import finder maps ``radixkv.policies`` to that checkout's ``policies/``. Run
from another checkout (a branch under test), this points both ``radixkv`` and
``radixkv.policies`` at the current directory, prints which files are used,
and runs the script as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import sys

HERE = os.getcwd()
sys.path.insert(0, HERE)
for name, module in list(sys.modules.items()):
    if name.startswith("__editable__") and hasattr(module, "MAPPING"):
        module.MAPPING.update({"radixkv": os.path.join(HERE, "radixkv"),
                               "radixkv.policies": os.path.join(HERE, "policies")})

import radixkv  # noqa: E402
import radixkv.policies  # noqa: E402

print(f"radixkv from {radixkv.__file__}, radixkv.policies from {radixkv.policies.__file__}", file=sys.stderr)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
