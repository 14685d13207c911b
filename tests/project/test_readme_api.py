"""The README's Python API example runs as written and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re

from .test_readme import README


def test_python_api_example_runs_and_prints_its_comments():
    text = README.read_text()
    section = text[text.index("## Python API"):]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], str(README), "exec"), {})
    promised = [word for comment in re.findall(r"^print\(.*#\s*(.+)$", blocks[0], re.M) for word in comment.split()]
    assert out.getvalue().split() == promised
