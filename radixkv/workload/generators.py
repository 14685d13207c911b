"""Seeded synthetic workloads, one generator per prefix-sharing pattern.

Every generator is a function ``(seed, num_requests, **params) -> Iterator[Request]``
registered in :data:`GENERATORS`. The output is a pure function of the
arguments: token ids and times are drawn from ``np.random.default_rng(seed)``
(and, for corpus documents, from ``default_rng([seed, stream, doc])`` so a
document's tokens do not depend on which requests asked for it first).
Timestamps are seconds, start near 0 and never decrease. Parameters are
checked when the function is called (``ValueError`` / ``TypeError`` naming
the parameter), tokens are produced lazily as the iterator is consumed.

=============  =================================================================
kind           what is shared
=============  =================================================================
system_prompt  a few system prompts with few-shot examples, Zipf-popular
multi_turn     each chat turn's prompt extends the session's previous prompt
rag            a system prompt, then k retrieved documents: shared only while
               the retrieval order matches
agent          agent loops whose context grows by an action + tool output a step
long_doc_qa    a few long documents, many questions each
scan           nothing: one-off prompts that only pollute a cache
mix            a seeded mixture of the above, overlapping in time
multitenant    tenants sharing public prefixes and sending private ones, and one
               attacker probing a dictionary of guesses (``radixkv attack``)
=============  =================================================================

Conventions shared by all generators:

* a ``*_tokens`` parameter is a **mean** length: each draw is uniform on
  ``[ceil(m/2), m + floor(m/2)]`` (0 when ``m`` is 0);
* ``output_tokens`` (or ``answer_tokens`` / ``action_tokens``) is the mean of
  :attr:`Request.output_length`;
* ``zipf_alpha`` weights item ``i`` (0-based) by ``1 / (i+1)**alpha``; 0 is uniform;
* ``request_rate`` is requests per second of a Poisson arrival process;
* ``vocab_size`` bounds the ids, which fall in ``[0, vocab_size)``;
* counts and sizes are bounded (:mod:`radixkv.workload.limits`): a count of prompts, documents,
  sessions... at most ``MAX_ITEMS`` (tenants ``MAX_TENANTS``), a ``*_tokens`` mean and a whole
  prompt's mean length at most ``MAX_PROMPT_TOKENS``, the tokens a generator keeps (shared
  prompts, documents, open sessions) at most ``MAX_RESIDENT_TOKENS``. A value past one raises
  at the call, naming the parameters, before anything is made.

With default parameters 1000 requests of any kind total at most about
two million tokens and generate in well under a second.
"""

from __future__ import annotations

import dataclasses
import heapq
import inspect
import itertools
import json
import math
import os
from numbers import Real
from typing import IO, Callable, Iterable, Iterator, Mapping, Optional, Union

import numpy as np

from ..errors import ArgumentTypeError, ArgumentValueError
from ..keys import TOKEN_DTYPE, check_int
from .limits import (ARRAY_TOKENS, MAX_ITEMS, MAX_PAGE_SIZE, MAX_PROMPT_TOKENS, MAX_REQUESTS, MAX_RESIDENT_TOKENS,
                     MAX_TENANTS, check_at_most, spell)
from .tokenizer import DEFAULT_VOCAB_SIZE
from .tracefiles import replacing
from .traces import Request

GeneratorFn = Callable[..., Iterator[Request]]

# Independent random streams derived from the seed, so that adding draws to
# one part of a generator does not shift another's.
_DOC_STREAM = 1
_MIX_STREAM = 2
_PROBE_STREAM = 3


# ---------------------------------------------------------------- validation


