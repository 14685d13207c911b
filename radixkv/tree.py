"""The radix tree: page-aligned token prefixes mapped to opaque block ids.

Edges are compressed: a node holds a run of whole pages (their tokens as raw
bytes, and one block id per page, kept as extents: :mod:`radixkv.extents`);
children are keyed by the bytes of their first page. The tree knows nothing of pools, devices, policies or locks'
meaning: it stores what it is given and keeps the shape valid. Counters and
ownership live in the engine (:mod:`radixkv.cache`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Iterator, KeysView, Optional, Tuple, Union

import numpy as np

from . import extents
from .extents import Parts
from .keys import TOKEN_BYTES, TOKEN_DTYPE


def share(buf: Union[bytes, memoryview], start: int, stop: int) -> Union[bytes, memoryview]:
    """``buf[start:stop]`` for a node to keep: a view of ``buf``'s ``bytes`` where that keeps at most
    twice the slice's size alive, else a copy (``bytes``).

    ``buf`` is ``bytes`` (a request's key, which nothing can change) or a view of
    one that this function made; anything else (a ``bytearray``, a view of
    writable memory) is copied. Why: at page size 1 copying a new leaf's pages
    out of the request's key was an eighth of an admission; a view costs
    O(1), and the 2x rule bounds what a node that shrinks (a split, a tail
    eviction) keeps of the request it came from. O(1) for a view, O(stop - start) for a copy.
    """
    size = stop - start
    if buf.__class__ is bytes:
        if 2 * size >= len(buf) and size < len(buf):
            return memoryview(buf)[start:stop]
        return buf[start:stop]  # (the whole of buf: buf itself)
    if buf.__class__ is memoryview and buf.obj.__class__ is bytes:
        part = buf[start:stop]
        return part if 2 * size >= len(buf.obj) else part.tobytes()
    return bytes(buf[start:stop])


class Node:
    """A run of ``num_pages`` pages hanging below ``parent``.

    The pages' tokens are kept as raw bytes in two parts: ``first`` (the first
    page, which is also the key under which the parent files this node, so it
    is stored once) and ``rest`` (the other pages). ``rest`` may be longer than
    ``num_pages - 1`` pages after a tail eviction; only its leading pages count
    (it is trimmed lazily, so evicting one page from a long leaf is O(1): when
    a walk stops inside the node or when the node gets a child). ``rest`` is
    ``bytes`` or a read-only ``memoryview`` of the immutable ``bytes`` a
    request's key was made into (:func:`share`): a new leaf keeps its pages
    without copying them, and no node keeps more than twice its pages' bytes
    alive that way.
    ``gen`` changes whenever the node's extent changes, and is ``-1`` once the
    node left the tree. ``policy_state`` is the one slot an eviction policy may use.
    ``parts`` holds the pages' block ids as extents (runs and ``int32`` segments,
    :mod:`radixkv.extents`); :attr:`blocks` expands them into an array on demand.
    """

    __slots__ = (
        "parent", "children", "first", "rest", "parts", "start", "num_pages",
        "lock_ref", "gen", "policy_state", "retention", "heap_id", "ext",
    )

    def __init__(self, parent: Optional["Node"], first: bytes, rest: bytes, parts: Parts,
                 start: int, num_pages: int) -> None:
        self.parent = parent
        self.children: Optional[Dict[bytes, Node]] = None
        self.first = first
        self.rest = rest
        self.parts = parts
        self.start = start
        self.num_pages = num_pages
        self.lock_ref = 0
        self.gen = 0
        self.policy_state: Any = None
        self.retention = 0
        self.heap_id = 0
        self.ext: Any = None  # slot for layers above the tree (tier residency)

    @property
    def blocks(self) -> np.ndarray:
        """The block id of each page, in order (a new ``int32`` array). O(pages) C, O(parts) Python."""
        return extents.to_array(self.parts)

    @property
    def last_block(self) -> int:
        """The block id of the node's last page (it has one). O(1)."""
        return extents.last_id(self.parts)

    @property
    def key(self) -> bytes:
        """The tokens of the node's pages as bytes (a new object; may run past ``num_pages``)."""
        return self.first + self.rest

    def page(self, index: int) -> bytes:
        """The bytes of page ``index`` (0-based within this node; a new object unless 0). O(page size)."""
        pb = len(self.first)
        return self.first if index == 0 else bytes(self.rest[(index - 1) * pb : index * pb])

    @property
    def end(self) -> int:
        """Depth in pages of this node's last page (pages from the root through it)."""
        return self.start + self.num_pages

    @property
    def alive(self) -> bool:
        return self.gen >= 0

    def __repr__(self) -> str:
        return f"Node(pages {self.start}..{self.end}, lock_ref={self.lock_ref}, gen={self.gen})"


