/**
 * The trajectories table as data: one column list drives validation, the binary COPY encoding
 * (both adapters: PGlite COPY from a blob, PostgreSQL COPY FROM STDIN), the array-parameter
 * `unnest` insert (PostgreSQL inside a caller's transaction), the multi-row VALUES insert (the
 * benchmark's reference) and the decoding of rows read back.
 *
 * Binary COPY is used rather than text: formatting a float as text costs ~130 ns in V8 and a
 * realistic row carries ~800 of them, which alone would cap ingest near 10k rows/s; writing
 * float4 bits costs ~7 ns. Values are stored as real (float32): Math.fround(x) exactly.
 */
import { RlError } from '../errors.ts';
import type { JsonObject, NumberArray, StoredTrajectory, TrajectoryRow } from './port.ts';

/**
 * PostgreSQL text and jsonb cannot hold U+0000, but decoding a response can yield it (an untrained
 * policy over the byte tokenizer samples byte 0). The token ids are the truth (prompt_tokens,
 * response_tokens, and the Avro messages in the log keep the text exactly); the text columns are
 * for reading, so a NUL is stored there as the visible ␀ (U+2400 SYMBOL FOR NULL) instead of
 * stopping the run. The same holds for ground_truth, reward_details strings, failure and filter
 * reasons, and the validation generations. Ids and run ids are ours and never contain one.
 */
export const NUL_IN_TEXT = '\u2400';

/** `s` with every U+0000 replaced by ␀ (U+2400), so PostgreSQL text can store it. */
export function storableText(s: string): string {
  return s.includes('\u0000') ? s.replaceAll('\u0000', NUL_IN_TEXT) : s;
}

const storableOrNull = (s: string | null | undefined): string | null | undefined =>
  typeof s === 'string' ? storableText(s) : s;

