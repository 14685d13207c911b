"""An exact LRU bound on one Redis server, kept by the server itself: ``redis://HOST:PORT?capacity=PAGES``.

Redis's own ``maxmemory`` eviction is approximate: it samples a few keys
(``maxmemory-samples``) and compares their last access on a clock of about
one second. A fleet turns its store over every few seconds, so that clock
cannot order the pages, and pages written in the same second leave at random:
holes in chains, and a store serves a chain only up to its first hole. On the
Mooncake conversation trace (4 instances x 62,500 blocks, a 250,000-page
store) that cost the processes' fleet 0.7 points against the in-process
store's exact LRU.

So a store opened with a capacity keeps the order itself, in three Lua
scripts that run atomically on the server (one round trip each, as before):
every page key is a member of one sorted set (:data:`ORDER_KEY`) scored by the
time of its last use, counted in uses: a stamp continues from the set's highest
score (``ZRANGE -1 -1``, O(log n)), so the set is the only key besides the
pages, and one lost or deleted (an operator's ``DEL``, a ``maxmemory`` policy on
top evicting it as it evicts any key) takes no clock with it that would make new
pages older than the ones already held. A read stamps
the pages it finds; a write stamps the pages it adds, then evicts the lowest
scores past the capacity (``ZPOPMIN`` and ``UNLINK``). A call stamps its pages
last first, so a chain's deeper pages are older than the ones they extend and
leave first: eviction shortens the least recently used chains from their
ends, and never strands a page behind a missing parent. The order is exactly
:class:`~radixkv.store.backends.MemoryBackend`'s, so processes sharing the
server in a deterministic order evict exactly what one process's in-process
store would. Every process opening the server must give the same capacity:
the last writer's bound is the one applied.

The set is an order, not an index: a page is still present exactly when its
key is, so a member whose key is gone (deleted by someone else) only leaves
early when its turn comes, and a key that is in no set (written without a
capacity, or held when the set was deleted) is never evicted by one until a
bounded read finds it and puts it back in the order. Cost per page: a ``ZADD`` (O(log n)) on
each read and write, and about 100 bytes of server memory for its member.
The server must allow scripts (``EVAL``); a Redis Cluster cannot run them
over keys of many slots, so a capacity needs a single server.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

ORDER_KEY = b"radixkv:lru"
"""The sorted set of every bounded page, least recently used first (its score counts the page uses before its
last one). No page key can equal it: page keys are a prefix and 32 bytes of hash."""

_STAMP = """
local function stamp(order, keys, call)
  if #keys == 0 then return end
  local top = redis.call('ZRANGE', order, -1, -1, 'WITHSCORES')
  local now = 0
  if top[2] then now = tonumber(top[2]) end
  local args = {}
  for i = #keys, 1, -1 do
    args[#args + 1] = now + #keys - i + 1
    args[#args + 1] = keys[i]
    if #args >= 1000 then call('ZADD', order, unpack(args)); args = {} end
  end
  if #args > 0 then call('ZADD', order, unpack(args)) end
end
"""

GET_SCRIPT = _STAMP + """
local order, held = KEYS[1], tonumber(ARGV[1])
local used, values = {}, {}
for i = 2, 1 + held do
  if redis.call('EXISTS', KEYS[i]) == 1 then used[#used + 1] = KEYS[i] end
end
for i = 2 + held, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) == 'table' then v = false end
  values[#values + 1] = v
  if v then used[#used + 1] = KEYS[i] end
end
stamp(order, used, redis.pcall)  -- a stamp refused (OOM at maxmemory) must not fail the read
return values
"""
"""KEYS: order, the held pages to touch, then the pages to read; ARGV: how many are held. Returns the
values read (nil for absent ones, and for a key holding no string: missing, as ``MGET`` answers, rather
than an error that fails the whole chain). A stamp the server refuses (``OOM`` at ``maxmemory`` under
``noeviction``) leaves the order as it was and the read served, as ``MGET`` serves it. The held pages that exist and the read pages found become the most
recently used, the last of them first (as :meth:`MemoryBackend.get`): a chain's root is its newest page."""

SET_SCRIPT = _STAMP + """
local order, capacity = KEYS[1], tonumber(ARGV[1])
local stored, added = {}, {}
for i = 2, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[i], 'NX') then
    stored[#stored + 1] = 1
    added[#added + 1] = KEYS[i]
  else
    stored[#stored + 1] = 0
  end
end
stamp(order, added, redis.call)
local evicted = 0
local excess = redis.call('ZCARD', order) - capacity
if excess > #added + 1000 then excess = #added + 1000 end  -- far over the bound: come down over several writes
while excess > 0 do
  local popped = redis.call('ZPOPMIN', order, math.min(excess, 500))
  local victims = {}
  for i = 1, #popped, 2 do victims[#victims + 1] = popped[i] end
  redis.call('UNLINK', unpack(victims))
  evicted = evicted + #victims
  excess = excess - #victims
end
stored[#stored + 1] = evicted
return stored
"""
"""KEYS: order, the pages; ARGV: the capacity, then one value per page. Sets each absent page (first
writer wins), makes the new ones the most recently used, then evicts the least recently used past the
capacity: at most 1,000 pages more than it added, so a server far over the bound (a store opened with a
smaller capacity than the one that filled it, or pages a read found outside the order) comes down over
several writes rather than blocking every client for one (250,000 pages took longer than the 0.25 s
timeout; the write, done, counted as failed). Under one consistent capacity a write never has more to
evict than it added. Returns 1/0 per page (stored or there already), then the number evicted."""

DELETE_SCRIPT = """
for i = 2, #KEYS do
  redis.call('UNLINK', KEYS[i])
  redis.call('ZREM', KEYS[1], KEYS[i])
end
return #KEYS - 1
"""
"""KEYS: order, then the pages: deletes them and their places in the order."""


def get(client: Any, keys: Sequence[bytes], held: Sequence[bytes]) -> List[Any]:
    """The values of ``keys`` (``None`` when absent), stamping ``held`` and the found ``keys``. One round trip."""
    return client.eval(GET_SCRIPT, 1 + len(held) + len(keys), ORDER_KEY, *held, *keys, len(held))


def set_nx(client: Any, keys: Sequence[bytes], values: Sequence[bytes], capacity: int) -> Tuple[List[bool], int]:
    """Store each absent page and evict past ``capacity``: ``(stored per page, pages evicted)``. One round trip."""
    reply = client.eval(SET_SCRIPT, 1 + len(keys), ORDER_KEY, *keys, capacity, *values)
    return [bool(r) for r in reply[:-1]], int(reply[-1])


def delete(client: Any, keys: Sequence[bytes]) -> None:
    """Delete ``keys`` and their places in the order. One round trip."""
    client.eval(DELETE_SCRIPT, 1 + len(keys), ORDER_KEY, *keys)


def held_pages(client: Any) -> List[bytes]:
    """The bounded pages, least recently used first (for tests and inspection). One round trip, O(n)."""
    return list(client.zrange(ORDER_KEY, 0, -1))
