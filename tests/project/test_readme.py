"""The README's embedding examples run as written and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def embedding_blocks():
    text = README.read_text()
    section = text[text.index("## Embedding"):]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_embedding_examples_run_and_print_their_comments():
    blocks = embedding_blocks()
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(README), "exec"), namespace)
        printed = out.getvalue().split()
        promised = re.findall(r"^print\(.*#\s*(\d+)", block, re.M)
        assert printed == promised, (printed, promised)
    namespace["cache"].check()
