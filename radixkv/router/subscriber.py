"""Subscription: one instance's ZMQ event stream fed into a :class:`~radixkv.router.index.KVIndex` on a thread.

The SUB side of vLLM's protocol (:mod:`radixkv.events.wire`): multipart ``(topic, seq, payload)``
messages, and a DEALER on the publisher's ROUTER replay socket that sends the first sequence
number wanted and reads ``(topic, seq, payload)`` messages up to the ``-1`` end marker. The
thread owns both sockets. It asks for a replay when the index reports a gap, and, after
``idle_probe`` seconds without a message, asks for the tail (from a few batches back,
:meth:`~radixkv.router.index.KVIndex.probe_from`): a PUB socket
drops what it sends before a subscriber joins and a lost last batch leaves no gap behind it,
so the probe is what makes the tail exact. A replay that does not reach the missing batch
(the publisher's ring moved past it) declares it lost (:meth:`KVIndex.lost`). Given
:class:`~radixkv.router.link.EventFaults`, it drops, repeats and holds back what it hears as the
simulator's :class:`~radixkv.router.link.EventLink` does (the same seeded draws,
:class:`~radixkv.router.link.FaultyWire`): recovery tested on real sockets. Needs pyzmq.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Hashable, List, Optional, Tuple

from ..errors import ArgumentTypeError, ArgumentValueError, MissingExtraError
from .index import KVIndex, StreamStatus, fill_gaps
from .link import EventFaults, FaultyWire

END_SEQ = -1
REPLAY_TIMEOUT_MS = 2000
"""How long a replay answer may pause before the replay is given up (and retried later)."""


def _zmq() -> Any:
    try:
        import zmq
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingExtraError(f"subscribing to KV events needs pyzmq: pip install 'radixkv[events]' ({exc})") from exc
    return zmq


class Subscription:
    """Follows ``instance``'s events at ``endpoint`` into ``index`` until :meth:`close`.

    Args:
        index: the index to apply the batches to.
        endpoint: the publisher's PUB address (connected to).
        instance: the name the index keeps the batches under.
        replay_endpoint: the publisher's ROUTER replay address; ``None``: a gap is lost at once.
        topic: topic prefix subscribed to.
        idle_probe: seconds without a message after which the tail is checked by a replay (``None``:
            never on a timer; a gap is still filled when the next batch shows it, and :meth:`probe`
            asks at once).
        faults: what to do wrong with the batches heard, on purpose (seeded draws as the
            simulator's; a replay's answer is applied as it comes): for tests of recovery.

    Counters: :attr:`received` (messages on the SUB socket), :attr:`replays` (requests sent),
    :attr:`replayed` (batches their answers carried), :attr:`bad_frames` (messages not of three
    frames or with a sequence number not of 8 bytes: skipped); :attr:`wire` the fault draws'
    (``None`` without faults).
    """

    def __init__(self, index: KVIndex, endpoint: str, instance: Hashable, replay_endpoint: Optional[str] = None, *,
                 topic: str = "", idle_probe: Optional[float] = 1.0, faults: Optional[EventFaults] = None) -> None:
        if not isinstance(index, KVIndex):
            raise ArgumentTypeError(f"index must be a KVIndex, got {index!r}")
        for name, value in (("endpoint", endpoint), ("topic", topic)):
            if not isinstance(value, str):
                raise ArgumentTypeError(f"{name} must be a str, got {value!r}")
        if replay_endpoint is not None and not isinstance(replay_endpoint, str):
            raise ArgumentTypeError(f"replay_endpoint must be a str or None, got {replay_endpoint!r}")
        if idle_probe is not None and (isinstance(idle_probe, bool) or not isinstance(idle_probe, (int, float))):
            raise ArgumentTypeError(f"idle_probe must be a number of seconds or None, got {idle_probe!r}")
        if idle_probe is not None and not idle_probe > 0:
            raise ArgumentValueError(f"idle_probe must be a number of seconds > 0 or None, got {idle_probe!r}")
        wire = None if faults is None else FaultyWire(faults, instance)
        zmq = _zmq()
        index.add(instance)
        self.index = index
        self.instance = instance
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.idle_probe = None if idle_probe is None else float(idle_probe)
        self.wire: Optional[FaultyWire] = wire
        self.received = self.replays = self.replayed = self.bad_frames = 0
        self._taken = self._heard = -1  # the sequence number of the last message taken; of the last handled
        self._handled = threading.Condition()
        ctx = zmq.Context.instance()
        self._sub = ctx.socket(zmq.SUB)
        self._replay = None
        try:
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
            self._sub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = ctx.socket(zmq.DEALER)
                self._replay.connect(replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ArgumentValueError(f"cannot connect to {endpoint!r} / {replay_endpoint!r}: {exc}") from exc
        self._stop = threading.Event()
        self._done = threading.Event()  # the thread ended (stopped or failed)
        self._probe = threading.Event()
        self._probed = threading.Condition()
        self._probes_done = 0
        self._want_probe = False  # what the callers of probe() and catch_up() asked the thread for
        self._catch_to: Optional[int] = None
        self._fetched: Optional[Tuple[int, int]] = None  # batches fetched by catch_up and not heard since
        self.error: Optional[BaseException] = None
        """What stopped the thread, if anything did (it is not raised into the caller's thread)."""
        self._thread = threading.Thread(target=self._run, name=f"radixkv-kv-subscriber-{instance}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ API
    def status(self) -> StreamStatus:
        """The index's view of this stream. O(1)."""
        return self.index.status(self.instance)

    def wait_heard(self, seq: int, timeout: float = 10.0) -> bool:
        """Block until the thread has taken a message numbered ``seq`` or later off the SUB socket and
        handled it: applied (or, with faults, dropped, repeated or held back) and any gap it showed
        filled by a replay. What a driver that knows the publisher sent ``seq`` waits for to read
        the view a subscriber has once the batch arrived, lost or not; unlike :meth:`wait` it never
        asks for a replay itself. True if within ``timeout`` seconds (False also once closed)."""
        with self._handled:
            return self._handled.wait_for(lambda: self._heard >= seq or self._done.is_set() or self._stop.is_set(),
                                          timeout) and self._heard >= seq

    def catch_up(self, seq: int, timeout: float = 5.0) -> bool:
        """Fetch by a replay the batches the publisher sent up to ``seq`` that were not heard (a SUB socket
        that had not joined yet when they were sent drops them), and handle them as if heard:
        through the faults' draws, so a run with faults stays the one it would have been. A copy of
        one that arrives late on the SUB socket is then skipped. True if done within ``timeout``.

        The numbers are the stream's since the subscription began: after a publisher restart, a
        ``seq`` below the last heard one is already "heard" (so is :meth:`wait_heard`'s)."""
        return self._ask_thread(timeout, catch_to=seq)

    def wait(self, seq: int, timeout: float = 10.0) -> bool:
        """Block until batch ``seq`` is applied with no gap before it, probing the replay socket
        meanwhile; True if it was within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if st.next_seq > seq and not st.stale:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self.error is not None or not self._thread.is_alive():
                return False
            self.probe(min(left, 0.5))

    def probe(self, timeout: float = 5.0) -> bool:
        """Ask the thread for a replay of the tail now (:meth:`KVIndex.probe_from`), and wait until it was done.

        The way to make the view current before reading it (a test's, or a router's after a
        quiet spell). True if done within ``timeout`` seconds."""
        return self._ask_thread(timeout, probe=True)

    def _ask_thread(self, timeout: float, *, probe: bool = False, catch_to: Optional[int] = None) -> bool:
        """Ask the thread for a probe or a catch-up and wait until it was done (False at once if it ended)."""
        with self._probed:
            target = self._probes_done + 1
            self._want_probe = self._want_probe or probe
            if catch_to is not None:
                self._catch_to = catch_to if self._catch_to is None else max(self._catch_to, catch_to)
            self._probe.set()
            self._probed.wait_for(lambda: self._probes_done >= target or self._done.is_set() or self._stop.is_set(),
                                  timeout)
            return self._probes_done >= target and not self._done.is_set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and close the sockets. Idempotent."""
        self._stop.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_sockets()

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        zmq = _zmq()
        idle = 0.0
        try:
            while not self._stop.is_set():
                if self._probe.is_set():
                    self._probe.clear()
                    with self._probed:
                        probe, self._want_probe = self._want_probe, False
                        catch_to, self._catch_to = self._catch_to, None
                    if catch_to is not None:
                        self._catch_up(catch_to)
                    if probe:
                        self._release()
                        self._fill(probe=True)
                    self._settle()
                    with self._probed:
                        self._probes_done += 1
                        self._probed.notify_all()
                if self._sub.poll(20):
                    idle = 0.0
                    while True:  # everything queued, then one look at the gaps
                        try:
                            frames = self._sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._take(frames)
                    if self.index.replay_from(self.instance) is not None:
                        self._fill()
                    self._settle()  # only now: a waiter reads the view with the round's gaps filled
                    continue
                idle += 0.02
                if self.idle_probe is not None and idle >= self.idle_probe:
                    idle = 0.0
                    self._release()
                    self._fill(probe=True)
        except BaseException as exc:  # a closed context, a bug: kept for the owner to see
            self.error = exc
        finally:
            self._done.set()
            with self._probed:
                self._probes_done += 1
                self._probed.notify_all()
            with self._handled:
                self._handled.notify_all()

    def _settle(self) -> None:
        with self._handled:
            self._heard = self._taken
            self._handled.notify_all()

    def _take(self, frames: Any) -> None:
        self.received += 1
        if len(frames) != 3 or len(frames[1]) != 8:
            self.bad_frames += 1
            return
        seq = int.from_bytes(frames[1], "big")
        if self._fetched is not None:
            first, last = self._fetched
            if first <= seq <= last:  # a late copy of a batch catch_up handled: heard already
                self._fetched = (seq + 1, last) if seq < last else None
                return
            if seq > last:
                self._fetched = None
        self._hear(seq, frames[2])

    def _hear(self, seq: int, payload: bytes) -> None:
        if self.wire is None:
            self.index.apply(self.instance, seq, payload)
        else:  # as the simulator's link: each delivery applied, and a gap it shows filled at once
            for item in self.wire.carry(seq, payload):
                self._deliver(*item)
        self._taken = seq

    def _catch_up(self, upto: int) -> None:
        """Replay from the batch after the last heard, and hear those up to ``upto`` (see :meth:`catch_up`)."""
        start = self._taken + 1
        if self._replay is None or start > upto:
            return
        got = [(seq, payload) for seq, payload in self._request_replay(start)[1] if start <= seq <= upto]
        if got:
            self._fetched = (got[0][0], got[-1][0])
            for seq, payload in got:
                self._hear(seq, payload)

    def _deliver(self, seq: int, payload: bytes) -> None:
        self.index.apply(self.instance, seq, payload)
        if self.index.replay_from(self.instance) is not None:
            self._fill()

    def _release(self) -> None:
        """Deliver the batch the faults hold back, if any (a probe's first step, as the link's flush)."""
        held = self.wire.release() if self.wire is not None else None
        if held is not None:
            self._deliver(*held)

    def _fill(self, probe: bool = False) -> None:
        """Replay what the index misses (or, for a probe, the tail of the stream)."""
        if self._replay is None:
            self.index.lost(self.instance)
            return
        fill_gaps(self.index, self.instance, self._ask, probe=probe)

    def _ask(self, start: int) -> Tuple[bool, Optional[int]]:
        """One replay request from ``start``, its batches applied: (the end marker came, the first sequence
        number sent)."""
        done, batches = self._request_replay(start)
        for seq, payload in batches:
            self.index.apply(self.instance, seq, payload)
        return done, batches[0][0] if batches else None

    def _request_replay(self, start: int) -> Tuple[bool, List[Tuple[int, bytes]]]:
        """Ask the publisher's replay socket for its batches from ``start``: (the end marker came, the
        batches in the order received). An answer that pauses :data:`REPLAY_TIMEOUT_MS` is cut there;
        its rest, arriving late, is read with the next answer: real batches all the same (kept, from
        whatever number they start), which may close the gap the next request is about."""
        self.replays += 1
        self._replay.send_multipart((b"", start.to_bytes(8, "big")))
        batches: List[Tuple[int, bytes]] = []
        while self._replay.poll(REPLAY_TIMEOUT_MS):
            frames = self._replay.recv_multipart()
            if len(frames) != 4 or len(frames[2]) != 8:
                self.bad_frames += 1
                continue
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == END_SEQ:
                return True, batches
            self.replayed += 1
            batches.append((seq, frames[3]))
        return False, batches

    def _close_sockets(self) -> None:
        for sock in (self._sub, self._replay):
            if sock is not None:
                sock.close(linger=0)


__all__ = ["Subscription"]
