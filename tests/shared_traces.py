"""The Mooncake traces the suite replays: ``shared/traces/`` beside the repository checkout.

Resolved from this file, so the suite runs from any working directory.
"""

from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
CONVERSATION = TRACES / "mooncake_conversation.jsonl"
SYNTHETIC = TRACES / "mooncake_synthetic.jsonl"


def conversation_head(directory: Path, requests: int) -> str:
    """The first ``requests`` lines of the conversation trace, written to ``directory`` (a small real
    trace for a test); its path."""
    path = Path(directory) / f"conv{requests}.jsonl"
    with open(CONVERSATION) as src:
        path.write_text("".join(next(src) for _ in range(requests)))
    return str(path)
