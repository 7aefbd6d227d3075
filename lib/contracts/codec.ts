/**
 * Codecs: records ⇄ Avro bytes, one per schema family, plus the wire framing that tells a reader
 * which schema wrote a message.
 *
 * `Codec<T>` (sync) encodes with the family's newest schema into a growing preallocated buffer
 * (avsc's `encode(val, buf, pos)` says how many bytes were missing: grow and retry; avsc's
 * `toBuffer` would encode a large record twice), then copies out exactly the bytes (or, with
 * `reuse`, returns a view valid until the next encode). Decoding validates everything: the Avro
 * bytes (truncation, trailing bytes, bad enum/union indexes), then the record rules of
 * invariants.ts; any failure is a PoisonMessageError saying which topic, which schema and what.
 * Records written with an older version are resolved into the newest (compat.ts).
 *
 * Wire formats (`pipeline.schema_wire_format`):
 *  - plain: the body is the Avro record; the writer schema travels in the message header
 *    `rl-schema: <family>.v<N>` (a message without it is read as the current version).
 *  - confluent: magic byte 0 + 4-byte big-endian schema id + the Avro record, ids from a schema
 *    registry (subject `<topic>-value`), as Confluent's serializers do.
 */
import { PoisonMessageError, RlError, isRetriable } from '../errors.ts';
import { parseSchema, type AvroType } from './avro.ts';
import { createCheckedResolver } from './compat.ts';
import { recordProblems } from './invariants.ts';
import { SchemaRegistryError, type SchemaRegistry } from './registry.ts';
import { parseRef, schemaCatalogue, type SchemaCatalogue, type SchemaFamily, type SchemaVersion } from './schemas.ts';
import type { SchemaValues } from './types.ts';

/** Message header carrying the writer schema in the plain wire format. */
export const SCHEMA_HEADER = 'rl-schema';
/** Confluent framing: magic byte + 4-byte schema id. */
export const CONFLUENT_MAGIC = 0;
export const CONFLUENT_HEADER_BYTES = 5;

export type WireFormat = 'plain' | 'confluent';
/** Message headers as Kafka clients hand them over. */
export type MessageHeaders = Record<string, string | Buffer | Array<string | Buffer> | undefined>;

/** A value that does not fit its schema or breaks a record rule: a bug in the producer. Not retriable. */
export class EncodeError extends RlError {
  constructor(message: string, details?: Record<string, unknown>) {
    super(message, { retriable: false, code: 'ERR_ENCODE', details });
    this.name = 'EncodeError';
  }
}

type Resolver = ReturnType<AvroType['createResolver']>;

export interface CodecOptions {
  /** Where schemas come from (default: schemas/). */
  catalogue?: SchemaCatalogue;
  /** Schema version written and read into (default: the family's newest). */
  ref?: string;
  /** Name used in error messages (e.g. the full topic name); default the family. */
  label?: string;
  /** Initial encode buffer size in bytes (default 64 KiB); it grows as needed. */
  initialBufferBytes?: number;
}

function describeValue(v: unknown): string {
  if (v === undefined) return 'undefined (missing)';
  if (v === null) return 'null';
  if (Array.isArray(v)) return `an array of length ${v.length}`;
  if (ArrayBuffer.isView(v))
    return `a ${v.constructor.name} of length ${(v as unknown as { length?: number }).length ?? v.byteLength}`;
  if (typeof v === 'object') return `a ${(v as object).constructor?.name ?? 'object'}`;
  const s = JSON.stringify(v);
  return `${typeof v} ${s && s.length > 60 ? `${s.slice(0, 60)}…` : s}`;
}

function describeType(t: AvroType): string {
  const n = t.typeName;
  if (n === 'logical:int32-le') return 'an Int32Array';
  if (n === 'logical:float32-le') return 'a Float32Array';
  if (n === 'bytes') return 'a Buffer';
  if (n === 'enum') return `one of ${(t as unknown as { symbols: string[] }).symbols.join('|')}`;
  if (n.startsWith('union')) return (t as unknown as { types: AvroType[] }).types.map(describeType).join(' or ');
  return n;
}

export class Codec<T> {
  readonly family: string;
  readonly schema: SchemaVersion;
  readonly label: string;
  private readonly catalogue: SchemaCatalogue;
  private readonly type: AvroType;
  private buf: Buffer;
  private readonly resolvers = new Map<string, Resolver | PoisonMessageError>();

