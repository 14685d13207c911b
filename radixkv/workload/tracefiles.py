"""Trace bytes from a plain, gzip or zstd file, or from standard input (``-``).

Compression is told by the file's first bytes (gzip ``1f 8b``, zstd
``28 b5 2f fd``), so a misnamed file still reads; a file named ``.gz`` or
``.zst`` whose bytes are not that format is an error naming it. zstd needs the
optional ``zstandard`` package (``pip install 'radixkv[zstd]'``). Standard input
is copied once to a temporary file (removed at exit), so a trace from a pipe
can be read twice (format detection, Belady's look-ahead, a progress total)
and by sweep workers. Every error is a :class:`~radixkv.errors.TraceFormatError`
(``file:line: ...``) or an ``OSError`` naming the file.

Files radixkv writes (generated traces, per-request records, sweep results) go through
:func:`replacing`: a run that fails leaves the file it would have replaced as it was.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import os
import shutil
import stat
import sys
import tempfile
import uuid
from typing import IO, BinaryIO, Iterator, Union

from ..errors import TraceFormatError

STDIN = "-"
_GZIP, _ZSTD = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_stdin_copies: dict = {}  # standard input stream -> its temporary copy, made on first use


def resolve(path: str) -> str:
    """``path``, or for ``-`` the temporary file holding standard input (copied on first call)."""
    path = os.fspath(path)
    if path != STDIN:
        return path
    stream = sys.stdin
    if stream not in _stdin_copies:
        source = getattr(stream, "buffer", stream)
        head = source.read(4)
        suffix = ".gz" if head.startswith(_GZIP) else ".zst" if head.startswith(_ZSTD) else ".jsonl"
        fd, name = tempfile.mkstemp(prefix="radixkv-stdin-", suffix=suffix)
        with os.fdopen(fd, "wb") as copy:
            copy.write(head)
            shutil.copyfileobj(source, copy, 1 << 20)
        atexit.register(_remove, name)
        _stdin_copies[stream] = name
    return _stdin_copies[stream]


def _remove(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


def compression(path: str) -> str:
    """``"gzip"``, ``"zstd"`` or ``""`` from the first bytes of ``path`` (an OSError if unreadable)."""
    with open(path, "rb") as f:
        head = f.read(4)
    kind = "gzip" if head.startswith(_GZIP) else "zstd" if head.startswith(_ZSTD) else ""
    named = "gzip" if path.endswith(".gz") else "zstd" if path.endswith(".zst") else ""
    if named and kind != named:
        raise TraceFormatError(path, 0, f"named like a {named} file but its bytes are not {named} data")
    return kind


def open_binary(path: str) -> BinaryIO:
    """``path`` opened for reading its (decompressed) bytes."""
    kind = compression(path)
    if kind == "gzip":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "zstd":
        try:
            import zstandard
        except ImportError:
            raise TraceFormatError(path, 0, "is zstd-compressed; reading it needs the zstandard package "
                                   "(pip install 'radixkv[zstd]'), or decompress it first") from None
        return zstandard.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def read_lines(path: str) -> Iterator[bytes]:
    """The (decompressed) lines of ``path``; a corrupt or truncated stream is a TraceFormatError at its line."""
    lineno = 0
    with open_binary(path) as f:
        lines = iter(f)
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                return
            except (OSError, EOFError, ValueError) as exc:  # gzip.BadGzipFile, truncation, zstd errors
                raise TraceFormatError(path, lineno + 1, f"cannot decompress: {exc}") from None
            lineno += 1
            yield raw


def read_all(path: str) -> bytes:
    """All (decompressed) bytes of ``path``."""
    return b"".join(read_lines(path))


@contextlib.contextmanager
def replacing(path: Union[str, os.PathLike]) -> Iterator[IO[str]]:
    """A text file (UTF-8, ``\\n`` line ends) whose contents replace ``path`` when the block ends
    normally, and never otherwise.

    It is a new file beside ``path`` (same directory, so :func:`os.replace` swaps it in at once),
    with ``path``'s permissions when ``path`` exists; on any exception, an interrupt included, it
    is removed and ``path`` is left as it was. A ``path`` that exists and is no regular file
    (``/dev/null``, a FIFO) is written in place; a symlink's target is what gets replaced.
    Cost: one create and one rename more than ``open(path, "w")``; nothing is held in memory.
    """
    target = os.path.realpath(os.fspath(path))
    if os.path.exists(target) and not os.path.isfile(target):
        with open(target, "w", encoding="utf-8", newline="\n") as sink:
            yield sink
        return
    directory, name = os.path.split(target)
    temp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as sink:
            if os.path.exists(target):
                os.chmod(temp, stat.S_IMODE(os.stat(target).st_mode))
            yield sink
        os.replace(temp, target)
    except BaseException:
        _remove(temp)
        raise
