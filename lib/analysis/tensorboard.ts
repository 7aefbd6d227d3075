/**
 * TensorBoard event files, written without TensorFlow: TFRecord framing (lib/analysis/tfrecord.ts)
 * around hand-encoded `tensorflow.Event` protobufs.
 *
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 *
 * A file starts with an Event carrying file_version "brain.Event:2"; each scalar is one Event with
 * one Summary.Value. TensorBoard loads every file whose name contains "tfevents" in the log
 * directory; tags with '/' (actor/pg_loss) are grouped by their prefix.
 *
 * Two writers, one file: after the fact `rlstream report --tensorboard` (exportRunToTensorBoard,
 * from the step_metrics table), and live during training when `trainer.logger` includes
 * `tensorboard` (LiveTensorBoard in lib/analysis/tensorboard-live.ts, driven by app/run.ts:
 * appends each settled step's scalars, then replaces the file with the export when the run
 * completes). Both write `<run_dir>/tensorboard/<runEventFileName>`, so a report export after a
 * live run replaces the live file instead of adding a second copy of every scalar.
 */
import {
  closeSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  writeSync,
} from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import type { Db } from '../db/database.ts';
import { RlError } from '../errors.ts';
import { decodeRecords, encodeRecord } from './tfrecord.ts';

export const FILE_VERSION = 'brain.Event:2';

// ---- protobuf wire format (only what Event needs) ---------------------------------------------

const WT_VARINT = 0,
  WT_I64 = 1,
  WT_LEN = 2,
  WT_I32 = 5;

/** Base-128 varint; negative int64 values take 10 bytes (two's complement), as protobuf does. */
export function encodeVarint(v: number | bigint): number[] {
  let x = BigInt.asUintN(64, BigInt(v));
  const out: number[] = [];
  while (x >= 0x80n) {
    out.push(Number(x & 0x7fn) | 0x80);
    x >>= 7n;
  }
  out.push(Number(x));
  return out;
}

const key = (field: number, wireType: number) => encodeVarint((field << 3) | wireType);

function lenField(field: number, bytes: Uint8Array): number[] {
  return [...key(field, WT_LEN), ...encodeVarint(bytes.length), ...bytes];
}

function doubleField(field: number, v: number): number[] {
  const b = Buffer.alloc(8);
  b.writeDoubleLE(v, 0);
  return [...key(field, WT_I64), ...b];
}

function floatField(field: number, v: number): number[] {
  const b = Buffer.alloc(4);
  b.writeFloatLE(v, 0);
  return [...key(field, WT_I32), ...b];
}

export interface ScalarEvent {
  tag: string;
  step: number;
  value: number;
  wallTime: number;
}

/** The first Event of every file. */
export function encodeFileVersionEvent(wallTime: number): Uint8Array {
  return Uint8Array.from([...doubleField(1, wallTime), ...lenField(3, Buffer.from(FILE_VERSION, 'utf8'))]);
}

/** One scalar as an Event (the value is stored as float32, as TensorBoard's simple_value). */
export function encodeScalarEvent(e: ScalarEvent): Uint8Array {
  const value = Uint8Array.from([...lenField(1, Buffer.from(e.tag, 'utf8')), ...floatField(2, e.value)]);
  const summary = Uint8Array.from(lenField(1, value));
  return Uint8Array.from([
    ...doubleField(1, e.wallTime),
    ...key(2, WT_VARINT),
    ...encodeVarint(e.step),
    ...lenField(5, summary),
  ]);
}

interface RawField {
  field: number;
  wireType: number;
  varint?: bigint;
  bytes?: Buffer;
}

/** Splits a protobuf message into fields (unknown fields are returned too, and skipped by callers). */
function parseFields(buf: Buffer, what: string): RawField[] {
  const out: RawField[] = [];
  let off = 0;
  const varint = (): bigint => {
    let result = 0n,
      shift = 0n;
    for (;;) {
      if (off >= buf.length) throw new RlError(`${what}: truncated varint`, { code: 'ERR_TFRECORD' });
      const b = buf[off++];
      result |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return result;
      shift += 7n;
      if (shift > 63n) throw new RlError(`${what}: varint longer than 10 bytes`, { code: 'ERR_TFRECORD' });
    }
  };
  const take = (n: number): Buffer => {
    if (off + n > buf.length)
      throw new RlError(`${what}: field runs past the end of the message`, { code: 'ERR_TFRECORD' });
    const b = buf.subarray(off, off + n);
    off += n;
    return b;
  };
  while (off < buf.length) {
    const k = Number(varint());
    const field = k >>> 3,
      wireType = k & 7;
    if (wireType === WT_VARINT) out.push({ field, wireType, varint: varint() });
    else if (wireType === WT_I64) out.push({ field, wireType, bytes: take(8) });
    else if (wireType === WT_I32) out.push({ field, wireType, bytes: take(4) });
    else if (wireType === WT_LEN) out.push({ field, wireType, bytes: take(Number(varint())) });
    else throw new RlError(`${what}: unsupported wire type ${wireType} (field ${field})`, { code: 'ERR_TFRECORD' });
  }
  return out;
}