  constructor(family: string, opts: CodecOptions = {}) {
    this.catalogue = opts.catalogue ?? schemaCatalogue();
    this.family = family;
    const sv = opts.ref ? this.catalogue.get(opts.ref) : this.catalogue.latest(family);
    if (!sv)
      throw new RlError(`unknown schema ${opts.ref}; known: ${this.catalogue.refs().join(', ')}`, {
        code: 'ERR_CONFIG',
      });
    if (sv.family !== family) throw new RlError(`schema ${sv.ref} is not of family ${family}`, { code: 'ERR_CONFIG' });
    this.schema = sv;
    this.type = sv.type;
    this.label = opts.label ?? family;
    this.buf = Buffer.allocUnsafe(Math.max(1024, opts.initialBufferBytes ?? 65536));
  }

  /** `<family>.v<N>`: the schema this codec writes. */
  get ref(): string {
    return this.schema.ref;
  }

  /** Headers to put on a plain-format message. */
  headers(): Record<string, string> {
    return { [SCHEMA_HEADER]: this.schema.ref };
  }

  /**
   * The Avro bytes of `value`. `reuse`: return a view of the codec's buffer, valid until its next
   * encode (no copy); otherwise a Buffer of its own.
   */
  encode(value: T, reuse = false): Buffer {
    const end = this.write(value, 0);
    return reuse ? this.buf.subarray(0, end) : Buffer.from(this.buf.subarray(0, end));
  }

  /** Like encode, with `prefix` bytes written before the record (wire framing). */
  encodeWithPrefix(value: T, prefix: Uint8Array, reuse = false): Buffer {
    const end = this.write(value, prefix.length);
    this.buf.set(prefix, 0);
    return reuse ? this.buf.subarray(0, end) : Buffer.from(this.buf.subarray(0, end));
  }

  private write(value: T, start: number): number {
    for (;;) {
      let pos: number;
      try {
        pos = this.type.encode(value, this.buf, start);
      } catch (e) {
        throw this.encodeError(value, e);
      }
      if (pos >= 0) {
        const problems = recordProblems(this.family as SchemaFamily, value);
        if (problems.length)
          throw new EncodeError(
            `${this.label}: cannot encode a ${this.schema.ref} record: ${problems.slice(0, 8).join('; ')}${problems.length > 8 ? ` (and ${problems.length - 8} more)` : ''}`,
            { schema: this.schema.ref, problems },
          );
        return pos;
      }
      // pos = -(bytes missing)
      const need = this.buf.length - pos;
      this.buf = Buffer.allocUnsafe(Math.max(need, this.buf.length * 2));
    }
  }

  private encodeError(value: T, cause: unknown): EncodeError {
    const problems: string[] = [];
    this.type.isValid(value, {
      errorHook: (path: string[], v: unknown, t: AvroType) => {
        if (problems.length < 8)
          problems.push(`${path.join('.') || '(record)'}: expected ${describeType(t)}, got ${describeValue(v)}`);
      },
    });
    const what = problems.length ? problems.join('; ') : ((cause as Error)?.message ?? String(cause));
    const e = new EncodeError(`${this.label}: cannot encode a ${this.schema.ref} record: ${what}`, {
      schema: this.schema.ref,
      problems,
    });
    (e as { cause?: unknown }).cause = cause;
    return e;
  }

  /** Decodes bytes written with `writerRef` (default: this codec's schema). Throws PoisonMessageError. */
  decode(bytes: Buffer, writerRef: string = this.schema.ref): T {
    if (writerRef === this.schema.ref) return this.decodeResolved(bytes, undefined, writerRef);
    return this.decodeResolved(bytes, this.resolverFor(writerRef), writerRef);
  }

  /** Decodes a plain-format message: the writer schema comes from the rl-schema header. */
  decodeWithHeaders(headers: MessageHeaders | undefined, bytes: Buffer | null): T {
    const ref = headerValue(headers, SCHEMA_HEADER);
    if (bytes === null) throw this.poison(ref ?? this.schema.ref, 'the message has no value (a tombstone)');
    return this.decode(bytes, ref ?? this.schema.ref);
  }

  /** Decodes bytes with a resolver from a writer type (undefined = written with this codec's schema). */
  decodeResolved(bytes: Buffer, resolver: Resolver | undefined, writerLabel: string): T {
    let res: { value: unknown; offset: number };
    try {
      res = this.type.decode(bytes, 0, resolver as never);
    } catch (e) {
      throw this.poison(writerLabel, `invalid Avro data: ${(e as Error).message}`, e);
    }
    if (res.offset < 0)
      throw this.poison(writerLabel, `truncated: the ${bytes.length} bytes end before the record does`);
    if (res.offset !== bytes.length)
      throw this.poison(
        writerLabel,
        `${bytes.length - res.offset} unexpected bytes after the record (${res.offset} of ${bytes.length} bytes read)`,
      );
    const problems = recordProblems(this.family as SchemaFamily, res.value);
    if (problems.length)
      throw this.poison(writerLabel, `the record breaks the ${this.family} rules: ${problems.slice(0, 8).join('; ')}`);
    return res.value as T;
  }