def _real(name: str, value: object, minimum: float, *, above: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ArgumentTypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < minimum or (above and value == minimum):
        bound = ">" if above else ">="
        raise ArgumentValueError(f"{name} must be finite and {bound} {minimum:g}, got {value!r}")
    return value


def _vocab(value: object) -> int:
    value = check_int(value, "vocab_size", minimum=1)
    if value > 2**32:
        raise ArgumentValueError(f"vocab_size must be <= 2**32, got {value!r}")
    return value


def _common(seed: object, num_requests: object) -> tuple[int, int]:
    return check_int(seed, "seed", minimum=0), _count(num_requests, "num_requests", 0, MAX_REQUESTS)


def _count(value: object, name: str, minimum: int = 1, maximum: int = MAX_ITEMS) -> int:
    """A count parameter: an int in ``[minimum, maximum]`` (:data:`~radixkv.workload.limits.MAX_ITEMS`
    unless given), else a typed error naming ``name``. O(1)."""
    return check_at_most(check_int(value, name, minimum=minimum), name, maximum)


def _mean(value: object, name: str, minimum: int = 0) -> int:
    """A ``*_tokens`` mean length: :func:`_count` up to :data:`~radixkv.workload.limits.MAX_PROMPT_TOKENS`."""
    return _count(value, name, minimum, MAX_PROMPT_TOKENS)


def _fits(kind: str, prompt: int, prompt_terms: str, kept: int, kept_terms: str) -> None:
    """Refuse parameters whose mean prompt (``prompt`` tokens, the sum ``prompt_terms``) or whose
    tokens kept at once (``kept``, the sum ``kept_terms``; each array counts
    :data:`~radixkv.workload.limits.ARRAY_TOKENS` more) pass the bounds. O(1), before anything is made."""
    if prompt > MAX_PROMPT_TOKENS:
        raise ArgumentValueError(f"{kind}: {prompt_terms} come to {prompt:,} tokens a prompt on average; a prompt "
                                 f"may have at most {spell(MAX_PROMPT_TOKENS)}")
    if kept > MAX_RESIDENT_TOKENS:
        raise ArgumentValueError(f"{kind}: {kept_terms} come to {kept:,} tokens kept in memory; a generator keeps "
                                 f"at most {spell(MAX_RESIDENT_TOKENS)}")


def _fits_sessions(kind: str, num_requests: int, sessions: int, system: int, first: int, step: int, output: int,
                   max_steps: int, names: tuple[str, str, str, str, str, str]) -> None:
    """:func:`_fits` for :func:`_sessions`: the last step's prompt (capped by the steps
    ``num_requests`` allows), kept by every open session. ``names``: the caller's names of
    (sessions, system, first, step, output, max_steps)."""
    n_sessions, n_system, n_first, n_step, n_output, n_max = names
    steps = min(max_steps, max(num_requests, 1))
    prompt = system + first + (steps - 1) * (output + step)
    terms = f"{n_system} + {n_first} + ({n_max} - 1) x ({n_output} + {n_step})"
    _fits(kind, prompt, terms, sessions * (prompt + 3 * ARRAY_TOKENS), f"{n_sessions} x ({terms})")


# ------------------------------------------------------------------- drawing


def _length(rng: np.random.Generator, mean: int) -> int:
    """A length uniform on [ceil(mean/2), mean + floor(mean/2)]."""
    if mean == 0:
        return 0
    return int(rng.integers((mean + 1) // 2, mean + mean // 2 + 1))


def _tokens(rng: np.random.Generator, mean: int, vocab_size: int) -> np.ndarray:
    """Random token ids, a length drawn by :func:`_length`."""
    return rng.integers(0, vocab_size, size=_length(rng, mean), dtype=TOKEN_DTYPE)


def _request(parts: Iterable[np.ndarray], timestamp: float, output_length: int,
             tenant: Optional[str] = None) -> Request:
    tokens = np.concatenate(list(parts))
    tokens.flags.writeable = False  # prompts can share segments; keep them immutable
    return Request(tokens, float(timestamp), int(output_length), tenant=tenant)


class _Zipf:
    """Draws ``i`` in ``[0, n)`` with probability proportional to ``1 / (i+1)**alpha``; O(log n) a draw."""

    __slots__ = ("_cdf", "probs")

    def __init__(self, n: int, alpha: float) -> None:
        weights = np.arange(1, n + 1, dtype=np.float64) ** -alpha
        self.probs = weights / weights.sum()
        self._cdf = np.cumsum(self.probs)

    def draw(self, rng: np.random.Generator) -> int:
        i = int(np.searchsorted(self._cdf, rng.random() * self._cdf[-1], side="right"))
        return min(i, len(self._cdf) - 1)

    def draw_distinct(self, rng: np.random.Generator, k: int) -> list[int]:
        """``k`` distinct items in draw order (weighted sampling without replacement)."""
        picked: list[int] = []
        for _ in range(64 * k):  # rejection is fast unless k nears the support
            i = self.draw(rng)
            if i not in picked:
                picked.append(i)
                if len(picked) == k:
                    return picked
        n = len(self.probs)
        return [int(i) for i in rng.choice(n, size=k, replace=False, p=self.probs)]


class _Corpus:
    """Documents made on first use from their own random stream, so ``doc(i)`` is the same whenever asked."""

    __slots__ = ("_seed", "_mean", "_vocab_size", "_docs")

    def __init__(self, seed: int, mean_tokens: int, vocab_size: int) -> None:
        self._seed, self._mean, self._vocab_size = seed, mean_tokens, vocab_size
        self._docs: dict[int, np.ndarray] = {}

    def doc(self, i: int) -> np.ndarray:
        doc = self._docs.get(i)
        if doc is None:
            rng = np.random.default_rng([self._seed, _DOC_STREAM, i])
            doc = self._docs[i] = _tokens(rng, self._mean, self._vocab_size)
        return doc


def _poisson(rng: np.random.Generator, request_rate: float) -> Iterator[float]:
    """Arrival times of a Poisson process: 0, then exponential gaps of mean 1/rate."""
    t = 0.0
    while True:
        yield t
        t += rng.exponential(1.0 / request_rate)


# ---------------------------------------------------------------- generators


def system_prompt(
    seed: int,
    num_requests: int,
    *,
    num_prompts: int = 8,
    system_tokens: int = 512,
    num_shots: int = 4,
    shot_tokens: int = 128,
    question_tokens: int = 64,
    output_tokens: int = 128,
    zipf_alpha: float = 1.0,
    request_rate: float = 10.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Iterator[Request]:
    """Shared system prompts with few-shot examples, then a unique question.

    Each of ``num_prompts`` applications has a fixed prefix: a system prompt
    of ``system_tokens`` plus ``num_shots`` examples of ``shot_tokens``. A
    request picks an application by Zipf popularity (``zipf_alpha``) and
    appends a fresh question of ``question_tokens``. Arrivals are Poisson at
    ``request_rate``.

    Cost: O(total tokens).
    """
    seed, num_requests = _common(seed, num_requests)
    num_prompts = _count(num_prompts, "num_prompts")
    system_tokens = _mean(system_tokens, "system_tokens")
    num_shots = _count(num_shots, "num_shots", minimum=0)
    shot_tokens = _mean(shot_tokens, "shot_tokens")
    question_tokens = _mean(question_tokens, "question_tokens", minimum=1)
    output_tokens = _mean(output_tokens, "output_tokens")
    zipf_alpha = _real("zipf_alpha", zipf_alpha, 0.0)
    request_rate = _real("request_rate", request_rate, 0.0, above=True)
    vocab_size = _vocab(vocab_size)
    _fits("system_prompt", system_tokens + num_shots * shot_tokens + question_tokens,
          "system_tokens + num_shots x shot_tokens + question_tokens",
          num_prompts * (system_tokens + ARRAY_TOKENS + num_shots * (shot_tokens + ARRAY_TOKENS)),
          "num_prompts x (system_tokens + num_shots x shot_tokens)")

    def run() -> Iterator[Request]:
        rng = np.random.default_rng(seed)
        prefixes = [
            np.concatenate(
                [_tokens(rng, system_tokens, vocab_size)]
                + [_tokens(rng, shot_tokens, vocab_size) for _ in range(num_shots)]
            )
            for _ in range(num_prompts)
        ]
        popularity = _Zipf(num_prompts, zipf_alpha)
        for _, t in zip(range(num_requests), _poisson(rng, request_rate)):
            prefix = prefixes[popularity.draw(rng)]
            question = _tokens(rng, question_tokens, vocab_size)
            yield _request((prefix, question), t, _length(rng, output_tokens))

    return run()


def _sessions(
    seed: int,
    num_requests: int,
    *,
    num_sessions: int,
    system_tokens: int,
    first_tokens: int,
    step_tokens: int,
    output_tokens: int,
    mean_steps: float,
    max_steps: int,
    mean_gap: float,
    vocab_size: int,
) -> Iterator[Request]:
    """``num_sessions`` concurrent sessions; step k's prompt = step k-1's prompt + its output + new input.

    Every session opens with one shared system prompt (``system_tokens``, drawn
    first) and ``first_tokens`` of its own; steps add ``step_tokens``. A session lasts ``min(Geometric(1/mean_steps), max_steps)`` steps with
    exponential gaps of mean ``mean_gap`` between them; when one ends a new
    one starts an exponential gap later. The first sessions start uniformly
    in ``[0, mean_gap)``. Requests come out in time order (ties: oldest session first).
    """
    rng = np.random.default_rng(seed)
    system = _tokens(rng, system_tokens, vocab_size)
    order = itertools.count()
    pending: list[tuple[float, int, int, np.ndarray]] = []  # (time, session, steps left, prompt)

    def open_session(t: float) -> None:
        steps = min(int(rng.geometric(1.0 / mean_steps)), max_steps)
        prompt = np.concatenate((system, _tokens(rng, first_tokens, vocab_size)))
        heapq.heappush(pending, (t, next(order), steps, prompt))

    for _ in range(num_sessions):
        open_session(rng.uniform(0.0, mean_gap))
    for _ in range(num_requests):
        t, session, steps, prompt = heapq.heappop(pending)
        output_length = _length(rng, output_tokens)
        request = _request((prompt,), t, output_length)
        yield request
        t_next = t + rng.exponential(mean_gap) if mean_gap > 0 else t
        if steps > 1:
            output = rng.integers(0, vocab_size, size=output_length, dtype=TOKEN_DTYPE)
            step = _tokens(rng, step_tokens, vocab_size)
            heapq.heappush(pending, (t_next, session, steps - 1, np.concatenate((request.tokens, output, step))))
        else:
            open_session(t_next)


def multi_turn(
    seed: int,
    num_requests: int,
    *,
    num_sessions: int = 32,
    system_tokens: int = 128,
    message_tokens: int = 64,
    answer_tokens: int = 192,
    mean_turns: float = 4.0,
    max_turns: int = 32,
    think_time: float = 20.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Iterator[Request]:
    """Concurrent chat sessions; each turn's prompt is the whole conversation so far.

    ``num_sessions`` sessions are open at any time (a finished one is
    replaced). Every session starts with one system prompt of
    ``system_tokens`` shared by all sessions, then a user message of
    ``message_tokens``. Turn k's prompt is turn k-1's prompt + its answer
    (exactly ``output_length`` tokens, mean ``answer_tokens``) + a new
    message. A session has Geometric(1/``mean_turns``) turns, capped at
    ``max_turns``, separated by exponential think times of mean
    ``think_time`` seconds; sessions interleave in time, so the request rate
    is about ``num_sessions / think_time``.

    Cost: O(total tokens).
    """
    seed, num_requests = _common(seed, num_requests)
    num_sessions = _count(num_sessions, "num_sessions")
    system_tokens = _mean(system_tokens, "system_tokens")
    message_tokens = _mean(message_tokens, "message_tokens", minimum=1)
    answer_tokens = _mean(answer_tokens, "answer_tokens")
    mean_turns = _real("mean_turns", mean_turns, 1.0)
    max_turns = _count(max_turns, "max_turns")
    think_time = _real("think_time", think_time, 0.0)
    vocab_size = _vocab(vocab_size)
    _fits_sessions("multi_turn", num_requests, num_sessions, system_tokens, message_tokens, message_tokens,
                   answer_tokens, max_turns, ("num_sessions", "system_tokens", "message_tokens", "message_tokens",
                                              "answer_tokens", "max_turns"))

    return _sessions(seed, num_requests, num_sessions=num_sessions, system_tokens=system_tokens,
                     first_tokens=message_tokens, step_tokens=message_tokens, output_tokens=answer_tokens,
                     mean_steps=mean_turns, max_steps=max_turns, mean_gap=think_time, vocab_size=vocab_size)


def rag(
    seed: int,
    num_requests: int,
    *,
    num_docs: int = 500,
    doc_tokens: int = 384,
    docs_per_request: int = 4,
    system_tokens: int = 128,
    question_tokens: int = 48,
    output_tokens: int = 128,
    zipf_alpha: float = 1.0,
    request_rate: float = 10.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Iterator[Request]:
    """Retrieval-augmented prompts: system prompt + k retrieved documents + question.

    A corpus of ``num_docs`` documents of ``doc_tokens`` each has Zipf
    popularity (``zipf_alpha``). A request retrieves ``docs_per_request``
    distinct documents, weighted by popularity without replacement, and
    places them in draw order: popular documents tend to come first, but the
    same set arrives in varying orders, so two requests share a prefix beyond
    the common system prompt (``system_tokens``) only while their orders
    agree. A fresh question of ``question_tokens`` ends the prompt. Arrivals
    are Poisson at ``request_rate``.

    Cost: O(total tokens); documents are made on first retrieval.
    """
    seed, num_requests = _common(seed, num_requests)
    num_docs = _count(num_docs, "num_docs")
    doc_tokens = _mean(doc_tokens, "doc_tokens", minimum=1)
    docs_per_request = _count(docs_per_request, "docs_per_request", minimum=0)
    if docs_per_request > num_docs:
        raise ArgumentValueError(f"docs_per_request must be <= num_docs ({num_docs}), got {docs_per_request!r}")
    system_tokens = _mean(system_tokens, "system_tokens")
    question_tokens = _mean(question_tokens, "question_tokens", minimum=1)
    output_tokens = _mean(output_tokens, "output_tokens")
    zipf_alpha = _real("zipf_alpha", zipf_alpha, 0.0)
    request_rate = _real("request_rate", request_rate, 0.0, above=True)
    vocab_size = _vocab(vocab_size)
    _fits("rag", system_tokens + docs_per_request * doc_tokens + question_tokens,
          "system_tokens + docs_per_request x doc_tokens + question_tokens",
          system_tokens + min(num_docs, num_requests * docs_per_request) * (doc_tokens + ARRAY_TOKENS),
          "num_docs x doc_tokens (the documents num_requests x docs_per_request retrieve)")

    def run() -> Iterator[Request]:
        rng = np.random.default_rng(seed)
        corpus = _Corpus(seed, doc_tokens, vocab_size)
        popularity = _Zipf(num_docs, zipf_alpha)
        system = _tokens(rng, system_tokens, vocab_size)
        for _, t in zip(range(num_requests), _poisson(rng, request_rate)):
            docs = [corpus.doc(i) for i in popularity.draw_distinct(rng, docs_per_request)]
            question = _tokens(rng, question_tokens, vocab_size)
            yield _request([system, *docs, question], t, _length(rng, output_tokens))

    return run()


def agent(
    seed: int,
    num_requests: int,
    *,
    num_agents: int = 16,
    system_tokens: int = 512,
    task_tokens: int = 128,
    action_tokens: int = 64,
    tool_tokens: int = 192,
    mean_steps: float = 6.0,
    max_steps: int = 32,
    step_time: float = 2.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Iterator[Request]:
    """Agent loops whose context grows by an action and a tool output each step.

    ``num_agents`` loops run at once (a finished one is replaced). A loop
    starts from a system prompt with the tool descriptions (``system_tokens``,
    shared by all loops) and a task of ``task_tokens``. Each step the model
    emits an action (``output_length``, mean ``action_tokens``); the next
    prompt is the previous one + that action + the tool's output
    (``tool_tokens``). A loop runs Geometric(1/``mean_steps``) steps, capped
    at ``max_steps``, with exponential gaps of mean ``step_time`` seconds
    (decode + tool latency).

    Cost: O(total tokens).
    """
    seed, num_requests = _common(seed, num_requests)
    num_agents = _count(num_agents, "num_agents")
    system_tokens = _mean(system_tokens, "system_tokens")
    task_tokens = _mean(task_tokens, "task_tokens", minimum=1)
    action_tokens = _mean(action_tokens, "action_tokens")
    tool_tokens = _mean(tool_tokens, "tool_tokens")
    mean_steps = _real("mean_steps", mean_steps, 1.0)
    max_steps = _count(max_steps, "max_steps")
    step_time = _real("step_time", step_time, 0.0)
    vocab_size = _vocab(vocab_size)
    _fits_sessions("agent", num_requests, num_agents, system_tokens, task_tokens, tool_tokens, action_tokens,
                   max_steps, ("num_agents", "system_tokens", "task_tokens", "tool_tokens", "action_tokens",
                               "max_steps"))

    return _sessions(seed, num_requests, num_sessions=num_agents, system_tokens=system_tokens,
                     first_tokens=task_tokens, step_tokens=tool_tokens, output_tokens=action_tokens,
                     mean_steps=mean_steps, max_steps=max_steps, mean_gap=step_time, vocab_size=vocab_size)


def long_doc_qa(
    seed: int,
    num_requests: int,
    *,
    num_docs: int = 4,
    doc_tokens: int = 2000,
    question_tokens: int = 32,
    output_tokens: int = 128,
    zipf_alpha: float = 0.0,
    request_rate: float = 2.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Iterator[Request]:
    """Many questions over a few long documents: prompt = document + question.

    ``num_docs`` documents of ``doc_tokens``; each request picks one by Zipf
    popularity (``zipf_alpha``, default uniform) and appends a fresh question
    of ``question_tokens``. Arrivals are Poisson at ``request_rate``. The
    default ``doc_tokens`` is modest to keep 1000 requests near two million
    tokens; raise it for long-context studies.

    Cost: O(total tokens).
    """
    seed, num_requests = _common(seed, num_requests)
    num_docs = _count(num_docs, "num_docs")
    doc_tokens = _mean(doc_tokens, "doc_tokens", minimum=1)
    question_tokens = _mean(question_tokens, "question_tokens", minimum=1)
    output_tokens = _mean(output_tokens, "output_tokens")
    zipf_alpha = _real("zipf_alpha", zipf_alpha, 0.0)
    request_rate = _real("request_rate", request_rate, 0.0, above=True)
    vocab_size = _vocab(vocab_size)
    _fits("long_doc_qa", doc_tokens + question_tokens, "doc_tokens + question_tokens",
          min(num_docs, num_requests) * (doc_tokens + ARRAY_TOKENS),
          "num_docs x doc_tokens (the documents num_requests ask about)")

    def run() -> Iterator[Request]:
        rng = np.random.default_rng(seed)
        corpus = _Corpus(seed, doc_tokens, vocab_size)
        popularity = _Zipf(num_docs, zipf_alpha)
        for _, t in zip(range(num_requests), _poisson(rng, request_rate)):
            doc = corpus.doc(popularity.draw(rng))
            question = _tokens(rng, question_tokens, vocab_size)
            yield _request((doc, question), t, _length(rng, output_tokens))

    return run()


def scan(
    seed: int,
    num_requests: int,
    *,
    prompt_tokens: int = 512,
    output_tokens: int = 128,
    request_rate: float = 10.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Iterator[Request]:
    """One-off prompts that share nothing: the cache-pollution case.

    Each prompt is ``prompt_tokens`` fresh random ids (two prompts agree on
    their first 16 ids with probability ``vocab_size**-16``). Arrivals are
    Poisson at ``request_rate``.

    Cost: O(total tokens).
    """
    seed, num_requests = _common(seed, num_requests)
    prompt_tokens = _mean(prompt_tokens, "prompt_tokens", minimum=1)
    output_tokens = _mean(output_tokens, "output_tokens")
    request_rate = _real("request_rate", request_rate, 0.0, above=True)
    vocab_size = _vocab(vocab_size)

    def run() -> Iterator[Request]:
        rng = np.random.default_rng(seed)
        for _, t in zip(range(num_requests), _poisson(rng, request_rate)):
            prompt = _tokens(rng, prompt_tokens, vocab_size)
            yield _request((prompt,), t, _length(rng, output_tokens))

    return run()


MIX_KINDS = ("system_prompt", "multi_turn", "rag", "agent", "long_doc_qa", "scan")
"""Kinds :func:`mix` draws from, in the order that fixes their derived seeds."""


def mix(
    seed: int,
    num_requests: int,
    *,
    weights: Optional[Mapping[str, float]] = None,
    kind_params: Optional[Mapping[str, Mapping[str, object]]] = None,
    request_rate: float = 10.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Iterator[Request]:
    """A seeded mixture of the other kinds, overlapping in time.

    The count of each kind is Multinomial(``num_requests``, ``weights``)
    (``weights``: kind -> non-negative weight, default equal over
    :data:`MIX_KINDS`). Each kind runs from its own seed derived from
    ``seed``, with its default parameters updated by ``kind_params[kind]``.
    Each kind's timeline is then scaled linearly onto ``[0, num_requests /
    request_rate]`` and the streams are merged by time, so the kinds
    interleave over the whole trace rather than following one another; order
    and relative gaps within a kind are kept.

    Cost: O(total tokens), with every kind generated twice (once to find its
    time span) to stream in O(one request per kind) memory.
    """
    seed, num_requests = _common(seed, num_requests)
    request_rate = _real("request_rate", request_rate, 0.0, above=True)
    vocab_size = _vocab(vocab_size)
    if weights is None:
        weights = {kind: 1.0 for kind in MIX_KINDS}
    if not isinstance(weights, Mapping):
        raise ArgumentTypeError(f"weights must be a mapping of kind to weight, got {weights!r}")
    kind_params = {} if kind_params is None else kind_params
    if not isinstance(kind_params, Mapping):
        raise ArgumentTypeError(f"kind_params must be a mapping of kind to parameters, got {kind_params!r}")
    for name, mapping in (("weights", weights), ("kind_params", kind_params)):
        unknown = sorted(set(mapping) - set(MIX_KINDS), key=repr)
        if unknown:
            raise ArgumentValueError(f"{name} has unknown kind {unknown[0]!r}; expected some of {', '.join(MIX_KINDS)}")
    probs = np.array([_real(f"weights[{k!r}]", weights.get(k, 0.0), 0.0) for k in MIX_KINDS])
    if probs.sum() <= 0:
        raise ArgumentValueError(f"weights must give some kind a positive weight, got {dict(weights)!r}")

    rng = np.random.default_rng([seed, _MIX_STREAM])
    counts = rng.multinomial(num_requests, probs / probs.sum())
    streams: list[Callable[[], Iterator[Request]]] = []
    for index, (kind, count) in enumerate(zip(MIX_KINDS, counts)):
        if count == 0:
            continue
        kind_seed = int(np.random.SeedSequence([seed, _MIX_STREAM, index]).generate_state(1)[0])
        params = {"vocab_size": vocab_size, **kind_params.get(kind, {})}
        GENERATORS[kind](kind_seed, int(count), **params)  # check the parameters now
        streams.append(lambda g=GENERATORS[kind], s=kind_seed, n=int(count), p=params: g(s, n, **p))
    duration = num_requests / request_rate

    def rescaled(make: Callable[[], Iterator[Request]]) -> Iterator[Request]:
        first = last = None
        for request in make():
            first = request.timestamp if first is None else first
            last = request.timestamp
        scale = duration / (last - first) if last > first else 0.0
        for request in make():
            yield dataclasses.replace(request, timestamp=(request.timestamp - first) * scale)

    def run() -> Iterator[Request]:
        yield from heapq.merge(*(rescaled(make) for make in streams), key=lambda r: r.timestamp)

    return run()


ATTACKER = "attacker"
"""The tenant name of :func:`multitenant`'s attacker (``radixkv attack --attacker``'s default)."""


def multitenant(
    seed: int,
    num_requests: int,
    *,
    num_tenants: int = 8,
    num_prompts: int = 4,
    system_tokens: int = 256,
    num_docs: int = 8,
    doc_tokens: int = 512,
    private_docs: int = 3,
    private_tokens: int = 512,
    question_tokens: int = 32,
    private_share: float = 0.4,
    doc_share: float = 0.3,
    zipf_alpha: float = 1.0,
    probe_every: int = 3,
    probe_start: float = 0.25,
    probe_pages: int = 1,
    extend_pages: int = 2,
    page_size: int = 16,
    output_tokens: int = 64,
    request_rate: float = 10.0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Iterator[Request]:
    """Tenants ``t0 .. t{n-1}`` sharing public prefixes and sending private ones, probed by one
    attacker tenant (:data:`ATTACKER`): the workload of ``radixkv attack``.

    Public: ``num_prompts`` system prompts (Zipf-popular) and ``num_docs``
    popular documents (Zipf), each document behind its own system prompt.
    Private: each tenant's ``private_docs`` documents (personal context),
    each behind a fixed system prompt. An honest request (a uniform tenant)
    is, with probability ``private_share``, one of its private documents,
    else with ``doc_share`` a popular document, else a bare system prompt,
    followed by a fresh question.

    The attacker knows a dictionary: every private document's first
    ``probe_pages`` pages (with its system prompt), as many decoys (a system
    prompt and random pages), and every public prefix. After ``probe_start``
    of the requests, it sends one probe (exactly a candidate, cut at a page
    of ``page_size`` tokens) after every ``probe_every`` honest requests, the
    candidates in a random order; after each private candidate or decoy come
    ``extend_pages`` rounds of the next page: the true one, then a wrong
    guess (PromptPeek's reconstruction; ``radixkv attack`` sends a round
    only when the page before it was a hit). ``num_requests`` counts both.

    Cost: O(total tokens).
    """
    seed, num_requests = _common(seed, num_requests)
    counts = {name: _count(value, name, maximum=maximum) for name, value, maximum in (
        ("num_tenants", num_tenants, MAX_TENANTS), ("num_prompts", num_prompts, MAX_ITEMS),
        ("num_docs", num_docs, MAX_ITEMS), ("private_docs", private_docs, MAX_ITEMS),
        ("probe_every", probe_every, MAX_ITEMS), ("probe_pages", probe_pages, MAX_ITEMS),
        ("page_size", page_size, MAX_PAGE_SIZE), ("question_tokens", question_tokens, MAX_PROMPT_TOKENS))}
    for name, value in (("system_tokens", system_tokens), ("doc_tokens", doc_tokens),
                        ("private_tokens", private_tokens), ("output_tokens", output_tokens)):
        _mean(value, name)
    _count(extend_pages, "extend_pages", minimum=0)
    shares = [_real(name, value, 0.0) for name, value in (
        ("private_share", private_share), ("doc_share", doc_share), ("probe_start", probe_start))]
    if shares[0] + shares[1] > 1 or shares[2] > 1:
        raise ArgumentValueError(f"private_share + doc_share and probe_start must be <= 1, got "
                                 f"{shares[0] + shares[1]!r} and {shares[2]!r}")
    zipf_alpha = _real("zipf_alpha", zipf_alpha, 0.0)
    request_rate = _real("request_rate", request_rate, 0.0, above=True)
    vocab_size = _vocab(vocab_size)
    page = counts["page_size"]
    owned = counts["num_tenants"] * counts["private_docs"]
    candidate = system_tokens + private_tokens + ARRAY_TOKENS  # a private prefix, or a decoy, as one array
    rounds = min(extend_pages, (system_tokens + private_tokens) // page)
    _fits("multitenant", system_tokens + max(doc_tokens, private_tokens) + question_tokens,
          "system_tokens + max(doc_tokens, private_tokens) + question_tokens",
          counts["num_prompts"] * (system_tokens + ARRAY_TOKENS)
          + 2 * counts["num_docs"] * (system_tokens + doc_tokens + ARRAY_TOKENS)
          + owned * (private_tokens + ARRAY_TOKENS) + 2 * owned * (1 + rounds) * candidate,
          "num_prompts x system_tokens + num_docs x doc_tokens + num_tenants x private_docs x "
          "(system_tokens + private_tokens) x (1 + extend_pages) (the attacker's dictionary)")

    def probes(public: list, private: list, rng: np.random.Generator) -> list:
        """The attacker's schedule: one list of probes per candidate, the candidates shuffled."""
        groups = []
        for prefix, body in private + [(p, _tokens(rng, private_tokens, vocab_size)) for p, _ in private]:
            whole = np.concatenate([prefix, body])
            base = (len(prefix) // page + probe_pages) * page
            if base > len(whole):
                continue
            group = [whole[:base]]
            for step in range(1, extend_pages + 1):
                end = base + step * page
                if end > len(whole):
                    break
                wrong = rng.integers(0, vocab_size, size=page, dtype=TOKEN_DTYPE)
                group += [whole[:end], np.concatenate([whole[: end - page], wrong])]
            groups.append(group)
        groups += [[p[: len(p) // page * page]] for p in public if len(p) >= page]
        return [groups[i] for i in rng.permutation(len(groups))]

    def run() -> Iterator[Request]:
        rng = np.random.default_rng(seed)
        corpus = _Corpus(seed, doc_tokens, vocab_size)
        prompts = [_tokens(rng, system_tokens, vocab_size) for _ in range(counts["num_prompts"])]
        popular = _Zipf(counts["num_prompts"], zipf_alpha)
        docs = [(prompts[popular.draw(rng)], corpus.doc(i)) for i in range(counts["num_docs"])]
        doc_popularity = _Zipf(counts["num_docs"], zipf_alpha)
        private = [[(prompts[popular.draw(rng)], _tokens(rng, private_tokens, vocab_size))
                    for _ in range(counts["private_docs"])] for _ in range(counts["num_tenants"])]
        schedule = [np.concatenate([p, d]) for p, d in docs]
        probe_rng = np.random.default_rng([seed, _PROBE_STREAM])
        pending = [probe for group in probes(schedule + prompts, [pd for own in private for pd in own],
                                             probe_rng) for probe in group]
        honest = 0
        for i, t in zip(range(num_requests), _poisson(rng, request_rate)):
            if pending and i >= shares[2] * num_requests and honest >= counts["probe_every"]:
                honest = 0
                probe = pending.pop(0)
                probe.flags.writeable = False
                yield Request(probe, float(t), 1, tenant=ATTACKER)
                continue
            honest += 1
            tenant = int(rng.integers(counts["num_tenants"]))
            draw = rng.random()
            if draw < shares[0]:
                parts = private[tenant][int(rng.integers(counts["private_docs"]))]
            elif draw < shares[0] + shares[1]:
                parts = docs[doc_popularity.draw(rng)]
            else:
                parts = (prompts[popular.draw(rng)],)
            question = _tokens(rng, question_tokens, vocab_size)
            yield _request((*parts, question), t, _length(rng, output_tokens), tenant=f"t{tenant}")

    return run()


GENERATORS: dict[str, GeneratorFn] = {
    "system_prompt": system_prompt,
    "multi_turn": multi_turn,
    "rag": rag,
    "agent": agent,
    "long_doc_qa": long_doc_qa,
    "scan": scan,
    "mix": mix,
    "multitenant": multitenant,
}
"""Workload kind -> generator ``(seed, num_requests, **params) -> Iterator[Request]``."""


def generate(kind: str, seed: int, num_requests: int, **params: object) -> Iterator[Request]:
    """Run the generator registered as ``kind``.

    Raises ``ValueError`` listing the kinds on an unknown ``kind``, and
    listing the accepted parameters on an unknown parameter name (the
    generator functions themselves raise ``TypeError`` there, as Python does).

    Example:
        >>> [len(r.tokens) for r in generate("scan", seed=0, num_requests=3, prompt_tokens=8)]
        [11, 9, 10]
    """
    fn = GENERATORS.get(kind) if isinstance(kind, str) else None
    if fn is None:
        raise ArgumentValueError(f"unknown workload kind {kind!r}; expected one of: {', '.join(sorted(GENERATORS))}")
    signature = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.values()):
        accepted = [name for name, p in signature.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        for name in params:
            if name not in accepted:
                raise ArgumentValueError(f"{kind} has no parameter {name!r}; accepted: {', '.join(accepted)}")
    return fn(seed, num_requests, **params)


def write_token_jsonl(requests: Iterable[Request], path_or_file: Union[str, os.PathLike, IO[str]]) -> int:
    """Write requests as token JSONL, one ``{"tokens", "timestamp", "output_length", "namespace",
    "tenant"}`` a line.

    ``timestamp``, ``namespace`` and ``tenant`` are omitted when ``None``,
    which is how the token-JSONL loader reads an absent field. Accepts a path
    (UTF-8; replaced only once every request is written, so a generator that
    raises midway leaves the file as it was: :func:`~radixkv.workload.tracefiles.replacing`)
    or an open text file (left open). Returns the number of lines written.

    Cost: O(total tokens); streams, one request in memory at a time.
    """
    if isinstance(path_or_file, (str, os.PathLike)):
        with replacing(path_or_file) as f:
            return _write_lines(requests, f)
    if not callable(getattr(path_or_file, "write", None)):
        raise ArgumentTypeError(f"path_or_file must be a path or a text file, got {path_or_file!r}")
    return _write_lines(requests, path_or_file)


def _write_lines(requests: Iterable[Request], f: IO[str]) -> int:
    count = 0
    for request in requests:
        record: dict[str, object] = {"tokens": np.asarray(request.tokens).tolist()}
        if request.timestamp is not None:
            record["timestamp"] = request.timestamp
        record["output_length"] = request.output_length
        if request.namespace is not None:
            record["namespace"] = request.namespace
        if request.tenant is not None:
            record["tenant"] = request.tenant
        f.write(json.dumps(record, separators=(",", ":")))
        f.write("\n")
        count += 1
    return count
