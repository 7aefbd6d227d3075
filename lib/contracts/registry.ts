/**
 * Schema registries for the Confluent wire format. The port is two calls — register a schema
 * under a subject (→ its global id) and fetch a schema by id — with two adapters:
 *
 *  - HttpSchemaRegistry: a client of the Confluent Schema Registry REST API over `fetch`
 *    (`POST /subjects/{subject}/versions`, `GET /schemas/ids/{id}`), caching both directions.
 *    Network failures, timeouts, 408/429 and 5xx are TransientError (retriable); other answers
 *    (unknown id, incompatible schema, bad credentials) are not retriable and say what to fix.
 *  - InMemorySchemaRegistry: the same semantics in process (ids are global per schema text),
 *    for the embedded mode, tests and benchmarks.
 */
import { RlError, TransientError } from '../errors.ts';

export interface SchemaRegistry {
  /** Registers `schema` (Avro JSON text) under `subject` — idempotent — and returns its global id. */
  register(subject: string, schema: string): Promise<number>;
  /** The schema (Avro JSON text) with this id. */
  getSchema(id: number): Promise<string>;
}

/** A schema registry answer that retrying cannot change. */
export class SchemaRegistryError extends RlError {
  readonly status: number;
  constructor(message: string, opts: { status: number; code: string; cause?: unknown }) {
    super(message, { retriable: false, code: opts.code, cause: opts.cause, details: { status: opts.status } });
    this.name = 'SchemaRegistryError';
    this.status = opts.status;
  }
}

export interface HttpSchemaRegistryOptions {
  /** Base URL, e.g. http://registry:8081 (user:password@ in the URL is used as basic auth). */
  url: string;
  username?: string;
  password?: string;
  /** Extra request headers (e.g. a bearer token). */
  headers?: Record<string, string>;
  /** Per request; default 10 s. */
  timeoutMs?: number;
  /** Injected fetch (default: global fetch). */
  fetch?: typeof fetch;
}

const CONTENT_TYPE = 'application/vnd.schemaregistry.v1+json';

function canonicalText(schema: string): string {
  try {
    return JSON.stringify(JSON.parse(schema));
  } catch {
    return schema;
  }
}

export class HttpSchemaRegistry implements SchemaRegistry {
  private readonly base: string;
  /** The URL without credentials, for messages. */
  readonly displayUrl: string;
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;
  private readonly fetchFn: typeof fetch;
  private readonly ids = new Map<string, Promise<number>>();
  private readonly schemas = new Map<number, Promise<string>>();

  constructor(opts: HttpSchemaRegistryOptions) {
    let u: URL;
    try {
      u = new URL(opts.url);
    } catch {
      throw new RlError(
        `schema registry URL ${JSON.stringify(opts.url)} is not a valid URL (e.g. http://localhost:8081)`,
        { code: 'ERR_CONFIG' },
      );
    }
    if (u.protocol !== 'http:' && u.protocol !== 'https:')
      throw new RlError(`schema registry URL must be http(s), got ${u.protocol}`, { code: 'ERR_CONFIG' });
    const username = opts.username ?? decodeURIComponent(u.username);
    const password = opts.password ?? decodeURIComponent(u.password);
    u.username = '';
    u.password = '';
    this.base = u.toString().replace(/\/+$/, '');
    this.displayUrl = this.base;
    this.headers = { accept: `${CONTENT_TYPE}, application/json`, ...(opts.headers ?? {}) };
    if (username) this.headers.authorization = `Basic ${Buffer.from(`${username}:${password}`).toString('base64')}`;
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.fetchFn = opts.fetch ?? fetch;
  }

  register(subject: string, schema: string): Promise<number> {
    const text = canonicalText(schema);
    const key = `${subject}\0${text}`;
    let p = this.ids.get(key);
    if (!p) {
      p = this.request(
        'POST',
        `/subjects/${encodeURIComponent(subject)}/versions`,
        { schema: text },
        `registering the schema under subject "${subject}"`,
      ).then((body) => {
        const id = (body as { id?: unknown }).id;
        if (!Number.isSafeInteger(id))
          throw new SchemaRegistryError(
            `schema registry ${this.displayUrl}: the answer to registering subject "${subject}" has no integer id: ${JSON.stringify(body).slice(0, 200)}`,
            { status: 200, code: 'ERR_SCHEMA_REGISTRY_PROTOCOL' },
          );
        this.schemas.set(id as number, Promise.resolve(text));
        return id as number;
      });
      this.ids.set(key, p);
      p.catch(() => this.ids.delete(key));
    }
    return p;
  }

