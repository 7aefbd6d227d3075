/**
 * Walks the zod schema: the keys valid at a path (for "did you mean"), every leaf with its type,
 * default and description (for docs/config.md), and which paths are sections (objects merged
 * key by key) versus values (replaced whole). Reads zod 4's `_zod.def`.
 */
import { globalRegistry, type z } from 'zod';

type Schema = z.ZodType;
interface Def {
  type: string;
  [k: string]: any;
}

const defOf = (s: Schema): Def => (s as any)._zod.def as Def;

export interface Unwrapped {
  /** The schema under default/prefault/nullable/optional/preprocess wrappers. */
  core: Schema;
  nullable: boolean;
  hasDefault: boolean;
  defaultValue: unknown;
  description: string | undefined;
}

/** Peels wrappers, keeping the outermost description and default. */
export function unwrap(schema: Schema): Unwrapped {
  let cur = schema;
  let nullable = false,
    hasDefault = false,
    defaultValue: unknown;
  let description: string | undefined;
  for (;;) {
    description ??= cur.description;
    const def = defOf(cur);
    if (def.type === 'default' || def.type === 'prefault') {
      if (!hasDefault) {
        hasDefault = true;
        defaultValue = def.defaultValue;
      }
      cur = def.innerType;
    } else if (def.type === 'nullable') {
      nullable = true;
      cur = def.innerType;
    } else if (def.type === 'optional' || def.type === 'readonly' || def.type === 'nonoptional') cur = def.innerType;
    else if (def.type === 'pipe') cur = defOf(def.in).type === 'transform' ? def.out : def.in;
    else break;
  }
  return { core: cur, nullable, hasDefault, defaultValue, description };
}

export function kindOf(schema: Schema): string {
  return defOf(unwrap(schema).core).type;
}

/** The keys of an object schema (after unwrapping), or null when it is not an object. */
export function objectShape(schema: Schema): Record<string, Schema> | null {
  const core = unwrap(schema).core;
  const def = defOf(core);
  return def.type === 'object' ? (def.shape as Record<string, Schema>) : null;
}

/** The schema at a path (object keys, record values, array/tuple elements), or null if invalid. */
export function schemaAt(root: Schema, path: ReadonlyArray<string | number>): Schema | null {
  let cur: Schema = root;
  for (const seg of path) {
    const core = unwrap(cur).core;
    const def = defOf(core);
    if (def.type === 'object') {
      const next = (def.shape as Record<string, Schema>)[String(seg)];
      if (!next) return null;
      cur = next;
    } else if (def.type === 'record') cur = def.valueType;
    else if (def.type === 'array') cur = def.element;
    else if (def.type === 'tuple') {
      const item = (def.items as Schema[])[Number(seg)];
      if (!item) return null;
      cur = item;
    } else return null;
  }
  return cur;
}

function fmtNum(n: number): string {
  return String(n);
}

/** A human-readable type: `integer ≥ 1`, `number in [0, 1]`, `"a" | "b"`, `list of string`, … */
export function describeType(schema: Schema): string {
  const u = unwrap(schema);
  const base = describeCore(u.core);
  return u.nullable ? `${base} or null` : base;
}

function describeCore(core: Schema): string {
  // A refinement the checks cannot show (e.g. "-1 or integer ≥ 1") carries its label as metadata.
  const label = (globalRegistry.get(core) as { typeLabel?: unknown } | undefined)?.typeLabel;
  if (typeof label === 'string') return label;
  const def = defOf(core);
  switch (def.type) {
    case 'string':
      return 'string';
    case 'boolean':
      return 'boolean';
    case 'unknown':
    case 'any':
      return 'any';
    case 'number': {
      const checks: Def[] = [def, ...((def.checks ?? []) as any[]).map((c) => c._zod.def as Def)];
      const isInt = checks.some((c) => c.check === 'number_format' && /int/.test(String(c.format)));
      let lo: string | null = null,
        hi: string | null = null;
      for (const c of checks) {
        if (c.check === 'greater_than') lo = `${c.inclusive ? '≥' : '>'} ${fmtNum(c.value)}`;
        if (c.check === 'less_than') hi = `${c.inclusive ? '≤' : '<'} ${fmtNum(c.value)}`;
      }
      const bounds = [lo, hi].filter(Boolean).join(', ');
      return `${isInt ? 'integer' : 'number'}${bounds ? ' ' + bounds : ''}`;
    }
    case 'enum':
      return Object.values(def.entries as Record<string, string>)
        .map((v) => JSON.stringify(v))
        .join(' | ');
    case 'literal':
      return (def.values as unknown[]).map((v) => JSON.stringify(v)).join(' | ');
    case 'union':
      return (def.options as Schema[]).map((o) => describeType(o)).join(' | ');
    case 'array':
      return `list of ${describeType(def.element)}`;
    case 'tuple':
      return `[${(def.items as Schema[]).map((i) => describeType(i)).join(', ')}]`;
    case 'record':
      return `map of string → ${describeType(def.valueType)}`;
    case 'object':
      return 'section';
    default:
      return def.type;
  }
}

/** Valid literal values of an enum/literal/union-of-literals schema, or null. */
export function enumValues(schema: Schema): unknown[] | null {
  const def = defOf(unwrap(schema).core);
  if (def.type === 'enum') return Object.values(def.entries as Record<string, unknown>);
  if (def.type === 'literal') return def.values as unknown[];
  if (def.type === 'union') {
    const all: unknown[] = [];
    for (const o of def.options as Schema[]) {
      const v = enumValues(o);
      if (!v) return null;
      all.push(...v);
    }
    return all;
  }
  return null;
}

export interface SchemaEntry {
  path: string[];
  schema: Schema;
  /** true for sections (strict objects); their keys follow as separate entries. */
  section: boolean;
  type: string;
  hasDefault: boolean;
  defaultValue: unknown;
  description: string | undefined;
}

/** Every section and leaf under `root`, depth first in declaration order. */
export function schemaEntries(root: Schema, prefix: string[] = []): SchemaEntry[] {
  const out: SchemaEntry[] = [];
  const shape = objectShape(root);
  if (!shape) return out;
  for (const [key, child] of Object.entries(shape)) {
    const path = [...prefix, key];
    const u = unwrap(child);
    const isSection = defOf(u.core).type === 'object';
    out.push({
      path,
      schema: child,
      section: isSection,
      type: describeType(child),
      hasDefault: u.hasDefault,
      defaultValue: u.defaultValue,
      description: u.description,
    });
    if (isSection) out.push(...schemaEntries(child, path));
  }
  return out;
}
