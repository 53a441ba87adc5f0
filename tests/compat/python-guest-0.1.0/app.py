"""A txstore strategy in Python: the "buffered" design (KIP-892, with the
committed offset kept in the store itself as in KIP-1035).

Uncommitted writes wait in guest memory, in a dict that maps a key to its
new value or to None for a delete. Nothing uncommitted ever reaches storage,
so a crash loses the dict and nothing else: `commit` is ONE synced, atomic
storage write holding the data and the new offset, and `recover` only reads
the offset back.

Storage layout:
  keyspace `data`  the committed state C
  keyspace `meta`  b"committed-offset" -> the offset as a big-endian u64

Built with componentize-py against ../../wit (world `store`); see build.sh.
"""

from bisect import bisect_left
from typing import Dict, Iterator, List, Optional, Tuple

import wit_world
from componentize_py_types import Err
from wit_world.exports.state_store import Isolation, Recovery, RecoveryAction
from wit_world.imports import storage
from wit_world.imports.storage import KeyspaceOps, Op_Delete, Op_Put
from wit_world.imports.types import (
    Entry,
    Error_Corrupt,
    Error_InvalidArgument,
    Error_Other,
    Error_UncommittedLimit,
)

NAME = "python-guest"
OFFSET_KEY = b"committed-offset"
# Counted per buffered key on top of its key and value bytes.
ENTRY_OVERHEAD = 64
DEFAULT_LIMIT = 64 << 20
U64_MAX = (1 << 64) - 1
# Entries asked of a storage cursor per call (the host caps it at 4096).
CURSOR_BATCH = 1024

# A buffered write: the new value, or None for a delete.
Write = Tuple[bytes, Optional[bytes]]


def cost(key: bytes, value: Optional[bytes]) -> int:
    return len(key) + (len(value) if value is not None else 0) + ENTRY_OVERHEAD


def fail(error) -> Err:
    """The WIT `error` variant as the exception componentize-py returns."""
    return Err(error)


def parse_byte_count(text: str) -> int:
    # As strict as Rust's u64 parsing: ASCII digits only (an optional '+'),
    # no sign, spaces or underscores that Python's int() would accept.
    digits = text[1:] if text.startswith("+") else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        raise ValueError(text)
    n = int(digits)
    if n > U64_MAX:
        raise ValueError(text)
    return n


def scan(keyspace: storage.Keyspace, start: Optional[bytes], end: Optional[bytes],
         batch: int = CURSOR_BATCH) -> Iterator[Entry]:
    """The entries of [start, end) in key order, fetched `batch` at a time.
    The cursor resource is dropped when the generator ends or is closed."""
    with keyspace.scan(start, end) as cursor:
        while True:
            page = cursor.next(batch)
            if not page:
                return
            yield from page


