/**
 * Schema compatibility, by the Avro resolution rules: can data written with `writer` be read
 * with `reader`? Errors name the field path (e.g. `TrajectoryGroup.samples[].entropies`) and what
 * to do, unlike avsc's resolver errors. Record and enum names are compared without namespace
 * (as Avro's reference implementation does), since each version of our schemas has its own
 * namespace (`rlstream.trajectories.v1` → `.v2`).
 *
 * Beyond Avro: a field whose logical type changes (e.g. `int32-le` → `float32-le`, both `bytes`
 * underneath) is reported, since reading it would silently reinterpret the bytes.
 */
import { RlError } from '../errors.ts';
import { avro, parseSchema, type AvroType } from './avro.ts';

export interface CompatibilityResult {
  compatible: boolean;
  /** One line per problem, each starting with the field path. */
  errors: string[];
}

/** A writer schema that cannot be read with the reader schema. Not retriable: fix the schema. */
export class SchemaIncompatibleError extends RlError {
  readonly errors: string[];
  constructor(message: string, errors: string[]) {
    super(message, { retriable: false, code: 'ERR_SCHEMA_INCOMPATIBLE', details: { errors } });
    this.name = 'SchemaIncompatibleError';
    this.errors = errors;
  }
}

type SchemaLike = AvroType | string | object;

function toType(s: SchemaLike): AvroType {
  return avro.Type.isType(s) ? (s as AvroType) : parseSchema(s as string | object);
}

const unqualify = (name: string | undefined) => (name ?? '').slice((name ?? '').lastIndexOf('.') + 1);

const PROMOTIONS: Record<string, string[]> = {
  int: ['long', 'float', 'double'],
  long: ['float', 'double'],
  float: ['double'],
  string: ['bytes'],
  bytes: ['string'],
};

interface AnyType {
  typeName: string;
  name?: string;
  aliases?: string[];
  types?: AnyType[];
  fields?: Array<{ name: string; type: AnyType; aliases?: string[]; defaultValue(): unknown }>;
  itemsType?: AnyType;
  valuesType?: AnyType;
  symbols?: string[];
  default?: string;
  size?: number;
  underlyingType?: AnyType;
}

function describe(t: AnyType): string {
  if (t.typeName.startsWith('logical:')) return `${t.underlyingType!.typeName} (${t.typeName.slice(8)})`;
  if (t.typeName.startsWith('union')) return `union [${t.types!.map(describe).join(', ')}]`;
  if (t.name) return `${t.typeName} ${unqualify(t.name)}`;
  return t.typeName;
}

function namesMatch(w: AnyType, r: AnyType): boolean {
  const wn = unqualify(w.name);
  return wn === unqualify(r.name) || (r.aliases ?? []).some((a) => unqualify(a) === wn);
}

