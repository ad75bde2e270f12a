"""ByteBudgetLRU: a least-recently-used cache bounded by the bytes of what it holds, not by a count of items."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from engine.core.checks import check_int
from engine.datasets.sizes import sizeof

__all__ = ["ByteBudgetLRU", "sizeof"]

_MISSING = object()


class ByteBudgetLRU:
    """A least-recently-used cache that holds at most ``max_bytes`` of values (sizes from :func:`sizeof`).

    ``put`` evicts the least recently used items until the new one fits; an item larger than the whole budget
    is not cached (and counted under ``rejected``). ``get`` refreshes an item's recency and counts a hit or a miss.
    Operations take a lock, so threads of one process (e.g. a main-process loader and a pin-memory thread) may
    share a cache. Values that view one buffer (the rows of one read) can be cached without a copy each with
    :meth:`put_shared`.

    A cache lives in one process: each DataLoader worker holds its own (so ``num_workers`` workers may hold
    up to ``num_workers * max_bytes``), and pickling a cache (as spawn does to send a dataset to a worker)
    gives an empty cache with the same budget and zeroed counters.

    Args:
        max_bytes: The byte budget, >= 0 (0 caches nothing).

    Example:
        >>> cache = ByteBudgetLRU(8)
        >>> for key, value in [("a", b"1234"), ("b", b"5678"), ("c", b"90")]:
        ...     _ = cache.put(key, value)
        >>> "a" in cache, cache.get("b"), cache.nbytes, cache.stats()["evictions"]
        (False, b'5678', 6, 1)
    """

    def __init__(self, max_bytes: int) -> None:
        check_int("max_bytes", max_bytes, minimum=0, hint=" (a byte budget)")
        self.max_bytes = max_bytes
        # Values and sizes in two maps, not a (value, size) tuple per entry: one object fewer per cached row for
        # the garbage collector to track.
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self._shared: dict[Hashable, _SharedBuffer] = {}  # key -> the buffer its value views (put_shared)
        self._lock = threading.Lock()
        self._nbytes = 0
        self.hits = self.misses = self.evictions = self.rejected = 0

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value under ``key`` (now the most recently used), or ``default``; counts a hit or a miss."""
        with self._lock:
            value = self._items.get(key, _MISSING)
            if value is _MISSING:
                self.misses += 1
                return default
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def get_many(self, keys: Sequence[Hashable]) -> list[Any]:
        """``[get(key) for key in keys]`` (None for a miss) under one lock: a batch's lookups at once."""
        items = self._items
        with self._lock:
            found = list(map(items.get, keys))
            hits = len(found) - found.count(None)
            if hits:  # refresh recency in the order asked, as get() one by one would
                move_to_end = items.move_to_end
                for key, value in zip(keys, found):
                    if value is not None:
                        move_to_end(key)
            self.hits += hits
            self.misses += len(found) - hits
        return found

    def put(self, key: Hashable, value: Any, nbytes: int | None = None) -> bool:
        """Cache ``value`` under ``key``, evicting least recently used items to stay within the budget.

        Args:
            key: Any hashable key; an existing entry under it is replaced.
            value: The value to hold.
            nbytes: Its size when the caller knows it; default :func:`sizeof` of ``value``.

        Returns:
            Whether the value was cached (False when it alone exceeds ``max_bytes``).
        """
        size = sizeof(value) if nbytes is None else int(nbytes)
        with self._lock:
            return self._put(key, value, size)

    def put_many(self, items: Sequence[tuple[Hashable, Any]], sizes: Sequence[int] | None = None) -> None:
        """``put(key, value)`` for each pair, in order, under one lock; ``sizes`` their sizes when the caller
        knows them (default :func:`sizeof` of each value)."""
        sizes = [sizeof(value) for _, value in items] if sizes is None else [int(size) for size in sizes]
        keys = [key for key, _ in items]
        with self._lock:
            total = sum(sizes)
            if self._nbytes + total <= self.max_bytes and len(set(keys)) == len(keys) and \
                    self._items.keys().isdisjoint(keys):  # new keys that all fit: no eviction, insert at once
                self._items.update(items)
                self._sizes.update(zip(keys, sizes))
                self._nbytes += total
                return
            for (key, value), size in zip(items, sizes):
                self._put(key, value, size)

    def put_shared(self, items: Sequence[tuple[Hashable, Any]], own: Callable[[Any], Any],
                   sizes: Sequence[int] | None = None) -> None:
        """Cache values that view one shared buffer (such as the rows of one read), without copying them.

        Each value counts its own bytes (``sizes``, default :func:`sizeof`), which together must be the bytes of
        the buffer. The buffer lives while any of its values is held, so as soon as one of them leaves the cache
        (evicted or replaced), every other one still held is replaced, in place and at the same recency, by
        ``own(value)``: a copy holding its own bytes only, of the same size. So the bytes counted are the bytes
        held, whatever is evicted; only rows that outlive a neighbour pay for a copy.

        Args:
            items: ``(key, value)`` pairs whose values view one buffer.
            own: Returns a value equal to its argument that holds its own memory (e.g. clones its tensors).
            sizes: The values' sizes when the caller knows them.
        """
        sizes = [sizeof(value) for _, value in items] if sizes is None else sizes
        buffer = _SharedBuffer(own)
        with self._lock:
            for (key, value), size in zip(items, map(int, sizes)):
                if buffer.split:  # a value of this buffer has left already: the rest are cached as copies
                    self._put(key, own(value), size)
                elif not self._put(key, value, size):  # too big to hold, but its bytes would live on in the buffer
                    self._split(buffer)
                elif buffer.split:  # this put evicted (or replaced) a value of the same buffer
                    self._items[key] = own(value)
                else:
                    self._shared[key] = buffer
                    buffer.keys.append(key)

    def _put(self, key: Hashable, value: Any, size: int) -> bool:
        if key in self._items:
            del self._items[key]
            self._nbytes -= self._sizes.pop(key)
            self._leave(key)
        if size > self.max_bytes:
            self.rejected += 1
            return False
        while self._nbytes + size > self.max_bytes:
            evicted_key, _ = self._items.popitem(last=False)
            self._nbytes -= self._sizes.pop(evicted_key)
            self.evictions += 1
            self._leave(evicted_key)
        self._items[key] = value
        self._sizes[key] = size
        self._nbytes += size
        return True

    def _leave(self, key: Hashable) -> None:
        """``key`` left the cache: if its value viewed a shared buffer, the others still held get their own copy."""
        buffer = self._shared.pop(key, None)
        if buffer is not None:
            self._split(buffer)

    def _split(self, buffer: _SharedBuffer) -> None:
        """Replace each value still held of ``buffer`` by its own copy, so that the buffer can be freed."""
        if buffer.split:
            return
        buffer.split = True
        items, shared = self._items, self._shared
        for key in buffer.keys:
            if shared.get(key) is buffer:
                del shared[key]
                items[key] = buffer.own(items[key])  # an existing key keeps its place in the order

    def __contains__(self, key: Hashable) -> bool:
        """Membership without touching recency or counters."""
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes held now (always <= ``max_bytes``)."""
        return self._nbytes

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used (the next eviction first)."""
        with self._lock:
            return list(self._items)

    def clear(self) -> None:
        """Drop every item; the counters are kept."""
        with self._lock:
            self._items.clear()
            self._sizes.clear()
            self._shared.clear()
            self._nbytes = 0

    def reset_stats(self) -> None:
        """Zero the hit, miss, eviction and rejection counters."""
        with self._lock:
            self.hits = self.misses = self.evictions = self.rejected = 0

    def stats(self) -> dict[str, Any]:
        """Counters and occupancy: hits, misses, hit_rate, evictions, rejected, items, nbytes, max_bytes."""
        with self._lock:
            lookups = self.hits + self.misses
            return {
                "hits": self.hits,
                "misses": self.misses,
                "hit_rate": self.hits / lookups if lookups else 0.0,
                "evictions": self.evictions,
                "rejected": self.rejected,
                "items": len(self._items),
                "nbytes": self._nbytes,
                "max_bytes": self.max_bytes,
            }

    def __getstate__(self) -> dict[str, Any]:
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["max_bytes"])

    def __repr__(self) -> str:
        return f"ByteBudgetLRU(max_bytes={self.max_bytes}, items={len(self)}, nbytes={self.nbytes})"


class _SharedBuffer:
    """The keys whose cached values view one buffer (one :meth:`ByteBudgetLRU.put_shared` call), how to copy
    one of them out, and whether one has left (after which every value of it is held as a copy)."""

    __slots__ = ("keys", "own", "split")

    def __init__(self, own: Callable[[Any], Any]) -> None:
        self.keys: list[Hashable] = []
        self.own = own
        self.split = False