/** JSON text with every escaped NUL (`\\u0000`, which jsonb refuses) written as ␀ instead. */
export function storableJson(text: string): string {
  if (!text.includes('\\u0000')) return text;
  return text.replace(/\\(?:u[0-9a-fA-F]{4}|["\\/bfnrt])/g, (m) => (m === '\\u0000' ? NUL_IN_TEXT : m));
}

type ColumnKind = 'text' | 'int4' | 'float8' | 'bool' | 'jsonb' | 'int4[]' | 'float4[]' | 'text[]' | 'bool[]';

interface Column {
  name: string;
  kind: ColumnKind;
  get(row: TrajectoryRow): unknown;
}

const col = (name: string, kind: ColumnKind, get: (row: TrajectoryRow) => unknown): Column => ({ name, kind, get });

/** Every column the store writes, in COPY order. created_at is set by the server. */
export const TRAJECTORY_COLUMNS: readonly Column[] = [
  col('run_id', 'text', (r) => r.runId),
  col('id', 'text', (r) => r.id),
  col('step', 'int4', (r) => r.step),
  col('epoch', 'int4', (r) => r.epoch),
  col('kind', 'text', (r) => r.kind),
  col('group_uid', 'text', (r) => r.groupUid),
  col('prompt_index', 'int4', (r) => r.promptIndex),
  col('sample_index', 'int4', (r) => r.sampleIndex),
  col('policy_version', 'int4', (r) => r.policyVersion),
  col('prompt_tokens', 'int4[]', (r) => r.promptTokens),
  col('response_tokens', 'int4[]', (r) => r.responseTokens),
  col('prompt_text', 'text', (r) => storableOrNull(r.promptText)),
  col('response_text', 'text', (r) => storableOrNull(r.responseText)),
  col('ground_truth', 'text', (r) => storableOrNull(r.groundTruth)),
  col('behaviour_logprobs', 'float4[]', (r) => r.behaviourLogprobs),
  col('ref_logprobs', 'float4[]', (r) => r.refLogprobs),
  col('old_logprobs', 'float4[]', (r) => r.oldLogprobs),
  col('advantages', 'float4[]', (r) => r.advantages),
  col('advantage', 'float8', (r) => r.advantage),
  col('returns', 'float4[]', (r) => r.returns),
  col('reward', 'float8', (r) => r.reward),
  col('reward_details', 'jsonb', (r) => rewardDetailsJson(r)),
  col('reward_failure', 'text', (r) => storableOrNull(r.rewardFailure)),
  col('response_length', 'int4', (r) => r.responseTokens.length),
  col('finish_reason', 'text', (r) => storableOrNull(r.finishReason)),
  col('filtered', 'bool', (r) => r.filtered),
  col('filter_reason', 'text', (r) => storableOrNull(r.filterReason)),
  col('staleness', 'int4', (r) => r.staleness),
  col('image_hashes', 'text[]', (r) => r.imageHashes ?? []),
  col('vppo_perturbed_logprobs', 'float4[]', (r) => r.vppoPerturbedLogprobs),
  col('vppo_token_mask', 'bool[]', (r) => r.vppoTokenMask),
  col('vppo_scaling_factor', 'float8', (r) => r.vppoScalingFactor),
  col('vppo_entropies', 'float4[]', (r) => r.vppoEntropies),
  col('generated_image_hash', 'text', (r) => r.generatedImageHash ?? null),
];

export const TRAJECTORY_COLUMN_LIST = TRAJECTORY_COLUMNS.map((c) => c.name).join(', ');

/** rewardDetails as JSON text, serialised once by validateTrajectory and reused by the encoders. */
const detailsJson = new WeakMap<TrajectoryRow, string | null>();

function rewardDetailsJson(row: TrajectoryRow): string | null {
  const cached = detailsJson.get(row);
  if (cached !== undefined) return cached;
  return row.rewardDetails == null ? null : storableJson(JSON.stringify(row.rewardDetails));
}

// ---------------------------------------------------------------------------------------------
// Validation: every row is checked before anything is written, with a message that names the row
// and the field. The database constraints repeat the invariants that matter for SQL analysis.

const INT32_MIN = -2147483648;
const INT32_MAX = 2147483647;

function bad(row: { id?: unknown }, field: string, what: string): RlError {
  return new RlError(`trajectory ${JSON.stringify(row.id)}: ${field} ${what}`, {
    retriable: false,
    code: 'ERR_BAD_TRAJECTORY',
    details: { id: row.id, field },
  });
}

/** `free`: decoded or user text, whose NULs are stored as ␀ (see storableText); otherwise an id, where a NUL is refused. */
function checkText(row: TrajectoryRow, field: string, v: unknown, nullable: boolean, free = false): void {
  if (v === null || v === undefined) {
    if (!nullable) throw bad(row, field, 'is required (a string)');
    return;
  }
  if (typeof v !== 'string') throw bad(row, field, `must be a string, got ${typeof v}`);
  if (!free && v.includes('\u0000'))
    throw bad(row, field, 'contains a NUL character (U+0000), which an id cannot hold');
}

function checkInt(row: TrajectoryRow, field: string, v: unknown, min = 0): void {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > INT32_MAX) {
    throw bad(row, field, `must be an integer in [${min}, ${INT32_MAX}], got ${String(v)}`);
  }
}

function isNumberArray(v: unknown): v is NumberArray {
  return (
    Array.isArray(v) ||
    (ArrayBuffer.isView(v) &&
      !(v instanceof DataView) &&
      !(v instanceof BigInt64Array) &&
      !(v instanceof BigUint64Array))
  );
}

function checkIntArray(row: TrajectoryRow, field: string, v: unknown): void {
  if (!isNumberArray(v)) throw bad(row, field, 'must be an array of int32 token ids');
  if (
    v instanceof Int32Array ||
    v instanceof Int16Array ||
    v instanceof Int8Array ||
    v instanceof Uint16Array ||
    v instanceof Uint8Array
  )
    return;
  for (let i = 0; i < v.length; i++) {
    const x = v[i];
    if (typeof x !== 'number' || !Number.isInteger(x) || x < INT32_MIN || x > INT32_MAX) {
      throw bad(row, `${field}[${i}]`, `must be an int32 integer, got ${String(x)}`);
    }
  }
}

function checkRealArray(row: TrajectoryRow, field: string, v: unknown, length: number, nullable: boolean): void {
  if (v === null || v === undefined) {
    if (!nullable) throw bad(row, field, 'is required (one number per response token)');
    return;
  }
  if (!isNumberArray(v)) throw bad(row, field, 'must be an array of numbers');
  if (v.length !== length)
    throw bad(row, field, `has ${v.length} values but the response has ${length} tokens (one per response token)`);
  if (v instanceof Float32Array) return;
  for (let i = 0; i < v.length; i++) {
    const x = v[i];
    if (typeof x !== 'number') throw bad(row, `${field}[${i}]`, `must be a number, got ${typeof x}`);
    // NaN and ±Infinity are stored as such; a finite value beyond float32 would silently become Infinity.
    if (Number.isFinite(x) && !Number.isFinite(Math.fround(x)))
      throw bad(row, `${field}[${i}]`, `${x} is outside the range of real (float32)`);
  }
}

export function validateTrajectory(row: TrajectoryRow): void {
  if (row === null || typeof row !== 'object')
    throw new RlError('trajectory must be an object', { code: 'ERR_BAD_TRAJECTORY' });
  if (typeof row.id !== 'string' || row.id.length === 0) throw bad(row, 'id', 'must be a non-empty string');
  if (typeof row.runId !== 'string' || row.runId.length === 0) throw bad(row, 'runId', 'must be a non-empty string');
  checkText(row, 'id', row.id, false);
  checkText(row, 'runId', row.runId, false);
  checkInt(row, 'step', row.step);
  checkInt(row, 'epoch', row.epoch);
  if (row.kind !== 'train' && row.kind !== 'val')
    throw bad(row, 'kind', `must be 'train' or 'val', got ${JSON.stringify(row.kind)}`);
  checkText(row, 'groupUid', row.groupUid, false);
  checkInt(row, 'promptIndex', row.promptIndex);
  checkInt(row, 'sampleIndex', row.sampleIndex);
  checkInt(row, 'policyVersion', row.policyVersion);
  checkInt(row, 'staleness', row.staleness);
  checkIntArray(row, 'promptTokens', row.promptTokens);
  checkIntArray(row, 'responseTokens', row.responseTokens);
  checkText(row, 'promptText', row.promptText, false, true);
  checkText(row, 'responseText', row.responseText, false, true);
  checkText(row, 'groundTruth', row.groundTruth, true, true);
  const n = row.responseTokens.length;
  checkRealArray(row, 'behaviourLogprobs', row.behaviourLogprobs, n, false);
  checkRealArray(row, 'refLogprobs', row.refLogprobs, n, true);
  checkRealArray(row, 'oldLogprobs', row.oldLogprobs, n, true);
  checkRealArray(row, 'advantages', row.advantages, n, true);
  checkRealArray(row, 'returns', row.returns, n, true);
  if (row.advantage !== null && row.advantage !== undefined && typeof row.advantage !== 'number')
    throw bad(row, 'advantage', 'must be a number or null');
  if (row.reward === null || row.reward === undefined) {
    if (typeof row.rewardFailure !== 'string' || row.rewardFailure.length === 0) {
      throw bad(
        row,
        'reward',
        'is null but rewardFailure does not say why; a failed score is stored as reward null plus the failure reason (never as 0)',
      );
    }
  } else {
    if (typeof row.reward !== 'number' || !Number.isFinite(row.reward))
      throw bad(row, 'reward', `must be a finite number or null, got ${String(row.reward)}`);
    if (row.rewardFailure !== null && row.rewardFailure !== undefined)
      throw bad(row, 'rewardFailure', 'must be null when a reward is given');
  }
  checkText(row, 'rewardFailure', row.rewardFailure, true, true);
  if (row.rewardDetails === null || row.rewardDetails === undefined) {
    detailsJson.set(row, null);
  } else {
    if (typeof row.rewardDetails !== 'object' || Array.isArray(row.rewardDetails))
      throw bad(row, 'rewardDetails', 'must be a JSON object or null');
    let text: string;
    try {
      text = JSON.stringify(row.rewardDetails);
    } catch (e) {
      throw bad(row, 'rewardDetails', `is not JSON-serialisable: ${(e as Error).message}`);
    }
    // jsonb refuses the escape \u0000 (JSON.stringify writes NUL that way): stored as ␀
    detailsJson.set(row, storableJson(text));
  }
  checkText(row, 'finishReason', row.finishReason, true, true);
  if (typeof row.filtered !== 'boolean') throw bad(row, 'filtered', 'must be a boolean');
  if (row.filtered && (typeof row.filterReason !== 'string' || row.filterReason.length === 0))
    throw bad(row, 'filterReason', 'is required when filtered is true');
  if (!row.filtered && row.filterReason !== null && row.filterReason !== undefined)
    throw bad(row, 'filterReason', 'must be null when filtered is false');
  checkText(row, 'filterReason', row.filterReason, true, true);
  if (row.imageHashes !== undefined && row.imageHashes !== null) {
    if (!Array.isArray(row.imageHashes)) throw bad(row, 'imageHashes', 'must be an array of image hashes');
    row.imageHashes.forEach((h, i) => {
      if (typeof h !== 'string' || !/^[0-9a-f]{64}$/.test(h))
        throw bad(row, `imageHashes[${i}]`, `must be a lower-case hex sha256, got ${JSON.stringify(h)}`);
    });
  }
  checkRealArray(row, 'vppoPerturbedLogprobs', row.vppoPerturbedLogprobs, n, true);
  checkRealArray(row, 'vppoEntropies', row.vppoEntropies, n, true);
  const m = row.vppoTokenMask;
  if (m !== undefined && m !== null) {
    if (!Array.isArray(m) && !(m instanceof Uint8Array))
      throw bad(row, 'vppoTokenMask', 'must be an array of booleans (or 0/1)');
    if (m.length !== n)
      throw bad(
        row,
        'vppoTokenMask',
        `has ${m.length} values but the response has ${n} tokens (one per response token)`,
      );
    for (let i = 0; i < m.length; i++) {
      const x: unknown = m[i];
      if (x !== true && x !== false && x !== 0 && x !== 1)
        throw bad(row, `vppoTokenMask[${i}]`, `must be a boolean (or 0/1), got ${String(x)}`);
    }
  }
  const gh = row.generatedImageHash;
  if (gh !== undefined && gh !== null && (typeof gh !== 'string' || !/^[0-9a-f]{64}$/.test(gh)))
    throw bad(row, 'generatedImageHash', `must be a lower-case hex sha256 or null, got ${JSON.stringify(gh)}`);
  const a = row.vppoScalingFactor;
  if (a !== undefined && a !== null && (typeof a !== 'number' || !Number.isFinite(a) || a < 0))
    throw bad(row, 'vppoScalingFactor', `must be a finite number ≥ 0 or null, got ${String(a)}`);
}

// ---------------------------------------------------------------------------------------------
// Binary COPY (PostgreSQL "binary" COPY format: signature, flags, header extension; per tuple an
// int16 field count then int32 length + bytes per field, -1 for NULL; int16 -1 trailer).

const SIGNATURE = Buffer.from([0x50, 0x47, 0x43, 0x4f, 0x50, 0x59, 0x0a, 0xff, 0x0d, 0x0a, 0x00]);
const OID_INT4 = 23;
const OID_FLOAT4 = 700;
const OID_TEXT = 25;
const OID_BOOL = 16;
const HEADER_BYTES = 19;

// Element loops, one per input type so each stays monomorphic (a mixed Array/typed-array loop is
// several times slower). Each element is int32 length 4, then the value, big-endian.
function putFloat32Typed(v: DataView, p: number, a: Float32Array): number {
  for (let i = 0; i < a.length; i++) {
    v.setInt32(p, 4);
    v.setFloat32(p + 4, a[i]!);
    p += 8;
  }
  return p;
}
function putFloat32Plain(v: DataView, p: number, a: readonly number[]): number {
  for (let i = 0; i < a.length; i++) {
    v.setInt32(p, 4);
    v.setFloat32(p + 4, a[i]!);
    p += 8;
  }
  return p;
}
function putInt32Typed(v: DataView, p: number, a: Int32Array): number {
  for (let i = 0; i < a.length; i++) {
    v.setInt32(p, 4);
    v.setInt32(p + 4, a[i]!);
    p += 8;
  }
  return p;
}
function putInt32Plain(v: DataView, p: number, a: readonly number[]): number {
  for (let i = 0; i < a.length; i++) {
    v.setInt32(p, 4);
    v.setInt32(p + 4, a[i]!);
    p += 8;
  }
  return p;
}
function putOther(v: DataView, p: number, a: NumberArray, float: boolean): number {
  for (let i = 0; i < a.length; i++) {
    v.setInt32(p, 4);
    if (float) v.setFloat32(p + 4, a[i]!);
    else v.setInt32(p + 4, a[i]!);
    p += 8;
  }
  return p;
}

/** Upper bound of a row's encoded size (texts counted at 3 bytes per UTF-16 unit). */
function rowBytesBound(row: TrajectoryRow): number {
  let n = 2;
  for (const c of TRAJECTORY_COLUMNS) {
    const v = c.get(row);
    if (v === null || v === undefined) {
      n += 4;
      continue;
    }
    switch (c.kind) {
      case 'text':
        n += 4 + 3 * (v as string).length;
        break;
      case 'jsonb':
        n += 5 + 3 * (v as string).length;
        break;
      case 'int4':
        n += 8;
        break;
      case 'float8':
        n += 12;
        break;
      case 'bool':
        n += 5;
        break;
      case 'int4[]':
      case 'float4[]':
        n += 24 + 8 * (v as NumberArray).length;
        break;
      case 'text[]':
        n += 24;
        for (const x of v as readonly string[]) n += 4 + 3 * x.length;
        break;
      case 'bool[]':
        n += 24 + 5 * (v as ArrayLike<unknown>).length;
        break;
    }
  }
  return n;
}

/** Writes rows (with the stream header and/or trailer when asked) into a buffer sized by rowBytesBound. */
function encodeChunk(rows: readonly TrajectoryRow[], bound: number, header: boolean, trailer: boolean): Buffer {
  const buf = Buffer.allocUnsafe(HEADER_BYTES + bound + 2);
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let p = 0;
  if (header) {
    SIGNATURE.copy(buf, 0);
    v.setInt32(11, 0); // flags
    v.setInt32(15, 0); // header extension length
    p = HEADER_BYTES;
  }
  const fields = TRAJECTORY_COLUMNS.length;
  for (const row of rows) {
    v.setInt16(p, fields);
    p += 2;
    for (const c of TRAJECTORY_COLUMNS) {
      const x = c.get(row);
      if (x === null || x === undefined) {
        v.setInt32(p, -1);
        p += 4;
        continue;
      }
      switch (c.kind) {
        case 'text': {
          const n = buf.write(x as string, p + 4, 'utf8');
          v.setInt32(p, n);
          p += 4 + n;
          break;
        }
        case 'jsonb': {
          const n = buf.write(x as string, p + 5, 'utf8');
          v.setInt32(p, n + 1);
          buf[p + 4] = 1;
          p += 5 + n;
          break;
        }
        case 'int4':
          v.setInt32(p, 4);
          v.setInt32(p + 4, x as number);
          p += 8;
          break;
        case 'float8':
          v.setInt32(p, 8);
          v.setFloat64(p + 4, x as number);
          p += 12;
          break;
        case 'bool':
          v.setInt32(p, 1);
          buf[p + 4] = x ? 1 : 0;
          p += 5;
          break;
        case 'text[]': {
          const a = x as readonly string[];
          const start = p;
          v.setInt32(p + 4, a.length === 0 ? 0 : 1); // dimensions
          v.setInt32(p + 8, 0); // no NULL elements
          v.setInt32(p + 12, OID_TEXT);
          p += 16;
          if (a.length > 0) {
            v.setInt32(p, a.length);
            v.setInt32(p + 4, 1); // length, lower bound
            p += 8;
            for (const t of a) {
              const n = buf.write(t, p + 4, 'utf8');
              v.setInt32(p, n);
              p += 4 + n;
            }
          }
          v.setInt32(start, p - start - 4);
          break;
        }
        case 'bool[]': {
          const a = x as ArrayLike<boolean | number>;
          const n = a.length;
          v.setInt32(p, n === 0 ? 12 : 20 + 5 * n);
          v.setInt32(p + 4, n === 0 ? 0 : 1); // dimensions
          v.setInt32(p + 8, 0); // no NULL elements
          v.setInt32(p + 12, OID_BOOL);
          if (n === 0) {
            p += 16;
            break;
          }
          v.setInt32(p + 16, n);
          v.setInt32(p + 20, 1); // length, lower bound
          p += 24;
          for (let i = 0; i < n; i++) {
            v.setInt32(p, 1);
            buf[p + 4] = a[i] ? 1 : 0;
            p += 5;
          }
          break;
        }
        case 'int4[]':
        case 'float4[]': {
          const a = x as NumberArray;
          const float = c.kind === 'float4[]';
          const n = a.length;
          v.setInt32(p, n === 0 ? 12 : 20 + 8 * n);
          v.setInt32(p + 4, n === 0 ? 0 : 1); // dimensions
          v.setInt32(p + 8, 0); // no NULL elements
          v.setInt32(p + 12, float ? OID_FLOAT4 : OID_INT4);
          if (n === 0) {
            p += 16;
            break;
          }
          v.setInt32(p + 16, n);
          v.setInt32(p + 20, 1); // length, lower bound
          p += 24;
          if (float) {
            if (a instanceof Float32Array) p = putFloat32Typed(v, p, a);
            else if (Array.isArray(a)) p = putFloat32Plain(v, p, a);
            else p = putOther(v, p, a, true);
          } else if (a instanceof Int32Array) p = putInt32Typed(v, p, a);
          else if (Array.isArray(a)) p = putInt32Plain(v, p, a);
          else p = putOther(v, p, a, false);
          break;
        }
      }
    }
  }
  if (trailer) {
    v.setInt16(p, -1);
    p += 2;
  }
  return buf.subarray(0, p);
}

/**
 * Encodes validated rows in chunks of about `maxBytes`, lazily (memory stays bounded and encoding
 * overlaps the server's parsing). `framing: 'stream'`: the chunks are consecutive pieces of one
 * COPY stream (header in the first, trailer in the last) for COPY FROM STDIN; `'per-chunk'`: each
 * chunk is a complete stream of its own, for one COPY statement per chunk (PGlite's blob).
 */
export function* encodeTrajectoriesBinary(
  rows: readonly TrajectoryRow[],
  framing: 'stream' | 'per-chunk',
  maxBytes = 4 << 20,
): Generator<Buffer> {
  let start = 0;
  if (rows.length === 0) {
    const empty = encodeChunk([], 0, true, true);
    yield empty;
    return;
  }
  while (start < rows.length) {
    let end = start;
    let bound = 0;
    while (end < rows.length && (end === start || bound < maxBytes)) bound += rowBytesBound(rows[end++]!);
    const whole = framing === 'per-chunk';
    yield encodeChunk(rows.slice(start, end), bound, whole || start === 0, whole || end === rows.length);
    start = end;
  }
}

// ---------------------------------------------------------------------------------------------
// Array literals for the parameterised paths. Floats are written as the 9 significant digits that
// identify the float32 value exactly, so both paths store the same Math.fround(x).

function realLiteral(x: number): string {
  const f = Math.fround(x);
  return Number.isFinite(f) ? f.toPrecision(9) : String(f); // NaN, Infinity, -Infinity
}

export function arrayLiteral(a: NumberArray, kind: 'int4[]' | 'float4[]'): string {
  const parts = new Array<string>(a.length);
  if (kind === 'int4[]') for (let i = 0; i < a.length; i++) parts[i] = String(a[i]);
  else for (let i = 0; i < a.length; i++) parts[i] = realLiteral(a[i]);
  return `{${parts.join(',')}}`;
}

const SQL_TYPE: Record<ColumnKind, string> = {
  text: 'text',
  int4: 'int4',
  float8: 'float8',
  bool: 'bool',
  jsonb: 'jsonb',
  'int4[]': 'int4[]',
  'float4[]': 'real[]',
  'text[]': 'text[]',
  'bool[]': 'bool[]',
};

/** A text[] literal, each element double-quoted with `"` and `\` escaped. */
function textArrayLiteral(a: readonly string[]): string {
  return `{${a.map((x) => `"${x.replace(/[\\"]/g, (c) => `\\${c}`)}"`).join(',')}}`;
}

