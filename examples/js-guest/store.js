// js-guest: the roll-forward strategy (KIP-844's two stores) in JavaScript,
// built into a component with componentize-js against wit/store.wit
// (txstore:store@0.2.0: keys, pages and batches cross packed, see `unpack`
// and `pack`).
//
// Keyspaces:
//   main  the committed state C, plain values;
//   temp  the uncommitted writes U, one entry per key: 0x01 + value for a
//         put, the single byte 0x00 for a delete (a tombstone);
//   meta  big-endian u64 records: `committed-offset`, and `commit-marker`
//         (the offset being committed) only while a commit is in flight.
//
// commit(o):
//   1. write(meta: marker = o, sync)            the commit point
//   2. scan temp; per batch of up to 1024 entries one unsynced write of
//      puts and deletes into main
//   3. write(temp: clear; meta: offset = o, delete marker, sync)
// Step 3 is one atomic, synced batch: it ends the commit and, by the prefix
// rule of the durability model, makes every write of step 2 durable too.
//
// recover(checkpointed):
//   marker m present -> redo steps 2-3 for m (setting each key to its staged
//                       value is idempotent) and return m, rolled-forward;
//   no marker        -> clear temp if it holds anything, return the stored
//                       offset, discarded or clean.

import { Keyspace, write } from 'txstore:store/storage@0.2.0';

const PUT = 1;
const DELETE = 0;
const BATCH = 1024; // entries per cursor call and per copy write

const ascii = (s) => Uint8Array.from(s, (c) => c.charCodeAt(0));
const OFFSET_KEY = ascii('committed-offset');
const MARKER_KEY = ascii('commit-marker');

// ---- errors -------------------------------------------------------------

// The `error` variant of the WIT, as the bindings carry it.
const witError = (tag, val) => ({ tag, val });
const corrupt = (message) => witError('corrupt', message);

// What a storage call threw, or a bug of ours, as a WIT `error`. A storage
// error arrives as an Error whose `payload` is the variant: pass it on as is.
function asWitError(e) {
  if (e && typeof e === 'object') {
    if (e.payload && typeof e.payload.tag === 'string') return e.payload;
    if (typeof e.tag === 'string') return e;
  }
  return witError('other', `js-guest: ${e && e.stack ? e.stack : String(e)}`);
}

// Every export runs through this: an expected failure is returned as the
// result's `err`, never a trap.
function guarded(fn) {
  return (...args) => {
    try {
      return fn(...args);
    } catch (e) {
      throw asWitError(e);
    }
  };
}

// ---- bytes --------------------------------------------------------------

// memcmp order.
function compare(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    if (a[i] !== b[i]) return a[i] - b[i];
  }
  return a.length - b.length;
}

function u64Bytes(n) {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt(n));
  return out;
}

function readU64(keyspace, key) {
  const bytes = keyspace.get(key);
  if (bytes === undefined) return undefined;
  if (bytes.length !== 8) {
    throw corrupt(`js-guest: ${keyspace.name()} holds ${bytes.length} bytes under a u64 record, expected 8`);
  }
  return new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0);
}

// A staged write as stored in temp: undefined value = delete.
function tag(value) {
  if (value === undefined) return Uint8Array.of(DELETE);
  const out = new Uint8Array(value.length + 1);
  out[0] = PUT;
  out.set(value, 1);
  return out;
}

// The staged write back: { deleted: true } or { value }.
function untag(stored) {
  if (stored.length >= 1 && stored[0] === PUT) return { value: stored.subarray(1) };
  if (stored.length === 1 && stored[0] === DELETE) return { deleted: true };
  throw corrupt('js-guest: the temp keyspace holds a value without a valid tag');
}

// ---- the packed types ---------------------------------------------------

// The strings of a `packed` record: string i is bytes[ends[i-1], ends[i]).
// Views into its buffer, not copies. A malformed one is refused.
function unpack({ bytes, ends }) {
  const out = new Array(ends.length);
  let at = 0;
  for (let i = 0; i < ends.length; i++) {
    const end = ends[i];
    if (end < at || end > bytes.length) {
      throw witError('invalid-argument', 'js-guest: packed string ends are malformed');
    }
    out[i] = bytes.subarray(at, end);
    at = end;
  }
  if (at !== bytes.length) throw witError('invalid-argument', 'js-guest: packed bytes run past the last end');
  return out;
}

