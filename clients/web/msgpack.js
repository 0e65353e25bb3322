// msgpack with openpi's numpy markers (openpi_client/msgpack_numpy.py), an ES module with no
// dependencies. Arrays go on the wire exactly as openpi writes them: a map of four entries whose
// keys are msgpack *bin* (b"__ndarray__", b"data", b"dtype", b"shape"), `data` bin (C order),
// `dtype` a str (numpy's dtype.str, e.g. "<f4", "|u1"), `shape` an array. Numpy scalars
// ({__npgeneric__, data, dtype}) decode to plain numbers. Little-endian dtypes only (every
// browser platform is little-endian); any other dtype raises a readable Error.
"use strict";

const utf8 = new TextEncoder(), text = new TextDecoder();
const KEY = (s) => utf8.encode(s);
const ND_KEYS = {marker: KEY("__ndarray__"), data: KEY("data"), dtype: KEY("dtype"), shape: KEY("shape")};
const TYPED = {
  b1: Uint8Array, u1: Uint8Array, i1: Int8Array, u2: Uint16Array, i2: Int16Array, u4: Uint32Array,
  i4: Int32Array, u8: BigUint64Array, i8: BigInt64Array, f4: Float32Array, f8: Float64Array,
};

/** A numpy array on the wire: `data` a typed array (C order), `dtype` like "<f4", `shape` ints. */
export class NdArray {
  constructor(data, dtype, shape) {
    const count = shape.reduce((a, b) => a * b, 1);
    if (data.length !== count) throw new Error(`array of ${data.length} values for shape [${shape}]`);
    Object.assign(this, {data, dtype, shape});
  }
  static float32(values, shape) { return new NdArray(Float32Array.from(values), "<f4", shape); }
  static uint8(bytes, shape) { return new NdArray(bytes, "|u1", shape); }
  /** Row `i` of a 2-D array as a typed array view. */
  row(i) { const w = this.shape[1]; return this.data.subarray(i * w, (i + 1) * w); }
}

function typedFor(dtype) {
  const order = dtype[0], code = dtype.slice(1);
  if (!"<|=".includes(order) || !(code in TYPED)) throw new Error(`unsupported dtype ${JSON.stringify(dtype)}`);
  return TYPED[code];
}

// ---- encode ---------------------------------------------------------------------------------
class Writer {
  constructor() { this.buf = new Uint8Array(1024); this.view = new DataView(this.buf.buffer); this.n = 0; }
  room(k) {
    if (this.n + k <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.n + k) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.n));
    this.buf = next; this.view = new DataView(next.buffer);
  }
  u8(v) { this.room(1); this.buf[this.n++] = v; }
  head(type, bits, v) {  // a type byte followed by a big-endian unsigned length or value
    this.room(1 + bits / 8); this.buf[this.n++] = type;
    if (bits === 8) this.view.setUint8(this.n, v);
    else if (bits === 16) this.view.setUint16(this.n, v);
    else this.view.setUint32(this.n, v);
    this.n += bits / 8;
  }
  bytes(b) { this.room(b.length); this.buf.set(b, this.n); this.n += b.length; }
}

function sized(w, len, fix, fixMax, t8, t16, t32) {
  if (fix !== null && len <= fixMax) w.u8(fix | len);
  else if (t8 !== null && len < 0x100) w.head(t8, 8, len);
  else if (len < 0x10000) w.head(t16, 16, len);
  else w.head(t32, 32, len);
}
const bin = (w, b) => { sized(w, b.length, null, 0, 0xc4, 0xc5, 0xc6); w.bytes(b); };
const str = (w, s) => { const b = utf8.encode(s); sized(w, b.length, 0xa0, 31, 0xd9, 0xda, 0xdb); w.bytes(b); };

function number(w, v) {
  if (Number.isInteger(v) && v >= 0 && v < 2 ** 32) {
    if (v < 128) w.u8(v); else if (v < 0x100) w.head(0xcc, 8, v); else if (v < 0x10000) w.head(0xcd, 16, v);
    else w.head(0xce, 32, v);
  } else if (Number.isInteger(v) && v >= -(2 ** 31) && v < 0) {
    if (v >= -32) { w.u8(v & 0xff); } else { w.room(5); w.buf[w.n++] = 0xd2; w.view.setInt32(w.n, v); w.n += 4; }
  } else {
    w.room(9); w.buf[w.n++] = 0xcb; w.view.setFloat64(w.n, v); w.n += 8;
  }
}

