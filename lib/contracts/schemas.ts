/**
 * The schema catalogue: every `schemas/<family>.v<N>.avsc` file, parsed once. A *family* is the
 * contract of a topic (trajectories, scored, ...); a *ref* names one version of it
 * (`trajectories.v1`) and is what the plain wire format puts in the `rl-schema` header.
 *
 * Conventions checked on load: the file name is `<family>.v<N>.avsc`, the top-level schema is a
 * record whose namespace is `rlstream.<family>.v<N>`. The newest version of a family is the one
 * written and read; older versions stay in the catalogue so their records can still be read
 * (resolved into the newest, see compat.ts).
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseSchema, type AvroType } from './avro.ts';

/** The schema families of the topics, in pipeline order. */
export const SCHEMA_FAMILIES = [
  'prompts',
  'trajectories',
  'scored',
  'updates',
  'policy',
  'metrics',
  'control',
  'deadletter',
] as const;
export type SchemaFamily = (typeof SCHEMA_FAMILIES)[number];

export interface SchemaVersion {
  family: string;
  version: number;
  /** `<family>.v<version>`. */
  ref: string;
  /** The schema as JSON text, compact (what a schema registry receives). */
  text: string;
  /** Parsed JSON. */
  json: Record<string, unknown>;
  type: AvroType;
  /** File it came from, or '<inline>'. */
  source: string;
}

const REF_RE = /^([a-z][a-z0-9_]*)\.v([1-9][0-9]*)$/;

/** Splits `trajectories.v1` into family and version; null when malformed. */
export function parseRef(ref: string): { family: string; version: number } | null {
  const m = REF_RE.exec(ref);
  return m ? { family: m[1], version: Number(m[2]) } : null;
}

/** Locates the repository's `schemas/` directory (from source or from dist/); RLSTREAM_SCHEMA_DIR overrides. */
export function defaultSchemaDir(): string {
  const env = process.env.RLSTREAM_SCHEMA_DIR;
  if (env) return resolve(env);
  const here = dirname(fileURLToPath(import.meta.url));
  for (const cand of [join(here, '..', '..', 'schemas'), join(here, '..', '..', '..', 'schemas')]) {
    if (existsSync(join(cand, 'trajectories.v1.avsc'))) return cand;
  }
  throw new Error(`cannot find the schemas/ directory (looked next to ${here}); set RLSTREAM_SCHEMA_DIR`);
}

export class SchemaCatalogue {
  private readonly byRef = new Map<string, SchemaVersion>();
  private readonly byFamily = new Map<string, SchemaVersion[]>();

  /** Loads every `*.avsc` directly inside each directory (not subdirectories). */
  static load(dirs: string[] = [defaultSchemaDir()]): SchemaCatalogue {
    const cat = new SchemaCatalogue();
    for (const dir of dirs) {
      for (const name of readdirSync(dir).sort()) {
        if (!name.endsWith('.avsc')) continue;
        const file = join(dir, name);
        cat.add(name.slice(0, -'.avsc'.length), readFileSync(file, 'utf8'), file);
      }
    }
    return cat;
  }

  /** Adds one schema version; throws naming the source when it breaks the conventions. */
  add(ref: string, schema: string | object, source = '<inline>'): SchemaVersion {
    const parsed = parseRef(ref);
    if (!parsed) throw new Error(`${source}: schema name "${ref}" must look like <family>.v<N> (e.g. trajectories.v1)`);
    let json: Record<string, unknown>;
    try {
      json = typeof schema === 'string' ? JSON.parse(schema) : JSON.parse(JSON.stringify(schema));
    } catch (e) {
      throw new Error(`${source}: not valid JSON: ${(e as Error).message}`);
    }
    if (json.type !== 'record') throw new Error(`${source}: the top-level schema must be a record`);
    const ns = `rlstream.${parsed.family}.v${parsed.version}`;
    if (json.namespace !== ns)
      throw new Error(`${source}: namespace must be "${ns}", found ${JSON.stringify(json.namespace)}`);
    let type: AvroType;
    try {
      type = parseSchema(json);
    } catch (e) {
      throw new Error(`${source}: invalid Avro schema: ${(e as Error).message}`);
    }
    if (this.byRef.has(ref))
      throw new Error(`${source}: schema ${ref} is defined twice (also in ${this.byRef.get(ref)!.source})`);
    const sv: SchemaVersion = {
      family: parsed.family,
      version: parsed.version,
      ref,
      text: JSON.stringify(json),
      json,
      type,
      source,
    };
    this.byRef.set(ref, sv);
    const list = this.byFamily.get(parsed.family) ?? [];
    list.push(sv);
    list.sort((a, b) => a.version - b.version);
    this.byFamily.set(parsed.family, list);
    return sv;
  }

  get(ref: string): SchemaVersion | undefined {
    return this.byRef.get(ref);
  }

  /** The newest version of a family; throws listing the known families when unknown. */
  latest(family: string): SchemaVersion {
    const list = this.byFamily.get(family);
    if (!list || list.length === 0)
      throw new Error(`no schema for "${family}"; known: ${[...this.byFamily.keys()].sort().join(', ')}`);
    return list[list.length - 1];
  }

  versions(family: string): SchemaVersion[] {
    return [...(this.byFamily.get(family) ?? [])];
  }

  families(): string[] {
    return [...this.byFamily.keys()].sort();
  }

  refs(): string[] {
    return [...this.byRef.keys()].sort();
  }
}

let defaultCatalogue: SchemaCatalogue | null = null;

/** The catalogue of `schemas/` (loaded once). */
export function schemaCatalogue(): SchemaCatalogue {
  if (!defaultCatalogue) {
    const cat = SchemaCatalogue.load();
    for (const f of SCHEMA_FAMILIES) cat.latest(f); // every topic family must exist
    defaultCatalogue = cat;
  }
  return defaultCatalogue;
}