export interface DecodedEvent {
  wallTime: number;
  step: number;
  fileVersion?: string;
  /** Scalars of the event's summary (tag, simple_value). */
  values: Array<{ tag: string; value: number }>;
}

export function decodeEvent(data: Uint8Array): DecodedEvent {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  const ev: DecodedEvent = { wallTime: 0, step: 0, values: [] };
  for (const f of parseFields(buf, 'Event')) {
    if (f.field === 1 && f.wireType === WT_I64) ev.wallTime = f.bytes!.readDoubleLE(0);
    else if (f.field === 2 && f.wireType === WT_VARINT) ev.step = Number(BigInt.asIntN(64, f.varint!));
    else if (f.field === 3 && f.wireType === WT_LEN) ev.fileVersion = f.bytes!.toString('utf8');
    else if (f.field === 5 && f.wireType === WT_LEN) {
      for (const v of parseFields(f.bytes!, 'Summary')) {
        if (v.field !== 1 || v.wireType !== WT_LEN) continue;
        let tag = '',
          value: number | undefined;
        for (const x of parseFields(v.bytes!, 'Summary.Value')) {
          if (x.field === 1 && x.wireType === WT_LEN) tag = x.bytes!.toString('utf8');
          else if (x.field === 2 && x.wireType === WT_I32) value = x.bytes!.readFloatLE(0);
        }
        if (value !== undefined) ev.values.push({ tag, value });
      }
    }
  }
  return ev;
}

// ---- files ----------------------------------------------------------------------------------------

export function isEventFileName(name: string): boolean {
  return name.includes('tfevents') && !name.startsWith('.');
}

/** Reads one event file: every Event, CRCs verified. */
export function readEventFile(path: string): { events: DecodedEvent[]; truncatedAt?: number } {
  const { records, truncatedAt } = decodeRecords(readFileSync(path), path);
  return { events: records.map(decodeEvent), truncatedAt };
}

/** All scalars in an event file or in every event file of a directory (name order). */
export function readScalars(pathOrDir: string): ScalarEvent[] {
  const files = statSync(pathOrDir).isDirectory()
    ? readdirSync(pathOrDir)
        .filter(isEventFileName)
        .sort()
        .map((f) => join(pathOrDir, f))
    : [pathOrDir];
  const out: ScalarEvent[] = [];
  for (const f of files) {
    for (const ev of readEventFile(f).events) {
      for (const v of ev.values) out.push({ tag: v.tag, step: ev.step, value: v.value, wallTime: ev.wallTime });
    }
  }
  return out;
}

let writerCounter = 0;

export interface TensorBoardWriterOptions {
  /** File name inside the directory; default `events.out.tfevents.<secs>.<host>.<pid>.<n>`. */
  filename?: string;
  /** Write to a temporary name and rename on close (replaces an existing file of that name). */
  atomic?: boolean;
  /** Wall time of the file_version event, seconds since the epoch (default now). */
  wallTime?: number;
  /** Buffered events that trigger a flush (default 256). */
  flushEvery?: number;
}

/**
 * Appends scalar events to one event file. `scalar` buffers; `flush` writes the buffered records
 * (whole records per write, so a crash leaves at most a truncated last record, which readers skip).
 */
export class TensorBoardWriter {
  readonly path: string;
  private readonly writePath: string;
  private fd: number | undefined;
  private pending: Buffer[] = [];
  private readonly flushEvery: number;

  constructor(
    readonly dir: string,
    opts: TensorBoardWriterOptions = {},
  ) {
    const wallTime = opts.wallTime ?? Date.now() / 1000;
    if (!Number.isFinite(wallTime))
      throw new RlError(`TensorBoard writer: wallTime must be finite, got ${wallTime}`, { code: 'ERR_BAD_INPUT' });
    const name =
      opts.filename ??
      `events.out.tfevents.${Math.floor(wallTime)}.${hostname().replace(/[^A-Za-z0-9._-]/g, '_')}.${process.pid}.${writerCounter++}`;
    if (!isEventFileName(name) || name.includes('/'))
      throw new RlError(`TensorBoard event file name must contain "tfevents" and no "/", got ${JSON.stringify(name)}`, {
        code: 'ERR_BAD_INPUT',
      });
    mkdirSync(dir, { recursive: true });
    this.path = join(dir, name);
    this.writePath = opts.atomic ? join(dir, `.${name.replace('tfevents', 'tmp')}.${process.pid}.partial`) : this.path;
    this.flushEvery = opts.flushEvery ?? 256;
    this.fd = openSync(this.writePath, opts.atomic ? 'w' : 'a');
    if (opts.atomic || statSync(this.writePath).size === 0)
      this.pending.push(encodeRecord(encodeFileVersionEvent(wallTime)));
    this.flush();
  }

