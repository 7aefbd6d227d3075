/**
 * Packing of token ids and per-token floats into Avro `bytes`: int32 / float32, little-endian,
 * 4 bytes per element (the layout of an `Int32Array` / `Float32Array` on every host Node runs
 * on in practice; a big-endian host is refused at load rather than silently misread).
 *
 * `pack*` return a Buffer *view* of the array's memory (no copy). `unpack*` return a view of the
 * Buffer's memory when its byte offset is 4-aligned, and a copy otherwise (a typed array cannot
 * start at an unaligned offset). A view shares memory with its source: copy it (`.slice()`) if
 * the source buffer is reused afterwards.
 */
import { endianness } from 'node:os';

if (endianness() !== 'LE') {
  throw new Error(
    'rlstream packs token ids and floats as little-endian typed arrays; this host is big-endian, which is not supported',
  );
}

/** A Buffer view of `a`'s bytes (no copy). */
export function packInt32(a: Int32Array): Buffer {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength);
}

/** A Buffer view of `a`'s bytes (no copy). */
export function packFloat32(a: Float32Array): Buffer {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength);
}

function checkLength(b: Uint8Array, what: string): void {
  if (b.byteLength % 4 !== 0)
    throw new RangeError(`${what}: ${b.byteLength} bytes is not a multiple of 4 (4 bytes per element)`);
}

/** Int32 little-endian bytes → Int32Array: a view when 4-aligned, else a copy. */
export function unpackInt32(b: Uint8Array): Int32Array {
  checkLength(b, 'unpackInt32');
  if (b.byteOffset % 4 === 0) return new Int32Array(b.buffer, b.byteOffset, b.byteLength / 4);
  const out = new Int32Array(b.byteLength / 4);
  new Uint8Array(out.buffer).set(b);
  return out;
}

/** Float32 little-endian bytes → Float32Array: a view when 4-aligned, else a copy. */
export function unpackFloat32(b: Uint8Array): Float32Array {
  checkLength(b, 'unpackFloat32');
  if (b.byteOffset % 4 === 0) return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
  const out = new Float32Array(b.byteLength / 4);
  new Uint8Array(out.buffer).set(b);
  return out;
}

/** Int32 little-endian bytes → a fresh Int32Array that owns its memory. */
export function copyInt32(b: Uint8Array): Int32Array {
  checkLength(b, 'copyInt32');
  const out = new Int32Array(b.byteLength / 4);
  new Uint8Array(out.buffer).set(b);
  return out;
}

/** Float32 little-endian bytes → a fresh Float32Array that owns its memory. */
export function copyFloat32(b: Uint8Array): Float32Array {
  checkLength(b, 'copyFloat32');
  const out = new Float32Array(b.byteLength / 4);
  new Uint8Array(out.buffer).set(b);
  return out;
}