  /** A resolver reading `writerRef` records as this codec's schema (cached); PoisonMessageError if unknown or incompatible. */
  resolverFor(writerRef: string): Resolver {
    const cached = this.resolvers.get(writerRef);
    if (cached instanceof PoisonMessageError) throw cached;
    if (cached) return cached;
    const parsed = parseRef(writerRef);
    let out: Resolver | PoisonMessageError;
    if (!parsed) {
      out = this.poison(
        writerRef,
        `the ${SCHEMA_HEADER} header ${JSON.stringify(writerRef)} is not a schema name like ${this.schema.ref}`,
      );
    } else if (parsed.family !== this.family) {
      out = this.poison(
        writerRef,
        `the message was written with schema ${writerRef} (family ${parsed.family}), but ${this.label} carries ${this.family} records`,
      );
    } else {
      const sv = this.catalogue.get(writerRef);
      if (!sv) {
        const known = this.catalogue
          .versions(this.family)
          .map((v) => v.ref)
          .join(', ');
        out = this.poison(
          writerRef,
          `unknown schema version ${writerRef} (this build knows ${known}); a newer producer wrote it — upgrade this consumer and replay from the dead-letter topic`,
        );
      } else {
        out = this.resolverForType(sv.type, writerRef);
      }
    }
    if (out instanceof PoisonMessageError) {
      this.resolvers.set(writerRef, out);
      throw out;
    }
    this.resolvers.set(writerRef, out);
    return out;
  }

  /** A resolver for an arbitrary writer type (e.g. fetched from a schema registry). */
  resolverForType(writer: AvroType, writerLabel: string): Resolver | PoisonMessageError {
    try {
      return createCheckedResolver(writer, this.type, { writer: writerLabel, reader: this.schema.ref });
    } catch (e) {
      return this.poison(writerLabel, (e as Error).message, e);
    }
  }

  poison(writerLabel: string, what: string, cause?: unknown): PoisonMessageError {
    return new PoisonMessageError(
      `${this.label}: cannot decode a ${this.family} message (writer schema ${writerLabel}, reader schema ${this.schema.ref}): ${what}`,
      {
        cause,
        details: { family: this.family, writer: writerLabel, reader: this.schema.ref, topic: this.label },
      },
    );
  }
}

/** The first value of a header as text; undefined when absent. */
export function headerValue(headers: MessageHeaders | undefined, name: string): string | undefined {
  if (!headers) return undefined;
  let v = headers[name];
  if (Array.isArray(v)) v = v[0];
  if (v === undefined) return undefined;
  return typeof v === 'string' ? v : v.toString('utf8');
}

/** A codec for the newest schema of a family, typed by family. */
export function createCodec<F extends SchemaFamily>(family: F, opts: CodecOptions = {}): Codec<SchemaValues[F]> {
  return new Codec<SchemaValues[F]>(family, opts);
}

// ---------------------------------------------------------------------------------------------
// Wire framing

export interface EncodedMessage {
  value: Buffer;
  headers: Record<string, string>;
}

/** Encodes records as messages and decodes messages, in one wire format. */
export interface MessageCodec<T> {
  readonly format: WireFormat;
  readonly codec: Codec<T>;
  /** Confluent: registers the schema (once) and learns its id; plain: nothing. Call before encode. */
  ready(): Promise<void>;
  /** The message value and headers. `reuse`: the value is a view valid until the next encode. */
  encode(value: T, reuse?: boolean): EncodedMessage;
  /** Decodes a message; PoisonMessageError when it can never be decoded, TransientError when the registry is unreachable. */
  decode(value: Buffer | null, headers?: MessageHeaders): Promise<T>;
  /** A short name of the writer schema of a message, for dead letters (e.g. trajectories.v1, confluent:42); null if unknown. */
  writerOf(value: Buffer | null, headers?: MessageHeaders): string | null;
}

export class PlainMessageCodec<T> implements MessageCodec<T> {
  readonly format = 'plain' as const;
  private readonly hdrs: Record<string, string>;
  constructor(readonly codec: Codec<T>) {
    this.hdrs = codec.headers();
  }
  async ready(): Promise<void> {}
  encode(value: T, reuse = false): EncodedMessage {
    return { value: this.codec.encode(value, reuse), headers: this.hdrs };
  }
  async decode(value: Buffer | null, headers?: MessageHeaders): Promise<T> {
    return this.codec.decodeWithHeaders(headers, value);
  }
  writerOf(_value: Buffer | null, headers?: MessageHeaders): string | null {
    return headerValue(headers, SCHEMA_HEADER) ?? null;
  }
}

export class ConfluentMessageCodec<T> implements MessageCodec<T> {
  readonly format = 'confluent' as const;
  private id: number | null = null;
  private prefix: Buffer | null = null;
  private readyPromise: Promise<void> | null = null;
  private readonly writers = new Map<number, Promise<Resolver | null>>();