  /** Buffers one scalar. `wallTime` in seconds since the epoch (default now). */
  scalar(tag: string, step: number, value: number, wallTime: number = Date.now() / 1000): void {
    if (this.fd === undefined)
      throw new RlError(`TensorBoard writer for ${this.path} is closed`, { code: 'ERR_CLOSED' });
    if (typeof tag !== 'string' || tag.length === 0)
      throw new RlError('TensorBoard scalar: tag must be a non-empty string', { code: 'ERR_BAD_INPUT' });
    if (!Number.isSafeInteger(step))
      throw new RlError(`TensorBoard scalar ${tag}: step must be an integer, got ${step}`, { code: 'ERR_BAD_INPUT' });
    if (typeof value !== 'number')
      throw new RlError(`TensorBoard scalar ${tag}: value must be a number, got ${typeof value}`, {
        code: 'ERR_BAD_INPUT',
      });
    if (!Number.isFinite(wallTime))
      throw new RlError(`TensorBoard scalar ${tag}: wallTime must be finite, got ${wallTime}`, {
        code: 'ERR_BAD_INPUT',
      });
    this.pending.push(encodeRecord(encodeScalarEvent({ tag, step, value, wallTime })));
    if (this.pending.length >= this.flushEvery) this.flush();
  }

  /** Buffers several scalars of one step. */
  scalars(step: number, values: Record<string, number>, wallTime?: number): void {
    for (const [tag, v] of Object.entries(values)) this.scalar(tag, step, v, wallTime);
  }

  flush(): void {
    if (this.fd === undefined || this.pending.length === 0) return;
    const buf = Buffer.concat(this.pending);
    this.pending = [];
    let off = 0;
    while (off < buf.length) off += writeSync(this.fd, buf, off, buf.length - off);
  }

  close(): void {
    if (this.fd === undefined) return;
    this.flush();
    closeSync(this.fd);
    this.fd = undefined;
    if (this.writePath !== this.path) renameSync(this.writePath, this.path);
  }

  /** Closes without publishing an atomic file (its temporary file is removed). */
  abort(): void {
    if (this.fd === undefined) return;
    closeSync(this.fd);
    this.fd = undefined;
    if (this.writePath !== this.path) rmSync(this.writePath, { force: true });
  }
}

/** The event file name of a run (the export's and the live logger's): `events.out.tfevents.<run created>.rlstream-export.<run>`. */
export function runEventFileName(runId: string, createdSeconds: number): string {
  return `events.out.tfevents.${Math.floor(createdSeconds)}.rlstream-export.${runId}`;
}

/** When the run's row was created, in seconds since the epoch (the wall time of its file_version event). */
export async function runCreatedSeconds(db: Db, runId: string): Promise<number> {
  const run = (
    await sql<{
      created: number;
    }>`select extract(epoch from created_at)::float8 as created from runs where run_id = ${runId}`.execute(db)
  ).rows[0];
  if (!run)
    throw new RlError(`run ${JSON.stringify(runId)} is not in this database; nothing to export to TensorBoard`, {
      code: 'ERR_UNKNOWN_RUN',
    });
  return run.created;
}

/**
 * Writes every step metric of a run to `<dir>/events.out.tfevents.<run created>.rlstream-export.<run>`
 * (tag = metric name, wall time = when the row was written). Re-exporting replaces that file.
 */
export async function exportRunToTensorBoard(
  db: Db,
  runId: string,
  dir: string,
): Promise<{ path: string; scalars: number; tags: string[] }> {
  const created = await runCreatedSeconds(db, runId);
  const rows = (
    await sql<{ step: number; name: string; value: number; wall: number }>`
    select step, name, value, extract(epoch from created_at)::float8 as wall
    from step_metrics where run_id = ${runId} order by step, name`.execute(db)
  ).rows;
  const writer = new TensorBoardWriter(dir, {
    filename: runEventFileName(runId, created),
    atomic: true,
    wallTime: created,
  });
  const tags = new Set<string>();
  try {
    for (const r of rows) {
      writer.scalar(r.name, r.step, r.value, r.wall);
      tags.add(r.name);
    }
    writer.close();
  } catch (e) {
    writer.abort();
    throw e;
  }
  return { path: writer.path, scalars: rows.length, tags: [...tags].sort() };
}
