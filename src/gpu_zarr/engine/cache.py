"""A bounded LRU cache of decoded chunks, owned by the runtime.

Viewers read neighbouring planes one at a time; with chunks thicker than one plane, each
plane would decode the same chunks again. Reads that ask for it (lazy arrays do) keep each
decoded chunk here, keyed by where its bytes are on disk (file, offset, size, mtime), so a
chunk rewritten on disk is never served stale. Entries live in device memory on the GPU
path and host memory on the CPU twin; the oldest go first when the budget is reached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["ChunkCache"]


class ChunkCache:
    """Decoded chunks by key, at most ``capacity`` bytes (LRU)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> Any:
        """The cached chunk, or None (and a miss is counted)."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item

    def get_many(self, keys: list[Hashable | None]) -> list[Any]:
        """The cached chunk of each key (None for a miss or a None key), under one lock: a plane
        of 64^3 chunks asks for a thousand."""
        out: list[Any] = []
        asked = hits = 0
        with self._lock:
            items = self._items
            for key in keys:
                item = items.get(key) if key is not None else None
                asked += key is not None
                if item is not None:
                    items.move_to_end(key)
                    hits += 1
                out.append(item)
            self.hits += hits
            self.misses += asked - hits
        return out

    def put(self, key: Hashable, chunk: Any) -> None:
        """Keep ``chunk``; evict the least recently used until it fits (a chunk larger than
        the whole cache is not kept)."""
        size = int(chunk.nbytes)
        if size > self.capacity:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= int(old.nbytes)
            while self._items and self.nbytes + size > self.capacity:
                _, gone = self._items.popitem(last=False)
                self.nbytes -= int(gone.nbytes)
            self._items[key] = chunk
            self.nbytes += size

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0

    def report(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._items), "bytes": self.nbytes, "capacity": self.capacity,
                    "hits": self.hits, "misses": self.misses}
