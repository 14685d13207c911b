"""EventLink: one instance's event stream delivered to a :class:`~radixkv.router.index.KVIndex` in process,
through a transport that loses, repeats and reorders batches on purpose (seeded).

The simulator's stand-in for a ZMQ PUB socket and its ROUTER replay socket
(:mod:`radixkv.events.wire`): it numbers the batches from 0, keeps vLLM's replay ring of the
last ``buffer_steps``, and answers a replay at once, without faults (a replay is a
request-reply exchange, not a broadcast). Faults, per batch sent: dropped with probability
``drop``, else held back and sent after the next batch with probability ``reorder``, and sent
twice with probability ``duplicate``. The index notices the gap a dropped or held batch leaves
when the next one arrives; :meth:`EventLink.flush` sends what is held and probes the tail, as a
live subscriber does when its stream goes quiet. The draws are :class:`FaultyWire`'s, which a
live :class:`~radixkv.router.subscriber.Subscription` given faults uses too, on what it hears.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Deque, Hashable, List, Optional, Tuple

from ..errors import ArgumentTypeError, ArgumentValueError
from ..keys import check_int
from .index import KVIndex, fill_gaps

MAX_SEED = 2**32 - 1


@dataclass(frozen=True, slots=True)
class EventFaults:
    """Fault rates of an event transport (each a probability per batch) and the seed of their draws.

    ``EventFaults.parse("drop=0.05,duplicate=0.05,reorder=0.05,seed=7")`` reads the CLI's
    ``--event-faults`` spec; a rate left out is 0, the seed 0.
    """

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ArgumentValueError(f"event fault rate {name} must be a number in [0, 1), got {value!r}")
        check_int(self.seed, "event fault seed", minimum=0, maximum=MAX_SEED)

    @property
    def any(self) -> bool:
        """Whether any fault is injected."""
        return bool(self.drop or self.duplicate or self.reorder)

    @property
    def spec(self) -> Optional[str]:
        """The spec :meth:`parse` reads back into these faults; ``None`` when none is injected."""
        if not self.any:
            return None
        return f"drop={self.drop},duplicate={self.duplicate},reorder={self.reorder},seed={self.seed}"

    @classmethod
    def parse(cls, spec: str) -> "EventFaults":
        """Faults from ``"drop=R,duplicate=R,reorder=R,seed=N"`` (any subset, any order). Raises
        :class:`~radixkv.errors.ArgumentValueError` naming the bad part."""
        if not isinstance(spec, str):
            raise ArgumentTypeError(f"an event fault spec must be a str, got {spec!r}")
        values = {}
        for part in spec.split(","):
            name, sep, text = part.strip().partition("=")
            if not sep or name not in ("drop", "duplicate", "reorder", "seed") or name in values:
                raise ArgumentValueError(f"event faults are drop=R,duplicate=R,reorder=R[,seed=N] (each once), "
                                         f"got {part.strip()!r} in {spec!r}")
            try:
                values[name] = int(text) if name == "seed" else float(text)
            except ValueError:
                raise ArgumentValueError(f"event fault {name} must be a {'whole ' if name == 'seed' else ''}number, "
                                         f"got {text!r}") from None
        return cls(**values)


class FaultyWire:
    """The fault draws of one stream: what a transport with ``faults`` carries, batch by batch.

    :meth:`carry` takes a batch as its publisher sends it and returns what arrives now, in order:
    nothing (dropped), the batch, the batch twice (duplicated), and after either the batch held
    back from before; or it holds the batch back (reordered) and returns what it held before, if
    anything. The draws are seeded by ``faults.seed`` and ``instance`` (its ``repr``): the
    simulator's :class:`EventLink` and a live :class:`~radixkv.router.subscriber.Subscription`
    given the same faults and instance drop, repeat and hold the same batches.

    Counters: :attr:`sent` (batches given to :meth:`carry`), :attr:`dropped`, :attr:`duplicated`,
    :attr:`reordered`. Cost: O(1) a batch.
    """

    def __init__(self, faults: Optional[EventFaults], instance: Hashable) -> None:
        if faults is not None and not isinstance(faults, EventFaults):
            raise ArgumentTypeError(f"faults must be EventFaults, got {faults!r}")
        self.faults = faults or EventFaults()
        self._rng = random.Random(f"{self.faults.seed}:{instance!r}")
        self._held: Optional[Tuple[int, bytes]] = None
        self.sent = self.dropped = self.duplicated = self.reordered = 0

    def carry(self, seq: int, payload: bytes) -> List[Tuple[int, bytes]]:
        """What arrives now that batch ``seq`` was sent (see the class doc)."""
        self.sent += 1
        out: List[Tuple[int, bytes]] = []
        held, self._held = self._held, None
        f, rng = self.faults, self._rng
        if f.drop and rng.random() < f.drop:
            self.dropped += 1
        elif held is None and f.reorder and rng.random() < f.reorder:
            self._held = (seq, payload)
            self.reordered += 1
        else:
            out.append((seq, payload))
            if f.duplicate and rng.random() < f.duplicate:
                self.duplicated += 1
                out.append((seq, payload))
        if held is not None:
            out.append(held)
        return out

    def release(self) -> Optional[Tuple[int, bytes]]:
        """The batch held back, now delivered (``None``: none is held)."""
        held, self._held = self._held, None
        return held

    def reset(self) -> None:
        """The publisher restarted: what was held is lost."""
        self._held = None


class EventLink:
    """Delivers ``instance``'s batches to ``index`` with ``faults``; serves its replay requests.

    Args:
        index: the receiving index.
        instance: the name the index keeps the batches under.
        faults: what goes wrong (default: nothing).
        buffer_steps: batches kept for replay (vLLM's default 10,000).

    Counters: :attr:`sent`, :attr:`dropped`, :attr:`duplicated`, :attr:`reordered`,
    :attr:`replays` (requests answered), :attr:`replayed` (batches sent by them).
    Cost per batch: the index's :meth:`~KVIndex.apply`, plus the replays.
    """

    def __init__(self, index: KVIndex, instance: Hashable, faults: Optional[EventFaults] = None, *,
                 buffer_steps: int = 10_000) -> None:
        if not isinstance(index, KVIndex):
            raise ArgumentTypeError(f"index must be a KVIndex, got {index!r}")
        self.index = index
        self.instance = instance
        self.wire = FaultyWire(faults, instance)
        self.faults = self.wire.faults
        self._ring: Deque[Tuple[int, bytes]] = deque(maxlen=check_int(buffer_steps, "buffer_steps", minimum=1))
        self.next_seq = 0
        self.replays = self.replayed = 0
        self.due: Optional[int] = None
        """The newest batch that has had time to arrive: a replay answers up to it, no fresher than the
        stream (``None``: every batch sent). Set by a driver that delays arrivals
        (:class:`~radixkv.router.inprocess.EventRouting` with a lag)."""
        index.add(instance)

    sent = property(lambda self: self.wire.sent, doc="Batches published.")
    dropped = property(lambda self: self.wire.dropped, doc="Batches the transport lost.")
    duplicated = property(lambda self: self.wire.duplicated, doc="Batches it delivered twice.")
    reordered = property(lambda self: self.wire.reordered, doc="Batches it held back behind the next.")

    def publish(self, payload: bytes) -> int:
        """Send one batch's payload and let it arrive at once; returns its sequence number."""
        seq = self.send(payload)
        self.arrive(seq, payload)
        return seq

    def send(self, payload: bytes) -> int:
        """The publisher's side of :meth:`publish`: number the batch and keep it in the replay ring (a replay
        serves it from now on); it reaches the index only at :meth:`arrive`. Returns its sequence number."""
        if not isinstance(payload, (bytes, bytearray)):
            raise ArgumentTypeError(f"payload must be bytes, got {type(payload).__name__}")
        seq = self.next_seq
        self.next_seq += 1
        self._ring.append((seq, bytes(payload)))
        return seq

    def arrive(self, seq: int, payload: bytes) -> None:
        """Batch ``seq`` (sent) comes out of the transport: dropped, repeated or held back as the faults draw,
        each delivery applied and a gap it shows filled by a replay. Batches arrive in the order sent."""
        for item in self.wire.carry(seq, payload):
            self._deliver(*item)

    def restart(self) -> None:
        """The publisher restarts: numbering from 0 again, its replay ring empty (what was held is lost)."""
        self.next_seq = 0
        self._ring.clear()
        self.wire.reset()
        self.due = None

    def flush(self) -> None:
        """Send the batch held back, then replay from the last batch the index applied (the tail a
        quiet subscriber probes for)."""
        held = self.wire.release()
        if held is not None:
            self._deliver(*held)
        fill_gaps(self.index, self.instance, self._replay, probe=True)

    def _deliver(self, seq: int, payload: bytes) -> None:
        self.index.apply(self.instance, seq, payload)
        if self.index.replay_from(self.instance) is not None:
            fill_gaps(self.index, self.instance, self._replay)

    def _replay(self, start: int) -> Tuple[bool, Optional[int]]:
        self.replays += 1
        first = None
        due = self.due
        for seq, payload in list(self._ring):
            if seq >= start and (due is None or seq <= due):
                first = seq if first is None else first
                self.replayed += 1
                self.index.apply(self.instance, seq, payload)
        return True, first

    def __repr__(self) -> str:
        return (f"EventLink({self.instance!r}, next_seq={self.next_seq}, sent={self.sent}, dropped={self.dropped}, "
                f"duplicated={self.duplicated}, reordered={self.reordered}, replays={self.replays})")


__all__ = ["EventFaults", "EventLink", "FaultyWire", "MAX_SEED"]
