"""Remote tier: pages held on other hosts' DRAM, behind a pluggable backend.

The tier owns placement and capacity (``blocks_per_host`` slots on each
host, most-free host first); a backend only stores bytes by ``(host, slot)``.
The default :class:`SimulatedHosts` keeps them in-process (no server needed);
:class:`~radixkv.tiers.redis_backend.RedisBackend` keeps them in Redis, one
server per host. A backend that raises :class:`HostDown` marks its host dead:
every page on it becomes a miss and the stack forgets those copies. A backend
that refuses single writes (a server out of memory) reports them from
:meth:`RemoteBackend.put`: only those pages are dropped, the host stays live.
Any other exception from a backend, or an answer out of the
:class:`RemoteBackend` contract (``get`` not one ``bytes`` or ``None`` per
slot, ``put`` not ``None`` or one bool per slot), fails that one call the same
way (its writes dropped, its reads missed; the host stays live) and is counted
in :attr:`RemoteTier.backend_errors`, the first one with a ``RuntimeWarning``:
a broken backend costs recomputes, never an exception out of the cache's
calls or a half-made eviction. Bytes of the right length that are not the
page's fail its checksum in the stack (an integrity miss).
"""

from __future__ import annotations

import warnings
from typing import Dict, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from .. import policies as _policies
from ..errors import ArgumentTypeError
from ..pool import BlockPool
from .base import SLOT_DTYPE, Tier, check_capacity

_MARKER = b"\x01"  # stored when the cache keeps no payload, so a lost host still shows as a miss
_FAILED = object()  # what _call answers for a call that raised
_BYTES = (bytes, bytearray, memoryview)


class HostDown(Exception):
    """Raised by a backend when a host does not answer; the tier turns it into misses."""

    def __init__(self, host: int, reason: object = "") -> None:
        super().__init__(f"remote host {host} is down: {reason}")
        self.host = host


class RemoteBackend(Protocol):
    """Byte storage on ``num_hosts`` hosts, addressed by ``(host, slot)``.

    Every method may raise :class:`HostDown` for ``host`` (it does not answer).
    ``put`` returns ``None`` when every value was stored, else one bool per
    slot (``False``: the host refused that write; its copy is dropped). Any
    other exception fails the call like a refusal (see the module docstring).
    Batched: one call per host per transfer (Redis pipelines it into one
    round trip).
    """

    num_hosts: int

    def put(self, host: int, slots: Sequence[int], values: Sequence[bytes]) -> Optional[Sequence[bool]]: ...

    def get(self, host: int, slots: Sequence[int]) -> List[Optional[bytes]]: ...

    def delete(self, host: int, slots: Sequence[int]) -> None: ...

    def close(self) -> None: ...


class SimulatedHosts:
    """In-process remote hosts: one dict per host. :meth:`kill` simulates a crash (tests, fault drills)."""

    def __init__(self, num_hosts: int) -> None:
        self.num_hosts = check_capacity(num_hosts, "num_hosts")
        self.stores: List[Dict[int, bytes]] = [{} for _ in range(self.num_hosts)]
        self.dead: set = set()

    def _store(self, host: int) -> Dict[int, bytes]:
        if host in self.dead:
            raise HostDown(host, "killed")
        return self.stores[host]

    def put(self, host: int, slots: Sequence[int], values: Sequence[bytes]) -> None:
        self._store(host).update(zip((int(s) for s in slots), values))

    def get(self, host: int, slots: Sequence[int]) -> List[Optional[bytes]]:
        store = self._store(host)
        return [store.get(int(s)) for s in slots]

    def delete(self, host: int, slots: Sequence[int]) -> None:
        store = self._store(host)
        for s in slots:
            store.pop(int(s), None)

    def kill(self, host: int) -> None:
        """Make ``host`` unreachable from now on; its contents are lost."""
        self.dead.add(host)
        self.stores[host] = {}

    def close(self) -> None:
        pass


def _put_ok(answer: object, n: int) -> np.ndarray:
    """A ``put`` answer other than ``None``: one bool per slot (True: stored)."""
    if isinstance(answer, (str, bytes)) or not hasattr(answer, "__len__") or len(answer) != n:
        raise ValueError(f"put must answer None or one bool per slot ({n}), got {answer!r}")
    if not all(isinstance(v, (bool, np.bool_)) for v in answer):
        raise TypeError(f"put must answer None or one bool per slot, got {answer!r}")
    return np.array(answer, dtype=bool)


def _got(answer: object, n: int) -> list:
    """A ``get`` answer: one ``bytes`` (or ``None``: missing) per slot."""
    if isinstance(answer, (str, bytes)) or not hasattr(answer, "__len__") or len(answer) != n:
        raise ValueError(f"get must answer one value per slot ({n}), got {answer!r}")
    values = list(answer)
    if not all(v is None or isinstance(v, _BYTES) for v in values):
        raise TypeError(f"get must answer bytes or None per slot, got {answer!r}")
    return values