  getSchema(id: number): Promise<string> {
    if (!Number.isSafeInteger(id) || id < 0)
      return Promise.reject(
        new SchemaRegistryError(`schema id ${id} is not a valid id`, { status: 0, code: 'ERR_SCHEMA_NOT_FOUND' }),
      );
    let p = this.schemas.get(id);
    if (!p) {
      p = this.request('GET', `/schemas/ids/${id}`, undefined, `fetching schema id ${id}`).then((body) => {
        const b = body as { schema?: unknown; schemaType?: unknown };
        if (b.schemaType !== undefined && b.schemaType !== 'AVRO')
          throw new SchemaRegistryError(`schema id ${id} is a ${String(b.schemaType)} schema, not Avro`, {
            status: 200,
            code: 'ERR_SCHEMA_NOT_AVRO',
          });
        if (typeof b.schema !== 'string')
          throw new SchemaRegistryError(
            `schema registry ${this.displayUrl}: the answer for schema id ${id} has no schema text`,
            { status: 200, code: 'ERR_SCHEMA_REGISTRY_PROTOCOL' },
          );
        return b.schema;
      });
      this.schemas.set(id, p);
      p.catch(() => this.schemas.delete(id));
    }
    return p;
  }

  private async request(method: string, path: string, body: unknown, what: string): Promise<unknown> {
    const url = this.base + path;
    let res: Response;
    try {
      res = await this.fetchFn(url, {
        method,
        headers: body === undefined ? this.headers : { ...this.headers, 'content-type': CONTENT_TYPE },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e) {
      throw new TransientError(
        `schema registry ${this.displayUrl} unreachable while ${what}: ${(e as Error).message}`,
        { cause: e, code: 'ERR_SCHEMA_REGISTRY_UNAVAILABLE' },
      );
    }
    const text = await res.text().catch(() => '');
    let json: unknown = undefined;
    try {
      json = text === '' ? undefined : JSON.parse(text);
    } catch {
      /* not JSON */
    }
    if (res.ok) {
      if (json === undefined || typeof json !== 'object')
        throw new SchemaRegistryError(
          `schema registry ${this.displayUrl}: non-JSON answer while ${what}: ${text.slice(0, 200)}`,
          { status: res.status, code: 'ERR_SCHEMA_REGISTRY_PROTOCOL' },
        );
      return json;
    }
    const detail =
      json && typeof json === 'object' && typeof (json as { message?: unknown }).message === 'string'
        ? (json as { message: string }).message
        : text.slice(0, 200);
    const msg = `schema registry ${this.displayUrl} answered ${res.status} while ${what}: ${detail}`;
    if (res.status >= 500 || res.status === 408 || res.status === 429)
      throw new TransientError(msg, { code: 'ERR_SCHEMA_REGISTRY_UNAVAILABLE' });
    if (res.status === 401 || res.status === 403)
      throw new SchemaRegistryError(`${msg} — check the registry credentials`, {
        status: res.status,
        code: 'ERR_SCHEMA_REGISTRY_AUTH',
      });
    if (res.status === 404) throw new SchemaRegistryError(msg, { status: 404, code: 'ERR_SCHEMA_NOT_FOUND' });
    if (res.status === 409)
      throw new SchemaRegistryError(
        `${msg} — the schema breaks the subject's compatibility rule; evolve it compatibly (see schemas/README.md)`,
        { status: 409, code: 'ERR_SCHEMA_INCOMPATIBLE' },
      );
    throw new SchemaRegistryError(msg, { status: res.status, code: 'ERR_SCHEMA_REGISTRY' });
  }
}

/** A registry in process memory: ids are global per schema text (as in Confluent's), starting at 1. */
export class InMemorySchemaRegistry implements SchemaRegistry {
  private readonly byText = new Map<string, number>();
  private readonly byId = new Map<number, string>();
  private readonly subjects = new Map<string, number[]>();

  async register(subject: string, schema: string): Promise<number> {
    const text = canonicalText(schema);
    let id = this.byText.get(text);
    if (id === undefined) {
      id = this.byId.size + 1;
      this.byText.set(text, id);
      this.byId.set(id, text);
    }
    const versions = this.subjects.get(subject) ?? [];
    if (!versions.includes(id)) versions.push(id);
    this.subjects.set(subject, versions);
    return id;
  }

  async getSchema(id: number): Promise<string> {
    const text = this.byId.get(id);
    if (text === undefined)
      throw new SchemaRegistryError(`schema id ${id} is not registered`, { status: 404, code: 'ERR_SCHEMA_NOT_FOUND' });
    return text;
  }

  /** Ids registered under a subject, oldest first. */
  versions(subject: string): number[] {
    return [...(this.subjects.get(subject) ?? [])];
  }
}
