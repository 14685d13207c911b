"""The Mooncake traces the suite replays: ``shared/traces/`` beside the repository checkout.

Resolved from this file, so the suite runs from any working directory.
"""

from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
CONVERSATION = TRACES / "mooncake_conversation.jsonl"
SYNTHETIC = TRACES / "mooncake_synthetic.jsonl"