class RemoteTier(Tier):
    """``num_hosts`` remote hosts with ``blocks_per_host`` page slots each.

    Slot id ``host * blocks_per_host + local``. Capacity is enforced here, not
    by the backend; a dead host's capacity is gone until the tier is rebuilt.

    Args:
        num_hosts: remote hosts (ignored when ``backend`` is given; its ``num_hosts`` counts).
        blocks_per_host: page slots on each host.
        backend: byte store; default :class:`SimulatedHosts`.
        policy: eviction policy ranking the tier's pages.
    """

    def __init__(self, blocks_per_host: int, num_hosts: int = 1, backend: Optional[RemoteBackend] = None,
                 policy: Union[str, "_policies.EvictionPolicy"] = "lru", name: str = "remote") -> None:
        super().__init__(name, policy)
        self.blocks_per_host = check_capacity(blocks_per_host, "blocks_per_host")
        if backend is None:
            backend = SimulatedHosts(num_hosts)
        elif not all(hasattr(backend, m) for m in ("put", "get", "delete", "num_hosts")):
            raise ArgumentTypeError(f"backend must provide num_hosts, put, get and delete, got {backend!r}")
        self.backend = backend
        self.num_hosts = check_capacity(backend.num_hosts, "num_hosts")
        self._pools = [BlockPool(self.blocks_per_host, 1) for _ in range(self.num_hosts)]
        self._live = np.ones(self.num_hosts, dtype=bool)
        self._newly_lost = False
        self.lost_hosts: List[int] = []
        """Hosts found dead, in the order they were found."""
        self.backend_errors = 0
        """Backend calls that raised something other than :class:`HostDown` (monotonic)."""
        self.last_backend_error: Optional[BaseException] = None
        """The latest of those exceptions, for diagnosis."""

    @property
    def capacity(self) -> int:
        return int(self._live.sum()) * self.blocks_per_host

    @property
    def num_free(self) -> int:
        return sum(p.num_free for h, p in enumerate(self._pools) if self._live[h])

    def take(self, n: int) -> np.ndarray:
        parts = []
        while n > 0:
            free = [p.num_free if self._live[h] else 0 for h, p in enumerate(self._pools)]
            host = int(np.argmax(free))
            if free[host] == 0:
                break
            k = min(n, free[host])
            parts.append(self._pools[host].take(k).astype(SLOT_DTYPE) + host * self.blocks_per_host)
            n -= k
        slots = np.concatenate(parts) if parts else np.empty(0, dtype=SLOT_DTYPE)
        self.used += len(slots)
        return slots

    def give(self, slots: np.ndarray) -> None:
        self.used -= len(slots)
        for host, local in self._by_host(slots):
            self._pools[host].give_back(local.astype(np.int32))
            if self._live[host]:
                self._call(host, self.backend.delete, host, local.tolist())

    def write(self, slots: np.ndarray, pages: Optional[np.ndarray]) -> np.ndarray:
        ok = np.ones(len(slots), dtype=bool)
        for host, idx in self._groups(slots):
            local = (slots[idx] % self.blocks_per_host).tolist()
            values = ([_MARKER] * len(idx) if pages is None
                      else [pages[i].tobytes() for i in idx])
            stored = self._call(host, self.backend.put, host, local, values) if self._live[host] else _FAILED
            if stored is not None:  # None: every value stored
                ok[idx] = self._answer("put", stored, len(idx), _put_ok)
        return ok

    def read(self, slots: np.ndarray) -> Tuple[Optional[np.ndarray], np.ndarray]:
        ok = np.zeros(len(slots), dtype=bool)
        data = None
        if self.page_shape is not None:
            data = np.zeros((len(slots), *self.page_shape), dtype=self.dtype)
            nbytes = data[0].nbytes if len(slots) else 0
        for host, idx in self._groups(slots):
            if not self._live[host]:
                continue
            values = self._call(host, self.backend.get, host, (slots[idx] % self.blocks_per_host).tolist())
            values = self._answer("get", values, len(idx), _got)
            if values is None:
                continue
            for i, value in zip(idx, values):
                if value is None:
                    continue
                if data is None:
                    ok[i] = True
                elif len(value) == nbytes:
                    data[i] = np.frombuffer(value, dtype=self.dtype).reshape(self.page_shape)
                    ok[i] = True
        return data, ok

    def lost_slots(self, slots: np.ndarray) -> np.ndarray:
        return ~self._live[slots // self.blocks_per_host]

    def take_lost(self) -> bool:
        lost, self._newly_lost = self._newly_lost, False
        return lost

    def _call(self, host: int, fn, *args):
        """``fn(*args)``'s answer, or ``_FAILED`` when it raised (a dead host, or a counted backend error)."""
        try:
            return fn(*args)
        except HostDown:
            self._mark_dead(host)
        except Exception as exc:  # a backend bug or server error: this call fails, the cache goes on
            self._error(fn.__name__, exc)
        return _FAILED

    def _answer(self, op: str, answer: object, n: int, parse):
        """``parse(answer, n)`` for a call that answered, else its failed form (``_FAILED`` -> nothing found).

        An answer ``parse`` rejects is a counted backend error, like an exception.
        """
        if answer is not _FAILED:
            try:
                return parse(answer, n)
            except (TypeError, ValueError) as exc:
                self._error(op, exc)
        return None if op == "get" else False

    def _error(self, op: str, exc: BaseException) -> None:
        self.backend_errors += 1
        self.last_backend_error = exc
        if self.backend_errors == 1:
            warnings.warn(f"{self.name}: backend {op} failed ({exc!r}); its pages count as "
                          "misses (RemoteTier.backend_errors counts these)", RuntimeWarning, stacklevel=4)

    def _mark_dead(self, host: int) -> None:
        if self._live[host]:
            self._live[host] = False
            self._newly_lost = True
            self.lost_hosts.append(host)

    def _groups(self, slots: np.ndarray):
        hosts = slots // self.blocks_per_host
        for host in np.unique(hosts):
            yield int(host), np.flatnonzero(hosts == host)

    def _by_host(self, slots: np.ndarray):
        for host, idx in self._groups(slots):
            yield host, slots[idx] % self.blocks_per_host

    def check(self) -> None:
        free = 0
        for pool in self._pools:
            pool.check()
            free += pool.num_free
        assert free + self.used == self.num_hosts * self.blocks_per_host, (
            f"{self.name}: free {free} + used {self.used} != {self.num_hosts * self.blocks_per_host}")

    def close(self) -> None:
        self.backend.close()

