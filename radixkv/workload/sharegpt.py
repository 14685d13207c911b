"""Replayable requests from ShareGPT-style chat logs.

Two layouts are read:

* a JSON list of conversations (the ShareGPT release format)::

      [{"id": "a1", "conversations": [{"from": "human", "value": "Hi"},
                                      {"from": "gpt", "value": "Hello!"}]}, ...]

* JSONL, one conversation object a line.

A conversation holds its turns under ``"conversations"`` (``{"from", "value"}``
turns) or ``"messages"`` (``{"role", "content"}`` turns). Roles ``human`` /
``user`` are user turns; ``gpt`` / ``assistant`` / ``chatgpt`` / ``bard`` /
``bing`` / ``model`` are assistant turns; ``system`` and ``tool`` /
``function`` / ``observation`` are kept as context (roles are matched
case-insensitively). Other keys (``"id"``...)
are ignored.

**Prompts.** Every user turn becomes one :class:`~radixkv.workload.traces.Request`
whose prompt is the whole conversation so far rendered with a ChatML-style
template: each turn is ``ROLE_MARKERS[role] + content + END_MARKER`` and the
prompt ends with ``ROLE_MARKERS["assistant"]`` (the generation prompt). Each
of those strings is tokenized on its own and the pieces are concatenated, so
the prompt of user turn *k* is exactly the prompt of turn *k-1*, plus the
reply, plus the new user message: the prefix sharing a chat server sees.
``output_length`` is the token count of the assistant reply that follows the
turn (0 when none does).

**Order and time.** Replaying conversation after conversation would make
every follow-up a hit on the previous request, which no server sees. Instead
up to ``num_sessions`` conversations are open at once and served round-robin,
one turn each; a finished conversation's slot goes to the next one in the
file. Request *i* gets timestamp ``i / request_rate`` seconds. The order is a
pure function of the file and the two parameters.

JSONL streams (memory grows with ``num_sessions``, not the file). A JSON list
cannot stream without a dependency: the text is read whole, then decoded one
conversation at a time.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from numbers import Real
from typing import Callable, Iterable, Iterator, Optional, Union

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, TraceFormatError
from ..keys import TOKEN_DTYPE, check_int
from .limits import MAX_ITEMS, check_at_most
from .tokenizer import tokenize
from .tracefiles import open_binary, read_all
from .traces import Request, brief, json_lines

ROLE_MARKERS = {
    "system": "<|im_start|>system\n",
    "user": "<|im_start|>user\n",
    "assistant": "<|im_start|>assistant\n",
    "tool": "<|im_start|>tool\n",
}
"""Text put before each turn's content, by normalised role."""

END_MARKER = "<|im_end|>\n"
"""Text put after each turn's content."""

_ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}

# (turns key, role key, content key) of the two accepted layouts.
_LAYOUTS = (("conversations", "from", "value"), ("messages", "role", "content"))

_MAX_TOKEN_ID = 2**32 - 1

Tokenize = Callable[[str], Iterable[int]]
_Turn = tuple[str, np.ndarray]  # (normalised role, content token ids)


def load_sharegpt(
    path: Union[str, os.PathLike],
    tokenizer: Optional[Tokenize] = None,
    *,
    num_sessions: int = 16,
    request_rate: float = 1.0,
    on_skip: Optional[Callable[[TraceFormatError], None]] = None,
) -> Iterator[Request]:
    """Requests of a ShareGPT-style JSON or JSONL file, conversations interleaved.

    Args:
        path: a ``.json`` file holding a JSON list, or a JSONL file (the layout
            is told by the first non-blank character, ``[`` or ``{``).
        tokenizer: ``text -> token ids`` (any iterable of ints in
            ``[0, 2**32)``, e.g. a Hugging Face ``tokenizer.encode``); default
            the built-in :func:`radixkv.workload.tokenizer.tokenize`.
        num_sessions: conversations open at once, served round-robin (at most
            :data:`~radixkv.workload.limits.MAX_ITEMS`).
        request_rate: requests per second of the synthetic timestamps.
        on_skip: when given, a malformed conversation (or JSONL line) is passed
            to it and left out instead of raised. A JSON list whose syntax
            breaks cannot be resynchronised: that error is raised all the same.

    Returns:
        A lazy iterator. Parameters and the file's existence are checked
        now; the file is read (and format errors raised) as it is consumed.

    Raises:
        TraceFormatError: malformed JSON or a conversation missing a field;
            names the file, the line, the conversation index and the field.
        ValueError / TypeError: a bad parameter, or a tokenizer returning
            something other than non-negative ids below ``2**32``.

    Cost: O(total tokens of all prompts), which is quadratic in the turns of
    one conversation since each prompt repeats the history.
    """
    num_sessions = check_at_most(check_int(num_sessions, "num_sessions", minimum=1), "num_sessions", MAX_ITEMS)
    if isinstance(request_rate, bool) or not isinstance(request_rate, Real):
        raise ArgumentTypeError(f"request_rate must be a number, got {request_rate!r}")
    if not (request_rate > 0 and math.isfinite(request_rate)):
        raise ArgumentValueError(f"request_rate must be finite and > 0, got {request_rate!r}")
    if tokenizer is not None and not callable(tokenizer):
        raise ArgumentTypeError(f"tokenizer must be callable, got {tokenizer!r}")
    if on_skip is not None and not callable(on_skip):
        raise ArgumentTypeError(f"on_skip must be callable, got {on_skip!r}")
    name = os.fspath(path)
    os.stat(name)  # a missing file fails now, not at the first next()
    return _interleave(
        _conversations(name, tokenizer or tokenize, on_skip), int(num_sessions), float(request_rate)
    )