class Root(Node):
    """The root of one namespace's subtree: no pages, and it knows its ``namespace``.

    Only roots carry the namespace (one slot more than a :class:`Node`), so a
    page's namespace is found by walking up to its root, in O(nodes above it),
    also after the node left the tree (it keeps its parent).
    """

    __slots__ = ("namespace",)

    def __init__(self, namespace: Hashable) -> None:
        super().__init__(None, b"", b"", extents.NONE, 0, 0)
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"Root({self.namespace!r}, lock_ref={self.lock_ref})"


def namespace_of(node: Node) -> Hashable:
    """The namespace of the tree ``node`` is in (its root's key). O(nodes above it).

    Valid for a node that left the tree too: a removed node keeps its parent.
    A lower tier's spill tree is keyed by the engine's namespace roots; its
    nodes get the namespace of that root, so both trees name a page alike.
    """
    while node.parent is not None:
        node = node.parent
    namespace = node.namespace
    return namespace.namespace if isinstance(namespace, Root) else namespace


class RadixTree:
    """Compressed trie of pages; one root per namespace so namespaces never share a page.

    A namespace's root is registered while the engine needs it (it has pages or
    locks) and may be dropped when it holds neither (:meth:`discard_root`), so an
    unused namespace costs nothing. A :class:`Root` outside the registry (from
    :meth:`empty_root`, or dropped) stands for the same empty prefix: the
    engine registers it (:meth:`adopt`) before it hangs anything below it.
    """

    __slots__ = ("page_size", "page_bytes", "_roots", "on_root_emptied")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.page_bytes = page_size * TOKEN_BYTES
        self._roots: Dict[Hashable, Root] = {}
        self.on_root_emptied: Optional[Callable[[Root], None]] = None
        """Called with a root whose last child :meth:`truncate` removed (the owner may drop it)."""

    def root(self, namespace: Hashable = None) -> Root:
        """The registered root of ``namespace``'s subtree, created on first use. O(1)."""
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = Root(namespace)
        return root

    def find_root(self, namespace: Hashable) -> Optional[Root]:
        """The registered root of ``namespace``, or ``None`` when it holds nothing; creates nothing. O(1)."""
        return self._roots.get(namespace)

    def namespaces(self) -> KeysView:
        """A live view of the namespaces that have a registered root. O(1)."""
        return self._roots.keys()

    def empty_root(self, namespace: Hashable) -> Root:
        """An empty root of ``namespace`` that is not registered (what a match in an unused namespace
        returns a handle to). O(1)."""
        return Root(namespace)

    def adopt(self, root: Root) -> Root:
        """The registered root of ``root.namespace``: ``root`` itself, registered now if there was none. O(1)."""
        current = self._roots.get(root.namespace)
        if current is None:
            current = self._roots[root.namespace] = root
        return current

    def discard_root(self, root: Root) -> None:
        """Unregister ``root`` (the caller checked that it has no pages and no locks). O(1)."""
        if self._roots.get(root.namespace) is root:
            del self._roots[root.namespace]

    @property
    def num_roots(self) -> int:
        """Registered roots (namespaces with pages or locks). O(1)."""
        return len(self._roots)

    def roots(self) -> Iterator[Tuple[Hashable, Root]]:
        """``(namespace, root)`` of every registered root (a snapshot: safe to change the tree meanwhile)."""
        return iter(list(self._roots.items()))

    def walk(self, root: Node, data: bytes, num_pages: int) -> Tuple[Node, int, Optional[Node], int]:
        """Follow ``data`` (``num_pages`` whole pages) down from ``root`` without changing anything.

        Returns ``(node, pages, child, common)``: ``node`` is the deepest node
        matched whole, ``pages`` the pages matched through it, and ``child``
        the next node when it matched only its first ``common`` pages (else
        ``None`` and 0). Cost: one dict lookup per node plus a C-speed bytes
        comparison per edge, in place; a partial edge costs one numpy comparison.
        """
        pb = self.page_bytes
        end = num_pages * pb
        node, off = root, 0  # off: bytes of data matched so far
        while off < end:
            children = node.children
            if children is None:
                break
            first_end = off + pb
            child = children.get(data[off:first_end])
            if child is None:
                break
            # The dict lookup matched the first page; compare the rest in place (startswith
            # copies nothing, where a slice of data would copy the whole edge).
            n = child.num_pages
            rest = child.rest
            if data.startswith(rest, first_end, end):  # (stale tail bytes may match too: harmless)
                node, off = child, first_end + (n - 1) * pb
                continue
            rlen = (n - 1) * pb
            if len(rest) != rlen:  # stale bytes of evicted tail pages: drop them, compare again
                rest = child.rest = share(rest, 0, rlen)
                if data.startswith(rest, first_end, end):
                    node, off = child, first_end + rlen
                    continue
            pos = off // pb
            limit = min(n, num_pages - pos) - 1
            return node, pos, child, 1 + self._common_pages(rest, data, first_end, limit)
        return node, off // pb, None, 0

    def _common_pages(self, key: bytes, data: bytes, off: int, limit: int) -> int:
        """Leading whole pages on which ``key`` and ``data[off:]`` agree (at most ``limit``)."""
        count = limit * self.page_size
        a = np.frombuffer(key, dtype=TOKEN_DTYPE, count=count)
        b = np.frombuffer(data, dtype=TOKEN_DTYPE, count=count, offset=off)
        diff = np.flatnonzero(a != b)
        return (int(diff[0]) if len(diff) else count) // self.page_size

    def split(self, child: Node, pages: int) -> Node:
        """Cut ``child`` after its first ``pages`` pages; return the new upper node.

        ``child`` keeps its end (so handles to it still mean the same pages) and
        its subtree; the new node takes its place under the parent and copies
        its lock count, retention and policy state. O(pages of child).
        """
        pb = self.page_bytes
        parent = child.parent
        rest = child.rest
        cut = (pages - 1) * pb  # the upper node's share of ``rest``
        upper_parts, child.parts = extents.cut(child.parts, pages)
        upper = Node(parent, child.first, share(rest, 0, cut), upper_parts, child.start, pages)
        upper.lock_ref = child.lock_ref
        upper.retention = child.retention
        upper.policy_state = child.policy_state
        first = bytes(rest[cut : cut + pb])
        upper.children = {first: child}
        parent.children[child.first] = upper
        child.parent = upper
        child.first = first
        child.rest = share(rest, cut + pb, (child.num_pages - 1) * pb)
        child.start += pages
        child.num_pages -= pages
        return upper

    def add_leaf(self, parent: Node, key: bytes, blocks: Union[np.ndarray, Parts], offset: int = 0) -> Node:
        """Hang a new node below ``parent`` holding ``blocks`` (an id array, which the tree keeps
        and marks read-only, or a tuple of extents), one page per block, whose tokens are
        ``key``'s bytes from ``offset`` on (a request's whole key may be passed: only its pages
        are kept, as a view of ``key`` or a copy: :func:`share`)."""
        if blocks.__class__ is tuple:
            parts, n = blocks, extents.size(blocks)
            for part in parts:  # id segments are the tree's from now on too
                if part.__class__ is not tuple:
                    part.flags.writeable = False
        else:
            blocks.flags.writeable = False  # the tree's from now on
            parts, n = ((blocks,) if len(blocks) else extents.NONE), len(blocks)
        pb = self.page_bytes
        first = bytes(key[offset : offset + pb])  # a dict key (and a bytes slice is bytes already)
        leaf = Node(parent, first, share(key, offset + pb, offset + n * pb), parts, parent.end, n)
        if parent.children is None:
            parent.children = {}
            rlen = (parent.num_pages - 1) * pb
            if len(parent.rest) > rlen:  # a leaf's stale tail bytes go when it stops being a leaf
                parent.rest = share(parent.rest, 0, rlen)
        parent.children[first] = leaf
        return leaf

    def truncate(self, node: Node, pages: int) -> Parts:
        """Drop the last ``pages`` pages of leaf ``node``; return their blocks as extents.

        The node leaves the tree when it has no page left. O(parts) Python work, none per page
        (a leaf whose pages are a view of a request's key that it would now keep more than
        twice of copies what it keeps instead, once: :func:`share`).
        """
        keep = node.num_pages - pages
        node.parts, removed = extents.cut_tail(node.parts, pages)
        node.gen += 1
        if keep == 0:
            parent = node.parent
            del parent.children[node.first]
            if not parent.children:
                parent.children = None
                if parent.parent is None and self.on_root_emptied is not None:
                    self.on_root_emptied(parent)
            node.gen = -1
            node.num_pages = 0
        else:
            node.num_pages = keep
            rest = node.rest
            if rest.__class__ is memoryview and 2 * (keep - 1) * self.page_bytes < len(rest.obj):
                node.rest = rest[: (keep - 1) * self.page_bytes].tobytes()  # (2x rule: once per view)
        return removed

    def path_blocks(self, node: Node) -> np.ndarray:
        """Block ids of every page from the root through ``node``, in order (a new array).
        O(depth + parts) Python, O(pages) C."""
        return extents.to_array(self.path_parts(node))

    @staticmethod
    def path_parts(node: Node) -> Parts:
        """The extents of every page from the root through ``node``, in order. O(depth + parts), no per-page work."""
        groups = []
        while node.parent is not None:
            groups.append(node.parts)
            node = node.parent
        groups.reverse()
        return extents.join(groups)

    def nodes(self) -> Iterator[Node]:
        """Every non-root node, parents before children."""
        for _, root in self.roots():
            stack = list(root.children.values()) if root.children else []
            while stack:
                node = stack.pop()
                yield node
                if node.children:
                    stack.extend(node.children.values())

    def check(self) -> None:
        """O(n) structural check; raises AssertionError naming what broke."""
        pb = self.page_bytes
        for ns, root in self.roots():
            assert root.parent is None and root.num_pages == 0, f"root of {ns!r} is malformed"
            assert isinstance(root, Root) and root.namespace == ns, f"root {root!r} registered under {ns!r}"
            stack = [root]
            while stack:
                node = stack.pop()
                if node.children is None:
                    continue
                assert node.children, f"{node} has an empty children dict (must be None)"
                child_locks = 0
                for first, child in node.children.items():
                    assert child.parent is node, f"{child} does not point back to its parent {node}"
                    assert child.alive, f"dead {child} still linked under {node}"
                    assert child.num_pages >= 1, f"{child} has no pages"
                    extents.check(child.parts)
                    blocks = extents.size(child.parts)
                    assert blocks == child.num_pages, f"{child} has {blocks} blocks"
                    assert len(child.first) == pb, f"{child} first page is {len(child.first)} bytes"
                    assert len(child.rest) >= (child.num_pages - 1) * pb, f"{child} key shorter than its pages"
                    if child.rest.__class__ is memoryview:
                        base = child.rest.obj
                        assert base.__class__ is bytes and child.rest.readonly, f"{child} views mutable memory"
                        assert 2 * (child.num_pages - 1) * pb >= len(base), f"{child} keeps over 2x its key alive"
                    assert child.first == first, f"{child} is filed under the wrong first page"
                    assert child.start == node.end, f"{child} starts at {child.start}, parent ends at {node.end}"
                    assert child.lock_ref >= 0, f"{child} has negative lock_ref"
                    child_locks += child.lock_ref
                    stack.append(child)
                if node.parent is not None:
                    assert node.lock_ref >= child_locks, (
                        f"{node} lock_ref {node.lock_ref} below its children's {child_locks}"
                    )