// Entries: key i is string 2i, its value string 2i + 1.
function unpackEntries(packed) {
  const strings = unpack(packed);
  if (strings.length % 2 !== 0) throw witError('invalid-argument', 'js-guest: packed entries have an odd string count');
  const out = new Array(strings.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = { key: strings[2 * i], value: strings[2 * i + 1] };
  return out;
}

function pack(strings) {
  const ends = new Uint32Array(strings.length);
  let total = 0;
  strings.forEach((s, i) => {
    total += s.length;
    ends[i] = total;
  });
  const bytes = new Uint8Array(total);
  let at = 0;
  for (const s of strings) {
    bytes.set(s, at);
    at += s.length;
  }
  return { bytes, ends };
}

const packEntries = (entries) => pack(entries.flatMap(({ key, value }) => [key, value]));

// get-many answers: undefined = not found.
const packValues = (values) => ({
  values: pack(values.map((v) => v ?? new Uint8Array(0))),
  found: values.map((v) => v !== undefined),
});

function unpackValues({ values, found }) {
  const strings = unpack(values);
  if (strings.length !== found.length) throw corrupt('js-guest: the host answered a get-many out of shape');
  return strings.map((s, i) => (found[i] ? s : undefined));
}

const getMany = (keyspace, keys) => (keys.length === 0 ? [] : unpackValues(keyspace.getMany(pack(keys))));

// ---- cursors ------------------------------------------------------------

const dispose = (resource) => {
  const drop = resource[Symbol.dispose] ?? resource[Symbol.for('dispose')];
  if (typeof drop === 'function') drop.call(resource);
};

// The entries of [start, end) of a keyspace, fetched `batch` at a time.
function* scan(keyspace, start, end, batch = BATCH) {
  const cursor = keyspace.scan(start, end);
  try {
    for (;;) {
      const entries = unpackEntries(cursor.next(batch));
      if (entries.length === 0) return;
      yield* entries;
    }
  } finally {
    dispose(cursor);
  }
}

// ---- the store ----------------------------------------------------------

let store = null;

function opened() {
  if (store === null) throw witError('other', 'js-guest: init was not called');
  return store;
}

class RollForward {
  constructor() {
    this.main = Keyspace.open('main');
    this.temp = Keyspace.open('temp');
    this.meta = Keyspace.open('meta');
    this.staged = 0; // writes since the last commit or recovery
    this.bytes = 0n; // their keys and values
  }

  // One unsynced write of tagged entries into temp.
  stage(writes) {
    if (writes.length === 0) return;
    const tagged = writes.map(([key, value]) => ({ key, value: tag(value) }));
    write([{ keyspace: this.temp, ops: [{ tag: 'put-many', val: packEntries(tagged) }] }], false);
    for (const [key, value] of writes) {
      this.bytes += BigInt(key.length + (value === undefined ? 0 : value.length));
    }
    this.staged += writes.length;
  }

  // Copies temp into main (idempotent: every key gets its staged final
  // state), then ends the commit at `offset` in one synced batch.
  finishCommit(offset) {
    // Per batch of temp, one write of two ops: its puts and its deletes,
    // packed (temp's keys are distinct, so their order does not matter).
    let puts = [];
    let deletes = [];
    const flush = () => {
      write(
        [
          {
            keyspace: this.main,
            ops: [
              { tag: 'put-many', val: packEntries(puts) },
              { tag: 'delete-many', val: pack(deletes) },
            ],
          },
        ],
        false,
      );
      puts = [];
      deletes = [];
    };
    for (const { key, value } of scan(this.temp)) {
      const staged = untag(value);
      if (staged.deleted) deletes.push(key);
      else puts.push({ key, value: staged.value });
      if (puts.length + deletes.length === BATCH) flush();
    }
    if (puts.length + deletes.length > 0) flush();
    write(
      [
        { keyspace: this.temp, ops: [{ tag: 'clear' }] },
        {
          keyspace: this.meta,
          ops: [
            { tag: 'put', val: { key: OFFSET_KEY, value: u64Bytes(offset) } },
            { tag: 'delete', val: MARKER_KEY },
          ],
        },
      ],
      true,
    );
    this.staged = 0;
    this.bytes = 0n;
  }

  commit(offset) {
    if (this.staged === 0) {
      // temp is empty (cleared by the last commit or recovery): only the offset.
      write([{ keyspace: this.meta, ops: [{ tag: 'put', val: { key: OFFSET_KEY, value: u64Bytes(offset) } }] }], true);
      return;
    }
    write([{ keyspace: this.meta, ops: [{ tag: 'put', val: { key: MARKER_KEY, value: u64Bytes(offset) } }] }], true);
    this.finishCommit(offset);
  }

  recover(checkpointed) {
    this.staged = 0;
    this.bytes = 0n;
    const marker = readU64(this.meta, MARKER_KEY);
    if (marker !== undefined) {
      if (checkpointed !== undefined && checkpointed > marker) {
        throw corrupt(`js-guest: the checkpoint says offset ${checkpointed} but the interrupted commit is at ${marker}`);
      }
      this.finishCommit(marker);
      return { offset: marker, action: 'rolled-forward' };
    }
    const hadTemp = !this.temp.isEmpty();
    if (hadTemp) write([{ keyspace: this.temp, ops: [{ tag: 'clear' }] }], true);
    const stored = readU64(this.meta, OFFSET_KEY);
    if (checkpointed !== undefined && (stored === undefined || checkpointed > stored)) {
      throw corrupt(`js-guest: the checkpoint says offset ${checkpointed} but the store committed only ${stored ?? 'nothing'}`);
    }
    const clean = !hadTemp && checkpointed === stored;
    return { offset: stored, action: clean ? 'clean' : 'discarded' };
  }

  get(key, isolation) {
    if (isolation === 'read-uncommitted') {
      const stored = this.temp.get(key);
      if (stored !== undefined) {
        const staged = untag(stored);
        return staged.deleted ? undefined : staged.value;
      }
    }
    return this.main.get(key);
  }

  getMany(keys, isolation) {
    if (isolation !== 'read-uncommitted') return getMany(this.main, keys);
    const staged = getMany(this.temp, keys);
    const misses = keys.filter((_, i) => staged[i] === undefined);
    const committed = getMany(this.main, misses);
    let next = 0;
    return staged.map((stored) => {
      if (stored === undefined) return committed[next++];
      const s = untag(stored);
      return s.deleted ? undefined : s.value;
    });
  }

  range(start, end, isolation, limit) {
    if (start !== undefined && end !== undefined && compare(start, end) > 0) {
      throw witError('invalid-argument', 'js-guest: range start is after its end');
    }
    const out = [];
    if (limit === 0) return out;
    const batch = Math.min(limit, BATCH);
    if (isolation !== 'read-uncommitted') {
      for (const entry of scan(this.main, start, end, batch)) {
        out.push(entry);
        if (out.length >= limit) break;
      }
      return out;
    }
    // Merge temp over main in key order: temp wins on equal keys, and a
    // tombstone hides the key.
    const base = scan(this.main, start, end, batch);
    const overlay = scan(this.temp, start, end, BATCH);
    try {
      let b = base.next();
      let o = overlay.next();
      while (out.length < limit && !(b.done && o.done)) {
        const order = b.done ? 1 : o.done ? -1 : compare(b.value.key, o.value.key);
        if (order < 0) {
          out.push(b.value);
          b = base.next();
          continue;
        }
        if (order === 0) b = base.next();
        const staged = untag(o.value.value);
        if (!staged.deleted) out.push({ key: o.value.key, value: staged.value });
        o = overlay.next();
      }
    } finally {
      base.return();
      overlay.return();
    }
    return out;
  }
}

// ---- the export: txstore:store/state-store@0.2.0 --------------------------

export const stateStore = {
  init: guarded((options) => {
    for (const [name] of options) {
      throw witError('invalid-argument', `js-guest: unknown option \`${name}\` (known: none)`);
    }
    store = new RollForward();
  }),

  transactional: () => true,

  recover: guarded((checkpointed) => opened().recover(checkpointed)),

  get: guarded((key, isolation) => opened().get(key, isolation)),
  getMany: guarded((keys, isolation) => packValues(opened().getMany(unpack(keys), isolation))),
  range: guarded((start, end, isolation, limit) => packEntries(opened().range(start, end, isolation, limit))),

  put: guarded((key, value) => opened().stage([[key, value]])),
  delete: guarded((key) => opened().stage([[key, undefined]])),
  putMany: guarded((entries) => opened().stage(unpackEntries(entries).map(({ key, value }) => [key, value]))),
  deleteMany: guarded((keys) => opened().stage(unpack(keys).map((key) => [key, undefined]))),

  commit: guarded((offset) => opened().commit(offset)),
  committedOffset: guarded(() => readU64(opened().meta, OFFSET_KEY)),

  approximateUncommittedBytes: () => (store === null ? 0n : store.bytes),
};