def _interleave(
    conversations: Iterator[Iterator[tuple[np.ndarray, int]]], num_sessions: int, request_rate: float
) -> Iterator[Request]:
    active: deque[Iterator[tuple[np.ndarray, int]]] = deque()
    index = 0
    for conversation in conversations:
        active.append(conversation)
        while len(active) == num_sessions:
            index = yield from _serve_one(active, index, request_rate)
    while active:
        index = yield from _serve_one(active, index, request_rate)


def _serve_one(active: deque, index: int, request_rate: float) -> Iterator[Request]:
    """Serve the head conversation's next turn and requeue it (or drop it when done)."""
    conversation = active.popleft()
    turn = next(conversation, None)
    if turn is not None:
        tokens, output_length = turn
        yield Request(tokens, index / request_rate, output_length)
        active.append(conversation)
        index += 1
    return index


def _conversations(path: str, tokenizer: Tokenize,
                   on_skip: Optional[Callable[[TraceFormatError], None]]) -> Iterator[Iterator[tuple[np.ndarray, int]]]:
    """Each conversation of the file as an iterator of (prompt, output_length), in file order."""
    if _first_char(path) == "[":
        objects = _json_list_objects(_read_text(path), path)
    else:
        objects = _jsonl_objects(path, on_skip)
    for obj, line, index in objects:
        try:
            turns = _parse_conversation(obj, path, line, index, tokenizer)
        except TraceFormatError as exc:
            if on_skip is None:
                raise
            on_skip(exc)
            continue
        yield _prompts(turns, tokenizer)


def _first_char(path: str) -> str:
    """The first character that is not whitespace (nor a byte order mark), or ``""``."""
    with open_binary(path) as handle:
        while True:
            chunk = handle.read(4096)
            if not chunk:
                return ""
            stripped = chunk.lstrip(b" \t\r\n\xef\xbb\xbf")
            if stripped:
                return chr(stripped[0])


def _read_text(path: str) -> str:
    """The whole file as text (a BOM dropped); invalid UTF-8 is a :class:`TraceFormatError` naming its line."""
    data = read_all(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, data.count(b"\n", 0, exc.start) + 1, "invalid UTF-8") from None


def _jsonl_objects(path: str,
                   on_skip: Optional[Callable[[TraceFormatError], None]]) -> Iterator[tuple[object, int, int]]:
    index = 0
    try:
        for line_number, obj in json_lines(path, skip_bad=on_skip is not None, on_skip=on_skip):
            yield obj, line_number, index
            index += 1
    except TraceFormatError as exc:
        raise TraceFormatError(path, exc.line, f"conversation {index}: {exc.message}") from None


