/**
 * How rlstream builds avsc types from `.avsc` schemas:
 *
 *  - `bytes` with `logicalType: "int32-le"` / `"float32-le"` decode to `Int32Array` /
 *    `Float32Array` and encode from them. Decoding copies the bytes once, straight from the
 *    message into a fresh typed array (avsc's plain `bytes` would copy into a Buffer first, and an
 *    unaligned Buffer needs a second copy), so a decoded record owns its memory and never pins a
 *    consumer's fetch buffer. Readers in other languages see plain `bytes` (logical types are
 *    annotations) holding little-endian int32/float32.
 *  - Arrays and maps read with a guard: avsc trusts the block count of an array, so a corrupted
 *    count of 10⁹ would spin for minutes before failing; here reading stops as soon as it has
 *    run past the end of the buffer (every item of our schemas takes at least one byte).
 *  - Unions are never wrapped (`wrapUnions: 'never'`): a union must be `["null", T]`-like, so the
 *    TypeScript value is simply `T | null`. An ambiguous union is refused when the schema loads.
 *  - Other logical types (`timestamp-millis`) read as their underlying type (a number).
 */
import avro from 'avsc';
import { copyFloat32, copyInt32, packFloat32, packInt32 } from './packing.ts';

/** avsc's internal cursor (utils.Tap); only the members used here. */
interface Tap {
  buf: Buffer;
  pos: number;
  readLong(): number;
  skipLong(): void;
  readString(): string;
}

function invalidate(tap: Tap): void {
  tap.pos = tap.buf.length + 1;
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return `an array of length ${v.length}`;
  if (typeof v === 'object') return `a ${(v as object).constructor?.name ?? 'object'}`;
  return `${typeof v} ${JSON.stringify(v)}`;
}

/** Reads `len` bytes at the cursor into a fresh typed array (one copy). */
function readPacked<A extends Int32Array | Float32Array>(tap: Tap, make: (n: number) => A, what: string): A {
  const len = tap.readLong();
  const start = tap.pos;
  if (len < 0 || start + len > tap.buf.length) {
    invalidate(tap);
    return make(0);
  }
  if (len % 4 !== 0) throw new Error(`${what} field holds ${len} bytes, not a multiple of 4`);
  const out = make(len / 4);
  new Uint8Array(out.buffer).set(tap.buf.subarray(start, start + len));
  tap.pos = start + len;
  return out;
}

/** `bytes` holding int32 little-endian ⇄ `Int32Array`. */
export class Int32LeType extends avro.types.LogicalType {
  _read(tap: Tap): Int32Array {
    return readPacked(tap, (n) => new Int32Array(n), 'int32-le');
  }
  protected override _fromValue(val: Buffer): Int32Array {
    return copyInt32(val);
  }
  protected override _toValue(val: unknown): Buffer | undefined {
    return val instanceof Int32Array ? packInt32(val) : undefined;
  }
  _write(tap: Tap, val: unknown): void {
    if (!(val instanceof Int32Array)) throw new Error(`expected an Int32Array (int32-le bytes), got ${describe(val)}`);
    (this.underlyingType as unknown as { _write(t: Tap, b: Buffer): void })._write(tap, packInt32(val));
  }
  protected override _resolve(type: avro.Type): ((v: any) => Int32Array) | undefined {
    if (type instanceof Int32LeType) return (v: Int32Array) => v;
    if (avro.Type.isType(type, 'bytes')) return (b: Buffer) => copyInt32(b);
    return undefined;
  }
}

/** `bytes` holding float32 little-endian ⇄ `Float32Array`. */
export class Float32LeType extends avro.types.LogicalType {
  _read(tap: Tap): Float32Array {
    return readPacked(tap, (n) => new Float32Array(n), 'float32-le');
  }
  protected override _fromValue(val: Buffer): Float32Array {
    return copyFloat32(val);
  }
  protected override _toValue(val: unknown): Buffer | undefined {
    return val instanceof Float32Array ? packFloat32(val) : undefined;
  }
  _write(tap: Tap, val: unknown): void {
    if (!(val instanceof Float32Array))
      throw new Error(`expected a Float32Array (float32-le bytes), got ${describe(val)}`);
    (this.underlyingType as unknown as { _write(t: Tap, b: Buffer): void })._write(tap, packFloat32(val));
  }
  protected override _resolve(type: avro.Type): ((v: any) => Float32Array) | undefined {
    if (type instanceof Float32LeType) return (v: Float32Array) => v;
    if (avro.Type.isType(type, 'bytes')) return (b: Buffer) => copyFloat32(b);
    return undefined;
  }
}

type ItemReader = { _read(tap: Tap): unknown };
const ArrayBase = avro.types.ArrayType as unknown as new (schema: unknown, opts: unknown) => avro.types.ArrayType;
const MapBase = avro.types.MapType as unknown as new (schema: unknown, opts: unknown) => avro.types.MapType;

/**
 * avsc's array, reading with a bound: stops once the cursor is past the end. `this.itemsType` is
 * the items type, or the items resolver when reading an older writer's data (avsc reuses `_read`
 * with a resolver as `this`), so the same code serves both paths.
 */
class GuardedArrayType extends ArrayBase {
  _read(tap: Tap): unknown[] {
    const items = (this as unknown as { itemsType: ItemReader }).itemsType;
    const end = tap.buf.length;
    let val: unknown[] | undefined;
    let i = 0;
    let n: number;
    while ((n = tap.readLong())) {
      if (n < 0) {
        n = -n;
        tap.skipLong();
      }
      if (!val) val = new Array(Math.min(n, end - tap.pos + 1));
      while (n--) {
        val[i++] = items._read(tap);
        if (tap.pos > end) {
          invalidate(tap);
          return val;
        }
      }
    }
    return val ?? [];
  }
}

/** avsc's map with the same bound; a key "__proto__" becomes an own property. */
class GuardedMapType extends MapBase {
  _read(tap: Tap): Record<string, unknown> {
    const values = (this as unknown as { valuesType: ItemReader }).valuesType;
    const end = tap.buf.length;
    const val: Record<string, unknown> = {};
    let n: number;
    while ((n = tap.readLong())) {
      if (n < 0) {
        n = -n;
        tap.skipLong();
      }
      while (n--) {
        const key = tap.readString();
        const v = values._read(tap);
        if (tap.pos > end) {
          invalidate(tap);
          return val;
        }
        if (key === '__proto__')
          Object.defineProperty(val, key, { value: v, enumerable: true, writable: true, configurable: true });
        else val[key] = v;
      }
    }
    return val;
  }
}

export const LOGICAL_TYPES = { 'int32-le': Int32LeType, 'float32-le': Float32LeType } as const;

function typeHook(schema: unknown, opts: unknown): avro.Type | undefined {
  if (schema && typeof schema === 'object' && !Array.isArray(schema) && !('logicalType' in schema)) {
    const t = (schema as { type?: unknown }).type;
    if (t === 'array') return new GuardedArrayType(schema, opts);
    if (t === 'map') return new GuardedMapType(schema, opts);
  }
  return undefined;
}

/** Parses a schema (JSON text or object) into an avsc type with rlstream's options. */
export function parseSchema(schema: string | object): avro.Type {
  const obj = typeof schema === 'string' ? JSON.parse(schema) : schema;
  return avro.Type.forSchema(obj, {
    logicalTypes: LOGICAL_TYPES as any,
    typeHook: typeHook as any,
    wrapUnions: 'never',
    assertLogicalTypes: true,
  });
}

export type AvroType = avro.Type;
export { avro };
