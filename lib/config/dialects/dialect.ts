/**
 * Config dialects: another trainer's config (EasyR1, verl, MTRL) translated into rlstream's, key
 * by key. A dialect is a table: explicit rules (a source key → rlstream keys, with the value
 * converted where the meaning differs, or a problem when the setting would change the result and
 * rlstream cannot honour it), key prefixes that map one-to-one (`worker.actor.` → `actor.`),
 * patterns of keys that cannot apply in a single-process ONNX trainer ("not applicable here"),
 * and the source trainer's own defaults where they differ from rlstream's (so an omitted key means
 * what it means there). A key no rule, prefix or pattern knows is refused, never dropped; a key
 * that is already rlstream's (e.g. `data.task`, `pipeline.*`) passes through as is.
 */
import { configSchema } from '../schema.ts';
import { kindOf, objectShape, schemaAt, unwrap } from '../introspect.ts';
import { closest } from '../suggest.ts';

export type Obj = Record<string, unknown>;
export const isPlainObject = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);

/** What a rule reads besides its own value: any key of the source document (its defaults filled). */
export interface RuleContext {
  get(path: string): unknown;
}

/** rlstream keys and values a source key becomes, or a one-line problem. */
export type Assignments = Array<[string, unknown]>;

export interface Rule {
  /** The source key, dotted; its whole value (a scalar, list or mapping) goes to `map`. */
  from: string;
  /** The rlstream keys it may set (documentation). */
  to: readonly string[];
  /** How the value is converted (documentation). */
  note?: string;
  /** Value → assignments, or a problem. Default: the value unchanged at to[0] (none when `to` is empty). */
  map?: (value: unknown, ctx: RuleContext) => Assignments | string;
}

export interface Dialect {
  /** Registry name (`--dialect NAME`). */
  name: string;
  /** Human name (EasyR1, verl, MTRL). */
  title: string;
  /** Top-level sections that mark a document as this dialect. */
  marks: readonly string[];
  /** One sentence for the docs. */
  about: string;
  /** Source prefixes whose keys map one-to-one onto rlstream keys under another prefix. */
  prefixes: ReadonlyArray<readonly [string, string]>;
  rules: readonly Rule[];
  /** Keys that cannot apply here: `a.b.c` exactly, `a.b.*` a whole section, `*.leaf` a key name anywhere. */
  notApplicable: readonly string[];
  /** The source trainer's defaults that differ from rlstream's, by dotted source key. */
  defaults: Readonly<Record<string, unknown>>;
}

/** One source key and what it became. */
export interface TranslationEntry {
  from: string;
  value: unknown;
  /** Set rlstream keys (empty: the key has no effect of its own; see note). */
  to: Assignments;
  note?: string;
  /** file: written in the document (or an override); default: the source trainer's default. */
  origin: 'file' | 'default';
  kind: 'rule' | 'same' | 'not-applicable';
}

export interface TranslationProblem {
  /** The source key the problem is about. */
  key: string;
  text: string;
}

export interface Translation {
  dialect: Dialect;
  /** The rlstream config (before validation). */
  config: Obj;
  entries: TranslationEntry[];
  /** Source keys written in the document that cannot apply here. */
  notApplicable: string[];
  problems: TranslationProblem[];
}

export function getPath(obj: unknown, path: string): unknown {
  let cur = obj;
  for (const seg of path.split('.')) {
    if (!isPlainObject(cur)) return undefined;
    cur = cur[seg];
  }
  return cur;
}

export function setPath(obj: Obj, path: string, value: unknown): void {
  const segs = path.split('.');
  let cur = obj;
  for (const seg of segs.slice(0, -1)) {
    if (!isPlainObject(cur[seg])) cur[seg] = {};
    cur = cur[seg] as Obj;
  }
  cur[segs[segs.length - 1]] = value;
}

/** Whether `key` matches a not-applicable pattern. */
export function matchesPattern(key: string, pattern: string): boolean {
  if (pattern.startsWith('*.')) return key === pattern.slice(2) || key.endsWith(`.${pattern.slice(2)}`);
  if (pattern.endsWith('.*')) return key.startsWith(pattern.slice(0, -1));
  return key === pattern;
}

/** rlstream key kinds: a leaf value (replaced whole), a record (free-form mapping), or a section. */
function nativeKind(path: string): 'section' | 'value' | null {
  const s = schemaAt(configSchema, path.split('.'));
  if (!s) return null;
  return kindOf(s) === 'object' ? 'section' : 'value';
}