/** Columns whose parameters travel as text literals and are cast per row. */
const viaLiteral = (k: ColumnKind) =>
  k === 'int4[]' || k === 'float4[]' || k === 'jsonb' || k === 'text[]' || k === 'bool[]';

/** The parameter for one cell: numbers, strings and booleans as node-postgres sends them. */
function paramValue(c: Column, row: TrajectoryRow): unknown {
  const v = c.get(row);
  if (v === null || v === undefined) return null;
  if (c.kind === 'int4[]' || c.kind === 'float4[]') return arrayLiteral(v as NumberArray, c.kind);
  if (c.kind === 'text[]') return textArrayLiteral(v as readonly string[]);
  if (c.kind === 'bool[]') return `{${Array.from(v as ArrayLike<boolean | number>, (x) => (x ? 't' : 'f')).join(',')}}`;
  return v; // numbers go as String(x): 'NaN' and 'Infinity' are valid float8 input
}

/**
 * `insert … select … from unnest($1::text[], $2::int4[], …)`: one parameter per column, however
 * many rows. Array-valued columns travel as text[] of array literals and are cast per row.
 */
export function unnestInsert(rows: readonly TrajectoryRow[]): { text: string; values: unknown[] } {
  const values = TRAJECTORY_COLUMNS.map((c) => rows.map((r) => paramValue(c, r)));
  const params = TRAJECTORY_COLUMNS.map((c, i) => {
    const carrier = viaLiteral(c.kind) ? 'text' : SQL_TYPE[c.kind];
    return `$${i + 1}::${carrier}[]`;
  });
  const select = TRAJECTORY_COLUMNS.map((c) =>
    viaLiteral(c.kind) ? `u.${c.name}::${SQL_TYPE[c.kind]}` : `u.${c.name}`,
  );
  const text = `insert into trajectories (${TRAJECTORY_COLUMN_LIST}) select ${select.join(', ')} from unnest(${params.join(', ')}) as u(${TRAJECTORY_COLUMN_LIST}) on conflict (run_id, id) do nothing`;
  return { text, values };
}