function value(w, v) {
  if (v === null || v === undefined) w.u8(0xc0);
  else if (v === true || v === false) w.u8(v ? 0xc3 : 0xc2);
  else if (typeof v === "number") number(w, v);
  else if (typeof v === "string") str(w, v);
  else if (v instanceof Uint8Array) bin(w, v);
  else if (v instanceof NdArray) {
    typedFor(v.dtype);
    w.u8(0x84);
    bin(w, ND_KEYS.marker); w.u8(0xc3);
    bin(w, ND_KEYS.data); bin(w, new Uint8Array(v.data.buffer, v.data.byteOffset, v.data.byteLength));
    bin(w, ND_KEYS.dtype); str(w, v.dtype);
    bin(w, ND_KEYS.shape); value(w, v.shape);
  } else if (Array.isArray(v)) {
    sized(w, v.length, 0x90, 15, null, 0xdc, 0xdd);
    for (const x of v) value(w, x);
  } else if (typeof v === "object") {
    const entries = Object.entries(v).filter(([, x]) => x !== undefined);
    sized(w, entries.length, 0x80, 15, null, 0xde, 0xdf);
    for (const [k, x] of entries) { str(w, k); value(w, x); }
  } else throw new Error(`cannot encode ${typeof v}`);
}

/** msgpack bytes of `v` (objects -> maps with str keys, NdArray -> openpi's array marker). */
export function encode(v) {
  const w = new Writer();
  value(w, v);
  return w.buf.slice(0, w.n);
}

// ---- decode ---------------------------------------------------------------------------------
class Reader {
  constructor(bytes) {
    this.b = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
    this.v = new DataView(this.b.buffer, this.b.byteOffset, this.b.byteLength); this.i = 0;
  }
  take(k) {
    if (this.i + k > this.b.length) throw new Error("truncated msgpack");
    const out = this.b.subarray(this.i, this.i + k); this.i += k; return out;
  }
  u(bits) {
    const at = this.i; this.take(bits / 8);
    if (bits === 8) return this.v.getUint8(at);
    if (bits === 16) return this.v.getUint16(at);
    if (bits === 32) return this.v.getUint32(at);
    return Number(this.v.getBigUint64(at));
  }
  s(bits) {
    const at = this.i; this.take(bits / 8);
    if (bits === 8) return this.v.getInt8(at);
    if (bits === 16) return this.v.getInt16(at);
    if (bits === 32) return this.v.getInt32(at);
    return Number(this.v.getBigInt64(at));
  }
  f(bits) { const at = this.i; this.take(bits / 8); return bits === 32 ? this.v.getFloat32(at) : this.v.getFloat64(at); }
}

function map(r, len) {
  const out = {};
  for (let k = 0; k < len; k++) {
    const key = read(r), v = read(r);
    out[key instanceof Uint8Array ? text.decode(key) : String(key)] = v;
  }
  if (out.__ndarray__ === true) {
    const Typed = typedFor(out.dtype), raw = out.data;
    const aligned = raw.slice().buffer;  // a copy: typed arrays need aligned offsets
    return new NdArray(new Typed(aligned, 0, raw.byteLength / Typed.BYTES_PER_ELEMENT), out.dtype, out.shape);
  }
  if (out.__npgeneric__ === true) return out.data;
  return out;
}
const array = (r, len) => Array.from({length: len}, () => read(r));

function read(r) {
  const t = r.u(8);
  if (t < 0x80) return t;
  if (t < 0x90) return map(r, t & 0x0f);
  if (t < 0xa0) return array(r, t & 0x0f);
  if (t < 0xc0) return text.decode(r.take(t & 0x1f));
  if (t >= 0xe0) return t - 0x100;
  switch (t) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: return r.take(r.u(8)).slice();
    case 0xc5: return r.take(r.u(16)).slice();
    case 0xc6: return r.take(r.u(32)).slice();
    case 0xca: return r.f(32);
    case 0xcb: return r.f(64);
    case 0xcc: return r.u(8);
    case 0xcd: return r.u(16);
    case 0xce: return r.u(32);
    case 0xcf: return r.u(64);
    case 0xd0: return r.s(8);
    case 0xd1: return r.s(16);
    case 0xd2: return r.s(32);
    case 0xd3: return r.s(64);
    case 0xd9: return text.decode(r.take(r.u(8)));
    case 0xda: return text.decode(r.take(r.u(16)));
    case 0xdb: return text.decode(r.take(r.u(32)));
    case 0xdc: return array(r, r.u(16));
    case 0xdd: return array(r, r.u(32));
    case 0xde: return map(r, r.u(16));
    case 0xdf: return map(r, r.u(32));
    default: throw new Error(`unsupported msgpack type 0x${t.toString(16)}`);
  }
}

/** The value of msgpack `bytes` (an ArrayBuffer or Uint8Array); openpi's markers decoded. */
export function decode(bytes) {
  const r = new Reader(bytes), out = read(r);
  if (r.i !== r.b.length) throw new Error(`${r.b.length - r.i} trailing bytes after msgpack value`);
  return out;
}
