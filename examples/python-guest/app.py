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

Built with componentize-py against ../../wit (txstore:store@0.2.0, world
`store`); see build.sh. Keys, pages of entries and batches cross the
boundary packed (one byte buffer and its string ends): `unpack` and `pack`
below are the only places that know the layout.
"""

from bisect import bisect_left
from typing import Dict, Iterator, List, Optional, Tuple

import wit_world
from componentize_py_types import Err
from wit_world.exports.state_store import Isolation, Recovery, RecoveryAction
from wit_world.imports import storage
from wit_world.imports.storage import KeyspaceOps, Op_DeleteMany, Op_Put, Op_PutMany
from wit_world.imports.types import (
    Entry,
    Error_Corrupt,
    Error_InvalidArgument,
    Error_Other,
    Error_UncommittedLimit,
    MaybeValues,
    Packed,
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


# -- the packed types ---------------------------------------------------

def unpack(packed: Packed) -> List[bytes]:
    """The strings of `packed`: string i is bytes[ends[i-1]:ends[i]]. A
    malformed buffer (ends decreasing or not ending at its length) is the
    caller's error, refused as the WIT says."""
    data, out, at = packed.bytes, [], 0
    for end in packed.ends:
        if end < at or end > len(data):
            raise fail(Error_InvalidArgument(f"{NAME}: packed string ends are malformed"))
        out.append(data[at:end])
        at = end
    if at != len(data):
        raise fail(Error_InvalidArgument(f"{NAME}: packed bytes run past the last end"))
    return out


def unpack_entries(packed: Packed) -> List[Tuple[bytes, bytes]]:
    """Entries: key i is string 2i, its value string 2i + 1."""
    strings = unpack(packed)
    if len(strings) % 2:
        raise fail(Error_InvalidArgument(f"{NAME}: packed entries have an odd string count"))
    return list(zip(strings[0::2], strings[1::2]))


def pack(strings: List[bytes]) -> Packed:
    ends, at = [], 0
    for s in strings:
        at += len(s)
        ends.append(at)
    return Packed(b"".join(strings), ends)


def pack_entries(entries: List[Tuple[bytes, bytes]]) -> Packed:
    return pack([s for entry in entries for s in entry])


def pack_values(values: List[Optional[bytes]]) -> MaybeValues:
    return MaybeValues(pack([v if v is not None else b"" for v in values]),
                       [v is not None for v in values])


def unpack_values(answers: MaybeValues) -> List[Optional[bytes]]:
    values = unpack(answers.values)
    if len(values) != len(answers.found):
        raise fail(Error_Corrupt(f"{NAME}: the host answered a get-many out of shape"))
    return [v if found else None for v, found in zip(values, answers.found)]


def get_many(keyspace: storage.Keyspace, keys: List[bytes]) -> List[Optional[bytes]]:
    return unpack_values(keyspace.get_many(pack(keys))) if keys else []


def scan(keyspace: storage.Keyspace, start: Optional[bytes], end: Optional[bytes],
         batch: int = CURSOR_BATCH) -> Iterator[Tuple[bytes, bytes]]:
    """The entries of [start, end) in key order, fetched `batch` at a time.
    The cursor resource is dropped when the generator ends or is closed."""
    with keyspace.scan(start, end) as cursor:
        while True:
            page = unpack_entries(cursor.next(batch))
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
            return get_many(self.data, keys)
        misses = [k for k in keys if k not in self.buffer]
        stored = iter(get_many(self.data, misses))
        return [self.buffer[k] if k in self.buffer else next(stored) for k in keys]

    def range(self, start: Optional[bytes], end: Optional[bytes],
              isolation: Isolation, limit: int) -> List[Tuple[bytes, bytes]]:
        if start is not None and end is not None and start > end:
            raise fail(Error_InvalidArgument(f"{NAME}: range start is after its end"))
        self.usable()
        if limit == 0:
            return []
        batch = min(limit, CURSOR_BATCH)
        if isolation == Isolation.READ_COMMITTED:
            out: List[Tuple[bytes, bytes]] = []
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
                     limit: int, batch: int) -> List[Tuple[bytes, bytes]]:
        """C + U over [start, end): the buffer wins on equal keys and its
        deletes hide the stored key."""
        out: List[Tuple[bytes, bytes]] = []
        base = scan(self.data, start, end, batch)
        try:
            stored = next(base, None)
            pending = self.overlay(start, end)
            key = next(pending, None)
            while len(out) < limit and (stored is not None or key is not None):
                if key is None or (stored is not None and stored[0] < key):
                    out.append(stored)
                    stored = next(base, None)
                    continue
                if stored is not None and stored[0] == key:
                    stored = next(base, None)
                value = self.buffer[key]
                if value is not None:
                    out.append((key, value))
                key = next(pending, None)
        finally:
            base.close()
        return out

    # -- commit and recovery -------------------------------------------

    def commit(self, offset: int) -> None:
        self.usable()
        # Two ops for the whole buffer: the puts packed, the deletes packed
        # (distinct keys, so their order does not matter).
        writes = sorted(self.buffer.items())
        ops = [Op_PutMany(pack_entries([(k, v) for k, v in writes if v is not None])),
               Op_DeleteMany(pack([k for k, v in writes if v is None]))]
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

    def get_many(self, keys: Packed, isolation: Isolation) -> MaybeValues:
        return pack_values(store().get_many(unpack(keys), isolation))

    def range(self, start: Optional[bytes], end: Optional[bytes],
              isolation: Isolation, limit: int) -> Packed:
        return pack_entries(store().range(start, end, isolation, limit))

    def put(self, key: bytes, value: bytes) -> None:
        store().add([(key, value)])

    def delete(self, key: bytes) -> None:
        store().add([(key, None)])

    def put_many(self, entries: Packed) -> None:
        store().add(unpack_entries(entries))

    def delete_many(self, keys: Packed) -> None:
        store().add([(k, None) for k in unpack(keys)])

    def commit(self, offset: int) -> None:
        store().commit(offset)

    def committed_offset(self) -> Optional[int]:
        return store().read_offset()

    def approximate_uncommitted_bytes(self) -> int:
        return _store.bytes if _store is not None else 0