function check(w: AnyType, r: AnyType, path: string, errors: string[], seen: Set<string>): void {
  const wl = w.typeName.startsWith('logical:') ? w.typeName.slice(8) : null;
  const rl = r.typeName.startsWith('logical:') ? r.typeName.slice(8) : null;
  if (wl !== null && rl !== null && wl !== rl) {
    errors.push(
      `${path}: logical type changed from ${wl} to ${rl}; the bytes would be reinterpreted — add a new field instead`,
    );
    return;
  }
  if (wl !== null) w = w.underlyingType!;
  if (rl !== null) r = r.underlyingType!;

  const rUnion = r.typeName.startsWith('union');
  const wUnion = w.typeName.startsWith('union');
  if (wUnion) {
    for (const wb of w.types!) {
      const sub: string[] = [];
      check(wb, r, path, sub, seen);
      if (sub.length)
        errors.push(`${path}: the writer's union branch ${describe(wb)} cannot be read as ${describe(r)}`);
    }
    return;
  }
  if (rUnion) {
    const ok = r.types!.some((rb) => {
      const sub: string[] = [];
      check(w, rb, path, sub, seen);
      return sub.length === 0;
    });
    if (!ok) errors.push(`${path}: ${describe(w)} matches no branch of the reader's ${describe(r)}`);
    return;
  }

  if (w.typeName !== r.typeName) {
    if (!(PROMOTIONS[w.typeName] ?? []).includes(r.typeName)) {
      errors.push(
        `${path}: type changed from ${describe(w)} to ${describe(r)}, which Avro cannot convert; add a new field instead`,
      );
    }
    return;
  }
  switch (r.typeName) {
    case 'record':
    case 'error': {
      if (!namesMatch(w, r)) {
        errors.push(
          `${path}: record ${unqualify(w.name)} cannot be read as record ${unqualify(r.name)} (names differ; add an alias)`,
        );
        return;
      }
      const key = `${w.name}|${r.name}`;
      if (seen.has(key)) return;
      seen.add(key);
      const wFields = new Map(w.fields!.map((f) => [f.name, f]));
      for (const rf of r.fields!) {
        const names = [rf.name, ...(rf.aliases ?? [])];
        const wf = names.map((n) => wFields.get(n)).find((f) => f !== undefined);
        const fpath = `${path}.${rf.name}`;
        if (wf) check(wf.type, rf.type, fpath, errors, seen);
        else if (rf.defaultValue() === undefined)
          errors.push(
            `${fpath}: field is new in the reader and has no default, so older records cannot be read; give it a default`,
          );
      }
      return;
    }
    case 'enum': {
      if (!namesMatch(w, r)) {
        errors.push(`${path}: enum ${unqualify(w.name)} cannot be read as enum ${unqualify(r.name)} (names differ)`);
        return;
      }
      const missing = w.symbols!.filter((s) => !r.symbols!.includes(s));
      if (missing.length && r.default === undefined)
        errors.push(`${path}: enum symbol(s) ${missing.join(', ')} were removed and the reader's enum has no default`);
      return;
    }
    case 'fixed':
      if (!namesMatch(w, r))
        errors.push(`${path}: fixed ${unqualify(w.name)} cannot be read as fixed ${unqualify(r.name)} (names differ)`);
      else if (w.size !== r.size) errors.push(`${path}: fixed size changed from ${w.size} to ${r.size}`);
      return;
    case 'array':
      check(w.itemsType!, r.itemsType!, `${path}[]`, errors, seen);
      return;
    case 'map':
      check(w.valuesType!, r.valuesType!, `${path}{}`, errors, seen);
      return;
    default:
      return; // same primitive
  }
}

/** Whether records written with `writer` can be read with `reader`, and if not, why (one line per field). */
export function checkCompatibility(writer: SchemaLike, reader: SchemaLike): CompatibilityResult {
  const w = toType(writer) as unknown as AnyType;
  const r = toType(reader) as unknown as AnyType;
  const errors: string[] = [];
  check(w, r, unqualify(r.name) || r.typeName, errors, new Set());
  return { compatible: errors.length === 0, errors };
}

/** Throws SchemaIncompatibleError (naming both schemas and every failing field) unless compatible. */
export function assertCompatible(
  writer: SchemaLike,
  reader: SchemaLike,
  labels: { writer?: string; reader?: string } = {},
): void {
  const res = checkCompatibility(writer, reader);
  if (!res.compatible) {
    const wl = labels.writer ?? 'the writer schema';
    const rl = labels.reader ?? 'the reader schema';
    throw new SchemaIncompatibleError(`${wl} cannot be read as ${rl}: ${res.errors.join('; ')}`, res.errors);
  }
}

/**
 * A resolver reading `writer` data as `reader` values, after checking compatibility (so a
 * failure names the field). Namespaces are ignored, as in checkCompatibility.
 */
export function createCheckedResolver(
  writer: AvroType,
  reader: AvroType,
  labels: { writer?: string; reader?: string } = {},
): ReturnType<AvroType['createResolver']> {
  assertCompatible(writer, reader, labels);
  try {
    return reader.createResolver(writer, { ignoreNamespaces: true });
  } catch (e) {
    const msg = `${labels.writer ?? 'the writer schema'} cannot be read as ${labels.reader ?? 'the reader schema'}: ${(e as Error).message}`;
    throw new SchemaIncompatibleError(msg, [(e as Error).message]);
  }
}
