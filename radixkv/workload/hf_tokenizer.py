"""A local Hugging Face ``tokenizer.json`` as a trace tokenizer (the ``radixkv[tokenizers]`` extra).

ShareGPT traces are text; by default radixkv turns text into ids with its
built-in deterministic tokenizer (:mod:`radixkv.workload.tokenizer`), whose
counts only approximate a model's. With the model's own ``tokenizer.json``
the prompts get the model's real token ids and lengths, so hit rates count the
tokens a server would count. Only a local file is read: nothing is downloaded.

Special tokens (BOS...) are not added: a prompt is encoded piece by piece
(:mod:`radixkv.workload.sharegpt`), and a BOS before every piece would not be
what a server sees.
"""

from __future__ import annotations

import os
from typing import Callable, Union

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError, MissingExtraError
from ..keys import TOKEN_DTYPE

TextTokenizer = Callable[[str], np.ndarray]

_INSTALL = "pip install 'radixkv[tokenizers]'"


def load_tokenizer(path: Union[str, os.PathLike], name: str = "tokenizer") -> TextTokenizer:
    """``text -> uint32 token ids`` of the ``tokenizer.json`` at ``path``.

    ``name`` is how errors call the argument (the CLI passes ``"--tokenizer"``).
    Cost: one parse of the file (milliseconds to a second for a 128k vocabulary);
    then one ``Tokenizer.encode`` per text.

    Raises:
        MissingExtraError: the ``tokenizers`` library is not installed (names the extra).
        ArgumentValueError: no such file, or a file ``tokenizers`` cannot read.
        ArgumentTypeError: ``path`` is not a path.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"{name} must be a path to a tokenizer.json, got {path!r}")
    path = os.fspath(path)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingExtraError(f"{name} needs the tokenizers library: {_INSTALL}") from None
    if not os.path.isfile(path):
        raise ArgumentValueError(f"{name}: no such file: {path}")
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises a bare Exception for any unreadable file
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise ArgumentValueError(f"{name}: {path} is not a tokenizer.json the tokenizers library reads: "
                                 f"{reason}") from None

    def encode(text: str) -> np.ndarray:
        return np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=TOKEN_DTYPE)

    return encode