class Store:
    def __init__(self, limit: int) -> None:
        self.data = storage.Keyspace.open("data")
        self.meta = storage.Keyspace.open("meta")
        self.limit = limit
        # U: key -> value, or None for a delete.
        self.buffer: Dict[bytes, Optional[bytes]] = {}
        # The buffer's keys in order, rebuilt lazily after a new key.
        self.sorted_keys: Optional[List[bytes]] = None
        self.bytes = 0
        # Set when a commit's write failed after the buffer was given up:
        # nothing works until `recover`.
        self.poisoned = False

    # -- state ----------------------------------------------------------

    def usable(self) -> None:
        if self.poisoned:
            raise fail(Error_Other(f"{NAME}: a commit failed; recover before using this store"))

    def reset(self) -> None:
        self.buffer = {}
        self.sorted_keys = None
        self.bytes = 0
        self.poisoned = False

    def read_offset(self) -> Optional[int]:
        raw = self.meta.get(OFFSET_KEY)
        if raw is None:
            return None
        if len(raw) != 8:
            raise fail(Error_Corrupt(
                f"{NAME}: value under {OFFSET_KEY.decode()} has {len(raw)} bytes, expected 8"))
        return int.from_bytes(raw, "big")

    # -- writes ---------------------------------------------------------

    def add(self, writes: List[Write]) -> None:
        """Buffers `writes` in order, all or nothing."""
        self.usable()
        # The exact count after the call: the last write of each key wins
        # and replaces whatever the buffer held for it.
        final: Dict[bytes, Optional[bytes]] = {}
        for key, value in writes:
            final[key] = value
        after = self.bytes
        for key, value in final.items():
            if key in self.buffer:
                after -= cost(key, self.buffer[key])
            after += cost(key, value)
        if self.buffer and after > self.limit:
            raise fail(Error_UncommittedLimit(self.limit))
        if self.sorted_keys is not None and any(k not in self.buffer for k in final):
            self.sorted_keys = None
        self.buffer.update(final)
        self.bytes = after

    # -- reads ----------------------------------------------------------

    def get(self, key: bytes, isolation: Isolation) -> Optional[bytes]:
        self.usable()
        if isolation == Isolation.READ_UNCOMMITTED and key in self.buffer:
            return self.buffer[key]
        return self.data.get(key)

    def get_many(self, keys: List[bytes], isolation: Isolation) -> List[Optional[bytes]]:
        self.usable()
        if isolation == Isolation.READ_COMMITTED:
            return self.data.get_many(keys)
        misses = [k for k in keys if k not in self.buffer]
        stored = iter(self.data.get_many(misses) if misses else [])
        return [self.buffer[k] if k in self.buffer else next(stored) for k in keys]

    def range(self, start: Optional[bytes], end: Optional[bytes],
              isolation: Isolation, limit: int) -> List[Entry]:
        if start is not None and end is not None and start > end:
            raise fail(Error_InvalidArgument(f"{NAME}: range start is after its end"))
        self.usable()
        if limit == 0:
            return []
        batch = min(limit, CURSOR_BATCH)
        if isolation == Isolation.READ_COMMITTED:
            out: List[Entry] = []
            base = scan(self.data, start, end, batch)
            try:
                for entry in base:
                    out.append(entry)
                    if len(out) == limit:
                        break
            finally:
                base.close()
            return out
        return self.merged_range(start, end, limit, batch)

    def overlay(self, start: Optional[bytes], end: Optional[bytes]) -> Iterator[bytes]:
        """The buffer's keys in [start, end), in order."""
        if self.sorted_keys is None:
            self.sorted_keys = sorted(self.buffer)
        keys = self.sorted_keys
        i = 0 if start is None else bisect_left(keys, start)
        while i < len(keys) and (end is None or keys[i] < end):
            yield keys[i]
            i += 1

    def merged_range(self, start: Optional[bytes], end: Optional[bytes],
                     limit: int, batch: int) -> List[Entry]:
        """C + U over [start, end): the buffer wins on equal keys and its
        deletes hide the stored key."""
        out: List[Entry] = []
        base = scan(self.data, start, end, batch)
        try:
            stored = next(base, None)
            pending = self.overlay(start, end)
            key = next(pending, None)
            while len(out) < limit and (stored is not None or key is not None):
                if key is None or (stored is not None and stored.key < key):
                    out.append(stored)
                    stored = next(base, None)
                    continue
                if stored is not None and stored.key == key:
                    stored = next(base, None)
                value = self.buffer[key]
                if value is not None:
                    out.append(Entry(key, value))
                key = next(pending, None)
        finally:
            base.close()
        return out

    # -- commit and recovery -------------------------------------------

    def commit(self, offset: int) -> None:
        self.usable()
        ops = [Op_Put(Entry(k, v)) if v is not None else Op_Delete(k)
               for k, v in sorted(self.buffer.items())]
        # Give the buffer up before the write: if the write fails, what it
        # held is neither in memory nor (as far as we know) on disk.
        self.reset()
        self.poisoned = True
        storage.write([
            KeyspaceOps(self.data, ops),
            KeyspaceOps(self.meta, [Op_Put(Entry(OFFSET_KEY, offset.to_bytes(8, "big")))]),
        ], True)
        self.poisoned = False

    def recover(self, checkpointed: Optional[int]) -> Recovery:
        self.reset()
        stored = self.read_offset()
        if checkpointed is not None and (stored is None or checkpointed > stored):
            raise fail(Error_Corrupt(
                f"{NAME}: the checkpoint says offset {checkpointed} "
                f"but the store committed only {stored}"))
        action = RecoveryAction.CLEAN if checkpointed == stored else RecoveryAction.DISCARDED
        return Recovery(stored, action)


# The single store of this instance, set by `init`.
_store: Optional[Store] = None


def store() -> Store:
    if _store is None:
        raise fail(Error_Other(f"{NAME}: init was not called"))
    return _store


class StateStore(wit_world.exports.StateStore):
    """The exported interface: thin calls into the module's Store."""

    def init(self, options: List[Tuple[str, str]]) -> None:
        global _store
        limit = DEFAULT_LIMIT
        for name, value in options:
            if name != "max_uncommitted_bytes":
                raise fail(Error_InvalidArgument(
                    f"{NAME}: unknown option `{name}` (known: max_uncommitted_bytes)"))
            try:
                limit = parse_byte_count(value)
            except ValueError:
                raise fail(Error_InvalidArgument(
                    f"{NAME}: max_uncommitted_bytes `{value}` is not a byte count")) from None
        _store = Store(limit)

    def transactional(self) -> bool:
        return True

    def recover(self, checkpointed: Optional[int]) -> Recovery:
        return store().recover(checkpointed)

    def get(self, key: bytes, isolation: Isolation) -> Optional[bytes]:
        return store().get(key, isolation)

    def get_many(self, keys: List[bytes], isolation: Isolation) -> List[Optional[bytes]]:
        return store().get_many(keys, isolation)

    def range(self, start: Optional[bytes], end: Optional[bytes],
              isolation: Isolation, limit: int) -> List[Entry]:
        return store().range(start, end, isolation, limit)

    def put(self, key: bytes, value: bytes) -> None:
        store().add([(key, value)])

    def delete(self, key: bytes) -> None:
        store().add([(key, None)])

    def put_many(self, entries: List[Entry]) -> None:
        store().add([(e.key, e.value) for e in entries])

    def delete_many(self, keys: List[bytes]) -> None:
        store().add([(k, None) for k in keys])

    def commit(self, offset: int) -> None:
        store().commit(offset)

    def committed_offset(self) -> Optional[int]:
        return store().read_offset()

    def approximate_uncommitted_bytes(self) -> int:
        return _store.bytes if _store is not None else 0