/** The rlstream key a source key maps to one-to-one (by prefix, or being rlstream's own), or null. */
function sameKey(d: Dialect, key: string): string | null {
  for (const [pre, nat] of d.prefixes) {
    if (key.startsWith(pre)) {
      const cand = nat + key.slice(pre.length);
      if (nativeKind(cand) !== null) return cand;
    }
  }
  return nativeKind(key) !== null ? key : null;
}

const clone = <T>(v: T): T => structuredClone(v);

/**
 * verl and EasyR1 write null for "unset, use the default" even where rlstream's key takes no null
 * (e.g. ppo_micro_batch_size_per_gpu: null): such a null leaves rlstream's default.
 */
function unsetsDefault(to: string, value: unknown): boolean {
  if (value !== null && value !== undefined) return false;
  const s = schemaAt(configSchema, to.split('.'));
  return s !== undefined && s !== null && !unwrap(s).nullable;
}

const withNullNote = (note: string | undefined) => `${note ? `${note}; ` : ''}null leaves rlstream's default`;

/** The key names a dialect knows directly under `parent` (rules, defaults, patterns, one-to-one rlstream keys). */
function knownKeysUnder(d: Dialect, parent: string): string[] {
  const pre = parent === '' ? '' : `${parent}.`;
  const names = new Set<string>();
  const add = (key: string) => {
    if (key.startsWith(pre)) names.add(key.slice(pre.length).split('.')[0]);
  };
  for (const r of d.rules) add(r.from);
  for (const k of Object.keys(d.defaults)) add(k);
  for (const p of d.notApplicable) if (!p.startsWith('*.')) add(p.replace(/\.\*$/, ''));
  const natives = [parent, ...d.prefixes.filter(([a]) => pre.startsWith(a)).map(([a, b]) => b + pre.slice(a.length))];
  for (const n of natives) {
    const segs = n.replace(/\.$/, '').split('.').filter(Boolean);
    const shape = objectShape(schemaAt(configSchema, segs) ?? configSchema);
    if (shape && (segs.length > 0 || parent === '')) for (const k of Object.keys(shape)) names.add(k);
  }
  return [...names];
}

/** Translates a document written in dialect `d` (its overrides already applied). */
export function translate(d: Dialect, doc: Obj): Translation {
  const merged = clone(doc);
  const fromDefault = new Set<string>();
  for (const [k, v] of Object.entries(d.defaults)) {
    if (getPath(merged, k) === undefined) {
      setPath(merged, k, clone(v));
      fromDefault.add(k);
    }
  }
  const rules = new Map(d.rules.map((r) => [r.from, r]));
  const ctx: RuleContext = { get: (p) => getPath(merged, p) };
  const config: Obj = {};
  const entries: TranslationEntry[] = [];
  const notApplicable: string[] = [];
  const problems: TranslationProblem[] = [];
  const origin = (key: string) => (fromDefault.has(key) ? 'default' : 'file');

  const walk = (node: Obj, path: string[]) => {
    for (const [k, v] of Object.entries(node)) {
      const key = [...path, k].join('.');
      const rule = rules.get(key);
      if (rule) {
        const out = rule.map ? rule.map(v, ctx) : rule.to.length > 0 ? ([[rule.to[0], v]] as Assignments) : [];
        if (typeof out === 'string') {
          problems.push({ key, text: `${key}: ${out}` });
          continue;
        }
        const kept = out.filter(([to, val]) => !unsetsDefault(to, val));
        for (const [to, val] of kept) setPath(config, to, val);
        const note = kept.length < out.length ? withNullNote(rule.note) : rule.note;
        entries.push({ from: key, value: v, to: kept, note, origin: origin(key), kind: 'rule' });
        continue;
      }
      if (d.notApplicable.some((p) => matchesPattern(key, p))) {
        if (!fromDefault.has(key)) notApplicable.push(key);
        entries.push({ from: key, value: v, to: [], origin: origin(key), kind: 'not-applicable' });
        continue;
      }
      const same = sameKey(d, key);
      const sameIsSection = same !== null && nativeKind(same) === 'section';
      if (isPlainObject(v) && (same === null || sameIsSection)) {
        if (Object.keys(v).length > 0) walk(v, [...path, k]);
        continue;
      }
      if (same !== null && !sameIsSection) {
        if (unsetsDefault(same, v)) {
          entries.push({
            from: key,
            value: v,
            to: [],
            note: withNullNote(undefined),
            origin: origin(key),
            kind: 'same',
          });
          continue;
        }
        setPath(config, same, v);
        entries.push({ from: key, value: v, to: [[same, v]], origin: origin(key), kind: 'same' });
        continue;
      }
      const near = closest(k, knownKeysUnder(d, path.join('.')));
      problems.push({
        key,
        text: near
          ? `${key}: unknown ${d.title} key — did you mean "${[...path, near].join('.')}"?`
          : `${key}: unknown ${d.title} key; remove it, or write its rlstream equivalent (docs/dialects.md lists the ${d.title} keys, docs/config.md rlstream's)`,
      });
    }
  };
  walk(merged, []);
  return { dialect: d, config, entries, notApplicable, problems };
}