/** Plain multi-row `insert … values (…), (…)` — the reference the benchmark compares against. */
export function valuesInsert(rows: readonly TrajectoryRow[]): { text: string; values: unknown[] } {
  const values: unknown[] = [];
  const tuples = rows.map(
    (r) =>
      `(${TRAJECTORY_COLUMNS.map((c) => {
        values.push(paramValue(c, r));
        return `$${values.length}::${SQL_TYPE[c.kind]}`;
      }).join(', ')})`,
  );
  return {
    text: `insert into trajectories (${TRAJECTORY_COLUMN_LIST}) values ${tuples.join(', ')} on conflict (run_id, id) do nothing`,
    values,
  };
}

/** Rows per statement for the parameterised paths (bounded by 65535 bind parameters for VALUES). */
export const VALUES_ROWS_PER_STATEMENT = Math.floor(65535 / TRAJECTORY_COLUMNS.length);
export const UNNEST_ROWS_PER_STATEMENT = 2000;

// ---------------------------------------------------------------------------------------------
// COPY targets. COPY cannot skip duplicates: the ingest (trajectory-ingest.ts) drops ids already
// stored and COPYs straight into trajectories; if a concurrent writer stored some of them in the
// meantime it goes through a session-local staging table and `insert … on conflict do nothing`.
// The DO block creates that table once per session without a notice.

