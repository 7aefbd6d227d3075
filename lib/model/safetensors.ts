/**
 * `.safetensors` reader/writer (the Hugging Face format): an 8-byte little-endian header length,
 * a JSON header `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {k: v}}`
 * padded with spaces to 8 bytes, then the little-endian tensor bytes. Decoding checks every
 * offset and size and names the tensor at fault.
 */
import { ConfigError } from '../errors.ts';

export type StDType = 'F64' | 'F32' | 'F16' | 'BF16' | 'I64' | 'I32' | 'I16' | 'I8' | 'U8' | 'BOOL';
export type StData =
  Float64Array | Float32Array | BigInt64Array | Int32Array | Int16Array | Int8Array | Uint8Array | Uint16Array;

export interface StTensor {
  dtype: StDType;
  shape: number[];
  data: StData;
}

const SIZE: Record<StDType, number> = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1,
};

function dtypeOf(data: StData): StDType {
  if (data instanceof Float32Array) return 'F32';
  if (data instanceof Float64Array) return 'F64';
  if (data instanceof BigInt64Array) return 'I64';
  if (data instanceof Int32Array) return 'I32';
  if (data instanceof Int16Array) return 'I16';
  if (data instanceof Int8Array) return 'I8';
  if (data instanceof Uint16Array) return 'F16';
  return 'U8';
}

/** Encode tensors (in the given order) and string metadata. */
export function encodeSafetensors(
  tensors: Iterable<[string, { shape: number[]; data: StData; dtype?: StDType }]>,
  metadata: Record<string, string> = {},
): Buffer {
  return Buffer.concat(safetensorsParts(tensors, metadata));
}

/**
 * The bytes of encodeSafetensors as consecutive parts (length, header, then each tensor's bytes as
 * a view of its array, not a copy): hashing them gives the file's sha256 without building it.
 */
export function safetensorsParts(
  tensors: Iterable<[string, { shape: number[]; data: StData; dtype?: StDType }]>,
  metadata: Record<string, string> = {},
): Buffer[] {
  const entries: [string, { dtype: StDType; shape: number[] }][] = [];
  const parts: Buffer[] = [];
  for (const [name, t] of tensors) {
    const dtype = t.dtype ?? dtypeOf(t.data);
    const n = t.shape.reduce((a, b) => a * b, 1);
    if (t.data.length !== n)
      throw new ConfigError(`safetensors: ${name} has ${t.data.length} values for shape [${t.shape}]`);
    entries.push([name, { dtype, shape: t.shape }]);
    parts.push(Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
  }
  return [...safetensorsHeader(entries, metadata), ...parts];
}

/**
 * The first two parts of safetensorsParts (the header's length and the padded JSON header) for
 * tensors of these dtypes and shapes, in this order: the tensor bytes that follow are each
 * tensor's values, little-endian, one after the other.
 */
export function safetensorsHeader(
  tensors: Iterable<[string, { dtype: StDType; shape: number[] }]>,
  metadata: Record<string, string> = {},
): [Buffer, Buffer] {
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length) header.__metadata__ = metadata;
  let offset = 0;
  for (const [name, t] of tensors) {
    if (name === '__metadata__') throw new ConfigError('safetensors: "__metadata__" is not a valid tensor name');
    const bytes = t.shape.reduce((a, b) => a * b, 1) * SIZE[t.dtype];
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const hbuf = Buffer.from(json, 'utf8');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(hbuf.length));
  return [len, hbuf];
}

/** Decode a safetensors buffer; `source` names the file in errors. Tensors view `buf` where aligned (do not modify it after), else are aligned copies. */
export function decodeSafetensors(
  buf: Uint8Array,
  source = 'safetensors',
): { tensors: Map<string, StTensor>; metadata: Record<string, string> } {
  const b = Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  if (b.length < 8) throw new ConfigError(`${source}: file too short (${b.length} bytes) to be safetensors`);
  const hlen = Number(b.readBigUInt64LE(0));
  if (hlen <= 0 || 8 + hlen > b.length)
    throw new ConfigError(
      `${source}: header length ${hlen} does not fit the file (${b.length} bytes); the file is truncated or not safetensors`,
    );
  let header: Record<string, any>;
  try {
    header = JSON.parse(b.subarray(8, 8 + hlen).toString('utf8'));
  } catch (e) {
    throw new ConfigError(`${source}: header is not valid JSON (${(e as Error).message})`);
  }
  if (!header || typeof header !== 'object' || Array.isArray(header))
    throw new ConfigError(`${source}: header must be a JSON object`);
  const dataStart = 8 + hlen,
    dataLen = b.length - dataStart;
  const metadata: Record<string, string> = {};
  const tensors = new Map<string, StTensor>();
  const spans: [number, number, string][] = [];
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') {
      for (const [k, v] of Object.entries(info ?? {})) metadata[k] = String(v);
      continue;
    }
    const dtype = info?.dtype as StDType;
    if (!(dtype in SIZE))
      throw new ConfigError(`${source}: tensor ${name} has unsupported dtype ${JSON.stringify(info?.dtype)}`);
    const shape = info.shape;
    if (!Array.isArray(shape) || !shape.every((d: unknown) => Number.isInteger(d) && (d as number) >= 0))
      throw new ConfigError(`${source}: tensor ${name} has invalid shape ${JSON.stringify(shape)}`);
    const off = info.data_offsets;
    if (
      !Array.isArray(off) ||
      off.length !== 2 ||
      !Number.isInteger(off[0]) ||
      !Number.isInteger(off[1]) ||
      off[0] < 0 ||
      off[1] < off[0] ||
      off[1] > dataLen
    )
      throw new ConfigError(
        `${source}: tensor ${name} has data_offsets ${JSON.stringify(off)} outside the ${dataLen}-byte data section (file truncated?)`,
      );
    const n = shape.reduce((a: number, c: number) => a * c, 1);
    if (off[1] - off[0] !== n * SIZE[dtype])
      throw new ConfigError(
        `${source}: tensor ${name} ${dtype}[${shape}] needs ${n * SIZE[dtype]} bytes, offsets give ${off[1] - off[0]}`,
      );
    spans.push([off[0], off[1], name]);
    // a view into the file's bytes when aligned for the dtype (no copy: a model's weights are read
    // once, at full size), else an aligned copy
    const at = b.byteOffset + dataStart + off[0];
    tensors.set(name, {
      dtype,
      shape,
      data:
        at % SIZE[dtype] === 0
          ? view(dtype, b.buffer as ArrayBuffer, at, n)
          : view(dtype, Uint8Array.from(b.subarray(dataStart + off[0], dataStart + off[1])).buffer),
    });
  }
  spans.sort((x, y) => x[0] - y[0]);
  for (let i = 1; i < spans.length; i++)
    if (spans[i][0] < spans[i - 1][1])
      throw new ConfigError(`${source}: tensors ${spans[i - 1][2]} and ${spans[i][2]} overlap`);
  return { tensors, metadata };
}