// ---------------------------------------------------------------------------------------------
// Helpers the dialect tables share

/** A rule whose key has no effect unless it holds one of `inert` (any other value is refused with `why`). */
export function onlyInert(from: string, inert: readonly unknown[], why: string): Rule {
  return {
    from,
    to: [],
    note: `accepted while ${inert.map((v) => JSON.stringify(v)).join(' or ')}; otherwise refused: ${why}`,
    map: (v) =>
      inert.some((x) => JSON.stringify(x) === JSON.stringify(v ?? null))
        ? []
        : `${JSON.stringify(v)} is not supported: ${why}`,
  };
}

/** A rule renaming a key (same value). */
export function rename(from: string, to: string, note?: string): Rule {
  return { from, to: [to], ...(note ? { note } : {}) };
}

/** A rule mapping values through a table (a value not in it is refused, listing the accepted ones). */
export function valueMap(from: string, to: string, table: Readonly<Record<string, unknown>>, note?: string): Rule {
  return {
    from,
    to: [to],
    note:
      note ??
      Object.entries(table)
        .map(([k, v]) => `${k} → ${JSON.stringify(v)}`)
        .join(', '),
    map: (v) =>
      typeof v === 'string' && Object.hasOwn(table, v)
        ? [[to, table[v]]]
        : `${JSON.stringify(v)} is not supported here; accepted: ${Object.keys(table).join(', ')}`,
  };
}

/** `n` as a positive integer read from the document (a batch size multiplier), or null. */
export function positiveInt(v: unknown): number | null {
  return typeof v === 'number' && Number.isInteger(v) && v >= 1 ? v : null;
}

/** Batch sizes the source counts in prompts: × rollout.n to count samples, as rlstream does. */
export function timesN(from: string, to: string, nKey: string): Rule {
  return {
    from,
    to: [to],
    note: `× ${nKey}: the source counts prompts, rlstream counts samples (prompts × n)`,
    map: (v, ctx) => {
      const n = positiveInt(ctx.get(nKey)) ?? 1;
      if (positiveInt(v) === null) return `expected a positive integer, got ${JSON.stringify(v)}`;
      return [[to, (v as number) * n]];
    },
  };
}

/** Learning-rate schedules (EasyR1/verl/MTRL names) → actor.optim.lr_scheduler. */
export const LR_SCHEDULERS: Readonly<Record<string, string>> = {
  constant: 'constant',
  constant_with_warmup: 'constant',
  cosine: 'cosine',
  cosine_with_warmup: 'cosine',
};

/** KL estimator names: verl also accepts k1/k2/k3. */
export const KL_NAMES: Readonly<Record<string, string>> = {
  kl: 'kl',
  k1: 'kl',
  abs: 'abs',
  mse: 'mse',
  k2: 'mse',
  low_var_kl: 'low_var_kl',
  k3: 'low_var_kl',
  full: 'full',
};

/** trainer.logger: console and tensorboard are rlstream's sinks; others (wandb, swanlab, mlflow, file) are left out and listed. */
export function loggerRule(from: string): Rule {
  return {
    from,
    to: ['trainer.logger'],
    note: 'console and tensorboard kept; wandb, swanlab, mlflow, file and other sinks are not available here (metrics are in the run store: rlstream report)',
    map: (v) => {
      const list = typeof v === 'string' ? [v] : Array.isArray(v) ? v : null;
      if (!list) return `expected a list of logger names, got ${JSON.stringify(v)}`;
      const kept = list.filter((x) => x === 'console' || x === 'tensorboard');
      return [['trainer.logger', kept.length > 0 ? kept : ['console']]];
    },
  };
}

/** The dialect's keys written in the docs table: every rule, prefix and pattern. */
export function describeDialect(d: Dialect): {
  rules: Array<{ from: string; to: string; note: string }>;
  prefixes: Array<[string, string]>;
  notApplicable: string[];
  defaults: Array<[string, unknown]>;
} {
  return {
    rules: d.rules.map((r) => ({ from: r.from, to: r.to.join(', ') || '—', note: r.note ?? '' })),
    prefixes: d.prefixes.map(([a, b]) => [a, b]),
    notApplicable: [...d.notApplicable],
    defaults: Object.entries(d.defaults),
  };
}
