"""Exception hierarchy.

Every error radixkv raises on bad input is a :class:`RadixKVError` and
subclasses a built-in (``ValueError``, ``TypeError``, ``KeyError``), so callers
can catch either. A wrong type is an :class:`ArgumentTypeError` (never also a
``ValueError``), a wrong value an :class:`ArgumentValueError` or one of the more
specific ``ValueError`` classes below. An error raised at the API boundary
leaves the cache exactly as it was before the call.
"""

from __future__ import annotations


class RadixKVError(Exception):
    """Base class of every exception radixkv raises on purpose."""


class ArgumentTypeError(RadixKVError, TypeError):
    """An argument has the wrong type: a dict where tokens go, a float where an int goes."""


class ArgumentValueError(RadixKVError, ValueError):
    """An argument has the right type but a wrong value: a negative priority, a zero page size."""


class InvalidTokensError(ArgumentValueError):
    """A token sequence is not a 1-D run of non-negative integers in range."""


class InvalidBlocksError(ArgumentValueError):
    """Block ids are out of range, duplicated, or not owned by the caller."""


class LockError(RadixKVError, ValueError):
    """Unlock of a node that is not locked, or lock of something unlockable."""


class StaleHandleError(RadixKVError, ValueError):
    """A node handle outlived its node: the node was evicted, truncated or extended."""


class UnknownPolicyError(RadixKVError, KeyError):
    """No eviction policy is registered under the requested name."""

    def __str__(self) -> str:  # KeyError repr-quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class TraceFormatError(RadixKVError, ValueError):
    """A trace file is malformed; the message names the file, line and field."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        super().__init__(f"{path}:{line}: {message}")


class MissingExtraError(RadixKVError, ImportError):
    """An optional feature needs a library that is not installed; the message names the extra to install."""
