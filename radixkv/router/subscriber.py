"""Subscription: one instance's ZMQ event stream fed into a :class:`~radixkv.router.index.KVIndex` on a thread.

The SUB side of vLLM's protocol (:mod:`radixkv.events.wire`): multipart ``(topic, seq, payload)``
messages, and a DEALER on the publisher's ROUTER replay socket that sends the first sequence
number wanted and reads ``(topic, seq, payload)`` messages up to the ``-1`` end marker. The
thread owns both sockets. It asks for a replay when the index reports a gap, and, after
``idle_probe`` seconds without a message, asks for the tail (from a few batches back,
:meth:`~radixkv.router.index.KVIndex.probe_from`): a PUB socket
drops what it sends before a subscriber joins and a lost last batch leaves no gap behind it,
so the probe is what makes the tail exact. A replay that does not reach the missing batch
(the publisher's ring moved past it) declares it lost (:meth:`KVIndex.lost`). Needs pyzmq.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Hashable, Optional, Tuple

from ..errors import ArgumentTypeError, ArgumentValueError, MissingExtraError
from .index import KVIndex, StreamStatus, fill_gaps

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
        idle_probe: seconds without a message after which the tail is checked by a replay.

    Counters: :attr:`received` (messages on the SUB socket), :attr:`replays` (requests sent),
    :attr:`bad_frames` (messages not of three
    frames or with a sequence number not of 8 bytes: skipped).
    """

    def __init__(self, index: KVIndex, endpoint: str, instance: Hashable, replay_endpoint: Optional[str] = None, *,
                 topic: str = "", idle_probe: float = 1.0) -> None:
        if not isinstance(index, KVIndex):
            raise ArgumentTypeError(f"index must be a KVIndex, got {index!r}")
        for name, value in (("endpoint", endpoint), ("topic", topic)):
            if not isinstance(value, str):
                raise ArgumentTypeError(f"{name} must be a str, got {value!r}")
        if replay_endpoint is not None and not isinstance(replay_endpoint, str):
            raise ArgumentTypeError(f"replay_endpoint must be a str or None, got {replay_endpoint!r}")
        if isinstance(idle_probe, bool) or not isinstance(idle_probe, (int, float)) or not idle_probe > 0:
            raise ArgumentValueError(f"idle_probe must be a number of seconds > 0, got {idle_probe!r}")
        zmq = _zmq()
        index.add(instance)
        self.index = index
        self.instance = instance
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.idle_probe = float(idle_probe)
        self.received = self.replays = self.bad_frames = 0
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
        self._probe = threading.Event()
        self._probed = threading.Condition()
        self._probes_done = 0
        self.error: Optional[BaseException] = None
        """What stopped the thread, if anything did (it is not raised into the caller's thread)."""
        self._thread = threading.Thread(target=self._run, name=f"radixkv-kv-subscriber-{instance}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ API
    def status(self) -> StreamStatus:
        """The index's view of this stream. O(1)."""
        return self.index.status(self.instance)

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
        with self._probed:
            target = self._probes_done + 1
            self._probe.set()
            return self._probed.wait_for(lambda: self._probes_done >= target or self._stop.is_set(), timeout)

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
                    self._fill(probe=True)
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
                    continue
                idle += 0.02
                if idle >= self.idle_probe:
                    idle = 0.0
                    self._fill(probe=True)
        except BaseException as exc:  # a closed context, a bug: kept for the owner to see
            self.error = exc
        finally:
            with self._probed:
                self._probes_done += 1
                self._probed.notify_all()

    def _take(self, frames: Any) -> None:
        self.received += 1
        if len(frames) != 3 or len(frames[1]) != 8:
            self.bad_frames += 1
            return
        self.index.apply(self.instance, int.from_bytes(frames[1], "big"), frames[2])

    def _fill(self, probe: bool = False) -> None:
        """Replay what the index misses (or, for a probe, the tail of the stream)."""
        if self._replay is None:
            self.index.lost(self.instance)
            return
        fill_gaps(self.index, self.instance, self._ask, probe=probe)

    def _ask(self, start: int) -> Tuple[bool, Optional[int]]:
        """One replay request from ``start``: (the end marker came, the first sequence number sent)."""
        self.replays += 1
        self._replay.send_multipart((b"", start.to_bytes(8, "big")))
        first = None
        while True:
            if not self._replay.poll(REPLAY_TIMEOUT_MS):
                return False, first
            frames = self._replay.recv_multipart()
            if len(frames) != 4 or len(frames[2]) != 8:
                self.bad_frames += 1
                continue
            seq = int.from_bytes(frames[2], "big", signed=True)
            if seq == END_SEQ:
                return True, first
            first = seq if first is None else first
            self.index.apply(self.instance, seq, frames[3])

    def _close_sockets(self) -> None:
        for sock in (self._sub, self._replay):
            if sock is not None:
                sock.close(linger=0)


__all__ = ["Subscription"]