function view(dtype: StDType, ab: ArrayBuffer, byteOffset = 0, length?: number): StData {
  switch (dtype) {
    case 'F64':
      return new Float64Array(ab, byteOffset, length);
    case 'F32':
      return new Float32Array(ab, byteOffset, length);
    case 'F16':
    case 'BF16':
      return new Uint16Array(ab, byteOffset, length);
    case 'I64':
      return new BigInt64Array(ab, byteOffset, length);
    case 'I32':
      return new Int32Array(ab, byteOffset, length);
    case 'I16':
      return new Int16Array(ab, byteOffset, length);
    case 'I8':
      return new Int8Array(ab, byteOffset, length);
    default:
      return new Uint8Array(ab, byteOffset, length);
  }
}

/** Float tensor data as float32 (F64/F16/BF16 converted); throws for integer dtypes. */
export function toFloat32(t: StTensor, name: string, source: string): Float32Array {
  switch (t.dtype) {
    case 'F32':
      return t.data as Float32Array;
    case 'F64':
      return Float32Array.from(t.data as Float64Array);
    case 'BF16': {
      const u = t.data as Uint16Array,
        out = new Float32Array(u.length),
        o32 = new Uint32Array(out.buffer);
      for (let i = 0; i < u.length; i++) o32[i] = u[i] << 16;
      return out;
    }
    case 'F16': {
      const u = t.data as Uint16Array,
        out = new Float32Array(u.length);
      for (let i = 0; i < u.length; i++) out[i] = halfToFloat(u[i]);
      return out;
    }
    default:
      throw new ConfigError(
        `${source}: tensor ${name} has dtype ${t.dtype}, expected a float dtype (F32, or F64/F16/BF16 to convert)`,
      );
  }
}

function halfToFloat(h: number): number {
  const s = h & 0x8000 ? -1 : 1,
    e = (h >> 10) & 0x1f,
    f = h & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

/** f32 weights as a tensor stored in `dtype` (bf16 and f16 rounded to nearest even). */
export function fromFloat32(
  a: Float32Array,
  shape: number[],
  dtype: 'float32' | 'bfloat16' | 'float16',
): { shape: number[]; data: StData; dtype: StDType } {
  if (dtype === 'float32') return { shape, data: a, dtype: 'F32' };
  const out = new Uint16Array(a.length);
  if (dtype === 'bfloat16') {
    const u = new Uint32Array(a.buffer, a.byteOffset, a.length);
    for (let i = 0; i < u.length; i++) out[i] = bf16Bits(u[i]);
    return { shape, data: out, dtype: 'BF16' };
  }
  for (let i = 0; i < a.length; i++) out[i] = floatToHalf(a[i]);
  return { shape, data: out, dtype: 'F16' };
}

/** bfloat16 bits of the f32 with bits `x`: NaN stays a (quiet) NaN; otherwise the low 16 bits rounded to nearest, ties to even. */
function bf16Bits(x: number): number {
  return (x & 0x7fffffff) > 0x7f800000 ? (x >>> 16) | 0x40 : ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

/** `a` rounded to bfloat16 (nearest, ties to even) and widened back to f32: the values a BF16 tensor of `a` reads as. */
export function roundedToBf16(a: Float32Array): Float32Array {
  const out = new Float32Array(a.length),
    o = new Uint32Array(out.buffer),
    u = new Uint32Array(a.buffer, a.byteOffset, a.length);
  for (let i = 0; i < u.length; i++) o[i] = bf16Bits(u[i]) << 16;
  return out;
}

const f32buf = new Float32Array(1),
  u32buf = new Uint32Array(f32buf.buffer);

/** IEEE 754 binary16 bits of x, round to nearest even (overflow → ±Infinity). */
export function floatToHalf(x: number): number {
  f32buf[0] = x;
  const u = u32buf[0];
  const sign = (u >>> 16) & 0x8000,
    exp = (u >>> 23) & 0xff,
    mant = u & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    // subnormal: shift the implicit-1 mantissa, round to nearest even
    const m = mant | 0x800000,
      shift = 14 - e;
    const half = m >>> shift,
      rem = m & ((1 << shift) - 1),
      mid = 1 << (shift - 1);
    return sign | (half + (rem > mid || (rem === mid && half & 1) ? 1 : 0));
  }
  const half = (e << 10) | (mant >>> 13),
    rem = mant & 0x1fff;
  return sign | (half + (rem > 0x1000 || (rem === 0x1000 && half & 1) ? 1 : 0));
}
