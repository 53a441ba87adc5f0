"""A txstore processor in Python: running statistics per key.

Each input record carries a key and a number. The store keeps, under
`prefix + key`, the ASCII text "count sum min max" (four decimal integers
separated by single spaces); every record updates it and outputs the new
text under the key (without the prefix).

- A line of an input file (no record key) is `key<TAB>number`, split at the
  first tab byte. A Kafka record has the key as its key and the number as
  its value.
- The number is a decimal signed 64-bit integer: an optional leading '-',
  then ASCII digits only (no '+', no spaces, no underscores).
- A record without a tab, without a value, with an empty key or with a
  number that does not parse is skipped: no writes, no output.

Keys and values stay bytes throughout; keys need not be UTF-8.

Built with componentize-py against ../../wit (world `processor`); see
build.sh.
"""

from typing import List, Optional, Tuple

import wit_world
from componentize_py_types import Err
from wit_world.exports.record_processor import Input, Output
from wit_world.imports import state
from wit_world.imports.types import (
    Error_AccessDenied,
    Error_Corrupt,
    Error_InvalidArgument,
    Error_NoSuchSnapshot,
    Error_Other,
    Error_Storage,
    Error_UncommittedLimit,
)

NAME = "python-processor"
KNOWN_OPTIONS = "prefix"
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
TAB = 0x09

# The prefix prepended to every store key, set by `init`.
_prefix = b""


# -- parsing ------------------------------------------------------------

def parse_int(text: bytes) -> Optional[int]:
    """`text` as a decimal integer: an optional '-' then one or more ASCII
    digits, nothing else (Python's int() would also take '+', spaces and
    underscores). None if it is not one."""
    digits = text[1:] if text[:1] == b"-" else text
    if not digits or not all(0x30 <= b <= 0x39 for b in digits):
        return None
    n = int(digits)
    return -n if text[:1] == b"-" else n


def parse_i64(text: bytes) -> Optional[int]:
    n = parse_int(text)
    if n is None or not I64_MIN <= n <= I64_MAX:
        return None
    return n


def split_record(record: Input) -> Optional[Tuple[bytes, bytes]]:
    """The record's key and number text, or None when it has none."""
    if record.value is None:
        return None
    if record.key is not None:
        return record.key, record.value
    line = record.value
    tab = line.find(bytes([TAB]))
    if tab < 0:
        return None
    return line[:tab], line[tab + 1:]


# -- errors -------------------------------------------------------------

def escape(data: bytes) -> str:
    """Bytes shown as ASCII, like Rust's `escape_ascii`."""
    out = []
    for b in data:
        if b == 0x09:
            out.append("\\t")
        elif b == 0x0A:
            out.append("\\n")
        elif b == 0x0D:
            out.append("\\r")
        elif b in (0x5C, 0x27, 0x22):
            out.append("\\" + chr(b))
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)


def describe(error) -> str:
    """The WIT `error` variant as text: its case name and payload."""
    kinds = [
        (Error_AccessDenied, "access-denied"),
        (Error_NoSuchSnapshot, "no-such-snapshot"),
        (Error_UncommittedLimit, "uncommitted-limit"),
        (Error_InvalidArgument, "invalid-argument"),
        (Error_Corrupt, "corrupt"),
        (Error_Storage, "storage"),
        (Error_Other, "other"),
    ]
    for cls, kind in kinds:
        if isinstance(error, cls):
            return f"{kind}: {error.value}"
    return repr(error)


def state_error(call: str, key: bytes, err: Err) -> Err:
    """A failed `state` call as the string error `process` returns."""
    return Err(f"{NAME}: state.{call} of key `{escape(key)}` failed: {describe(err.value)}")


# -- the statistics -------------------------------------------------------

def parse_stats(key: bytes, raw: bytes) -> Tuple[int, int, int, int]:
    fields = raw.split(b" ")
    values = [parse_int(f) for f in fields]
    if len(values) != 4 or any(v is None for v in values):
        raise Err(f"{NAME}: the value under `{escape(key)}` is `{escape(raw)}`, "
                  f"expected `count sum min max`")
    count, total, low, high = values
    return count, total, low, high


def update(key: bytes, n: int) -> bytes:
    """Adds `n` to the statistics of `key` and returns their new text."""
    store_key = _prefix + key
    try:
        raw = state.get(store_key)
    except Err as err:
        raise state_error("get", store_key, err) from None
    if raw is None:
        count, total, low, high = 1, n, n, n
    else:
        count, total, low, high = parse_stats(store_key, raw)
        count, total, low, high = count + 1, total + n, min(low, n), max(high, n)
    text = f"{count} {total} {low} {high}".encode("ascii")
    try:
        state.put(store_key, text)
    except Err as err:
        raise state_error("put", store_key, err) from None
    return text


class RecordProcessor(wit_world.exports.RecordProcessor):
    """The exported interface."""

    def init(self, options: List[Tuple[str, str]]) -> None:
        global _prefix
        prefix = b""
        for name, value in options:
            if name != "prefix":
                raise Err(f"unknown option `{name}` (known: {KNOWN_OPTIONS})")
            prefix = value.encode("utf-8")
        _prefix = prefix

    def process(self, record: Input) -> List[Output]:
        parts = split_record(record)
        if parts is None:
            return []
        key, number = parts
        n = parse_i64(number)
        if not key or n is None:
            return []
        return [Output(key, update(key, n))]