  /** `subject`: the registry subject, `<full topic name>-value` by the TopicNameStrategy. */
  constructor(
    readonly codec: Codec<T>,
    private readonly registry: SchemaRegistry,
    readonly subject: string,
  ) {}

  /** The registered schema id (after ready()). */
  get schemaId(): number | null {
    return this.id;
  }

  ready(): Promise<void> {
    if (!this.readyPromise) {
      this.readyPromise = this.registry.register(this.subject, this.codec.schema.text).then((id) => {
        if (!Number.isInteger(id) || id < 0 || id > 0x7fffffff)
          throw new RlError(`schema registry returned an invalid id ${id} for subject ${this.subject}`, {
            code: 'ERR_SCHEMA_REGISTRY_PROTOCOL',
          });
        this.id = id;
        const p = Buffer.alloc(CONFLUENT_HEADER_BYTES);
        p[0] = CONFLUENT_MAGIC;
        p.writeUInt32BE(id, 1);
        this.prefix = p;
        this.writers.set(id, Promise.resolve(null));
      });
      this.readyPromise.catch(() => {
        this.readyPromise = null;
      });
    }
    return this.readyPromise;
  }

  encode(value: T, reuse = false): EncodedMessage {
    if (!this.prefix)
      throw new RlError(
        `${this.codec.label}: the Confluent codec is not ready: await ready() (it registers ${this.codec.ref} under subject ${this.subject}) before encoding`,
        { code: 'ERR_NOT_READY' },
      );
    return { value: this.codec.encodeWithPrefix(value, this.prefix, reuse), headers: {} };
  }

  async decode(value: Buffer | null, _headers?: MessageHeaders): Promise<T> {
    const c = this.codec;
    if (value === null) throw c.poison('confluent:?', 'the message has no value (a tombstone)');
    if (value.length < CONFLUENT_HEADER_BYTES)
      throw c.poison(
        'confluent:?',
        `${value.length} bytes is shorter than the 5-byte Confluent header (magic byte + schema id)`,
      );
    if (value[0] !== CONFLUENT_MAGIC) {
      throw c.poison(
        'confluent:?',
        `the first byte is ${value[0]}, not the Confluent magic byte 0: the message is not in the Confluent wire format (was it written with schema_wire_format = plain?)`,
      );
    }
    const id = value.readUInt32BE(1);
    const label = `confluent:${id}`;
    let p = this.writers.get(id);
    if (!p) {
      p = this.loadWriter(id, label);
      this.writers.set(id, p);
      // transient failures are not cached: the next message retries the registry
      p.catch((e) => {
        if (isRetriable(e)) this.writers.delete(id);
      });
    }
    const resolver = await p;
    return c.decodeResolved(value.subarray(CONFLUENT_HEADER_BYTES), resolver ?? undefined, label);
  }

  writerOf(value: Buffer | null): string | null {
    if (!value || value.length < CONFLUENT_HEADER_BYTES || value[0] !== CONFLUENT_MAGIC) return null;
    return `confluent:${value.readUInt32BE(1)}`;
  }

  /** The resolver for a writer schema id; null when it is exactly the codec's schema. */
  private async loadWriter(id: number, label: string): Promise<Resolver | null> {
    let text: string;
    try {
      text = await this.registry.getSchema(id);
    } catch (e) {
      if (e instanceof SchemaRegistryError && e.code === 'ERR_SCHEMA_NOT_FOUND')
        throw this.codec.poison(label, `schema id ${id} is unknown to the schema registry (${e.message})`, e);
      throw e;
    }
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (e) {
      throw this.codec.poison(label, `the registry's schema ${id} is not JSON`, e);
    }
    if (JSON.stringify(json) === this.codec.schema.text) return null;
    let writer: AvroType;
    try {
      writer = parseSchema(json as object);
    } catch (e) {
      throw this.codec.poison(
        label,
        `the registry's schema ${id} is not a valid Avro schema: ${(e as Error).message}`,
        e,
      );
    }
    const r = this.codec.resolverForType(writer, label);
    if (r instanceof PoisonMessageError) throw r;
    return r;
  }
}

export type MessageCodecOptions =
  { format: 'plain' } | { format: 'confluent'; registry: SchemaRegistry; subject: string };

/** A message codec for a family in the chosen wire format. */
export function createMessageCodec<F extends SchemaFamily>(
  family: F,
  wire: MessageCodecOptions,
  opts: CodecOptions = {},
): MessageCodec<SchemaValues[F]> {
  const codec = createCodec(family, opts);
  return wire.format === 'confluent'
    ? new ConfluentMessageCodec(codec, wire.registry, wire.subject)
    : new PlainMessageCodec(codec);
}