export const STAGING_TABLE = 'rlstream_trajectories_stage';

export const ENSURE_STAGING_SQL = `do $$ begin
  if to_regclass('pg_temp.${STAGING_TABLE}') is null then
    create temp table ${STAGING_TABLE} (like trajectories including defaults) on commit delete rows;
  end if;
end $$`;

export const MOVE_STAGED_SQL = `insert into trajectories (${TRAJECTORY_COLUMN_LIST}) select ${TRAJECTORY_COLUMN_LIST} from ${STAGING_TABLE} on conflict (run_id, id) do nothing`;

export const CLEAR_STAGING_SQL = `truncate ${STAGING_TABLE}`;

export type CopyTarget = 'trajectories' | 'staging';

export function copySql(target: CopyTarget, source: 'stdin' | 'blob'): string {
  const table = target === 'trajectories' ? 'trajectories' : STAGING_TABLE;
  const from = source === 'stdin' ? 'stdin' : `'/dev/blob'`;
  return `copy ${table} (${TRAJECTORY_COLUMN_LIST}) from ${from} with (format binary)`;
}

// ---------------------------------------------------------------------------------------------
// Decoding rows read back (node-postgres parses int4[]/real[] into number[], jsonb into objects).

export function decodeTrajectory(r: Record<string, any>): StoredTrajectory {
  return {
    id: r.id,
    runId: r.run_id,
    step: r.step,
    epoch: r.epoch,
    kind: r.kind,
    groupUid: r.group_uid,
    promptIndex: r.prompt_index,
    sampleIndex: r.sample_index,
    policyVersion: r.policy_version,
    promptTokens: r.prompt_tokens,
    responseTokens: r.response_tokens,
    promptText: r.prompt_text,
    responseText: r.response_text,
    groundTruth: r.ground_truth,
    behaviourLogprobs: r.behaviour_logprobs,
    refLogprobs: r.ref_logprobs,
    oldLogprobs: r.old_logprobs,
    advantages: r.advantages,
    advantage: r.advantage,
    returns: r.returns,
    reward: r.reward,
    rewardDetails: r.reward_details as JsonObject | null,
    rewardFailure: r.reward_failure,
    responseLength: r.response_length,
    finishReason: r.finish_reason,
    filtered: r.filtered,
    filterReason: r.filter_reason,
    staleness: r.staleness,
    imageHashes: r.image_hashes ?? [],
    vppoPerturbedLogprobs: r.vppo_perturbed_logprobs ?? null,
    vppoTokenMask: r.vppo_token_mask ?? null,
    vppoScalingFactor: r.vppo_scaling_factor ?? null,
    vppoEntropies: r.vppo_entropies ?? null,
    generatedImageHash: r.generated_image_hash ?? null,
    createdAt: r.created_at,
  };
}