def _json_list_objects(text: str, path: str) -> Iterator[tuple[object, int, int]]:
    """Decode the elements of a JSON list one by one, tracking each one's line."""
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, 0) + 1  # past "["
    line, counted = 1, 0
    index = 0
    pos = _skip_ws(text, pos)
    if pos < len(text) and text[pos] == "]":
        _check_trailing(text, pos + 1, path)
        return
    while True:
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(path, exc.lineno, f"conversation {index}: invalid JSON: {exc.msg}") from None
        except (ValueError, RecursionError) as exc:  # a 5000-digit number, 100000 nested lists
            reason = str(exc)[:80] or type(exc).__name__
            raise TraceFormatError(path, line, f"conversation {index}: invalid JSON: {reason}") from None
        yield obj, line, index
        index += 1
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
            continue
        if pos < len(text) and text[pos] == "]":
            _check_trailing(text, pos + 1, path)
            return
        line += text.count("\n", counted, pos)
        raise TraceFormatError(path, line, f"expected ',' or ']' after conversation {index - 1}")


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _check_trailing(text: str, pos: int, path: str) -> None:
    pos = _skip_ws(text, pos)
    if pos < len(text):
        raise TraceFormatError(path, text.count("\n", 0, pos) + 1, "unexpected data after the closing ']'")


def _parse_conversation(obj: object, path: str, line: int, index: int, tokenizer: Tokenize) -> list[_Turn]:
    where = f"conversation {index}"
    if not isinstance(obj, dict):
        raise TraceFormatError(path, line, f"{where}: expected a JSON object, got {brief(obj)}")
    for turns_key, role_key, content_key in _LAYOUTS:
        if turns_key in obj:
            break
    else:
        raise TraceFormatError(path, line, f"{where}: missing field 'conversations' (or 'messages')")
    raw_turns = obj[turns_key]
    if not isinstance(raw_turns, list):
        raise TraceFormatError(path, line, f"{where}: field {turns_key!r} must be a list, got {brief(raw_turns)}")
    turns = []
    for i, turn in enumerate(raw_turns):
        field = f"{turns_key}[{i}]"
        if not isinstance(turn, dict):
            raise TraceFormatError(path, line, f"{where}: field {field!r} must be an object, got {brief(turn)}")
        if role_key not in turn:
            raise TraceFormatError(path, line, f"{where}: missing field '{field}.{role_key}'")
        if content_key not in turn:
            raise TraceFormatError(path, line, f"{where}: missing field '{field}.{content_key}'")
        role = _ROLE_ALIASES.get(turn[role_key].lower()) if isinstance(turn[role_key], str) else None
        if role is None:
            raise TraceFormatError(
                path, line,
                f"{where}: field '{field}.{role_key}' must be one of {sorted(_ROLE_ALIASES)}, "
                f"got {brief(turn[role_key])}",
            )
        content = turn[content_key]
        if not isinstance(content, str):
            raise TraceFormatError(
                path, line, f"{where}: field '{field}.{content_key}' must be a string, got {brief(content)}"
            )
        try:
            turns.append((role, _encode(tokenizer, content)))
        except UnicodeEncodeError as exc:  # JSON can spell a lone surrogate ("\\ud800"); UTF-8 cannot
            raise TraceFormatError(
                path, line, f"{where}: field '{field}.{content_key}' holds a lone surrogate at character {exc.start}"
            ) from None
    return turns


def _prompts(turns: list[_Turn], tokenizer: Tokenize) -> Iterator[tuple[np.ndarray, int]]:
    """(prompt, output_length) for each user turn; prompts extend one another."""
    markers = {role: _encode(tokenizer, text) for role, text in ROLE_MARKERS.items()}
    end = _encode(tokenizer, END_MARKER)
    history: list[np.ndarray] = []
    for i, (role, content) in enumerate(turns):
        history += (markers[role], content, end)
        if role != "user":
            continue
        prompt = np.concatenate(history + [markers["assistant"]])
        prompt.flags.writeable = False
        reply = turns[i + 1] if i + 1 < len(turns) else None
        yield prompt, (len(reply[1]) if reply is not None and reply[0] == "assistant" else 0)


def _encode(tokenizer: Tokenize, text: str) -> np.ndarray:
    ids = tokenizer(text)
    try:
        array = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids))
    except TypeError:
        raise ArgumentTypeError(f"tokenizer must return an iterable of ints, got {brief(ids)}") from None
    if array.size == 0:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise ArgumentTypeError(f"tokenizer must return a 1-D sequence of ints, got {brief(ids)}")
    if array.min() < 0 or array.max() > _MAX_TOKEN_ID:
        raise ArgumentValueError(f"tokenizer returned ids outside [0, 2**32), got {brief(ids)}")
    return array.astype(TOKEN_DTYPE, copy=False)
