/**
 * The config dialects by name (`--dialect NAME`), recognition of a document's dialect by its
 * sections, OmegaConf-style `${a.b}` interpolations, Hydra-style overrides on the source document,
 * and the printed translation (`rlstream config --print-translation`). docs/dialects.md is
 * generated from these tables (scripts/gen-dialect-docs.ts).
 */
import { ConfigError } from '../../errors.ts';
import { isSecretKey, redactString, REDACTED } from '../redact.ts';
import { easyr1 } from './easyr1.ts';
import { mtrl } from './mtrl.ts';
import { verl } from './verl.ts';
import { getPath, isPlainObject, setPath, type Dialect, type Obj, type Translation } from './dialect.ts';

export { translate, describeDialect } from './dialect.ts';
export type { Dialect, Translation, TranslationEntry, TranslationProblem } from './dialect.ts';

/** Recognition order: MTRL before EasyR1 (both have `worker`; MTRL's other sections decide). */
const DIALECTS: readonly Dialect[] = [mtrl, verl, easyr1];
const BY_NAME = new Map(DIALECTS.map((d) => [d.name, d]));

export const DIALECT_NAMES: readonly string[] = DIALECTS.map((d) => d.name);

export function dialects(): readonly Dialect[] {
  return DIALECTS;
}

/** The dialect of that name; an unknown name lists the valid ones. */
export function getDialect(name: string): Dialect {
  const d = BY_NAME.get(name.toLowerCase());
  if (!d) throw new ConfigError(`unknown config dialect "${name}"; valid dialects: ${DIALECT_NAMES.join(', ')}`);
  return d;
}

/** The dialect whose sections the document has, or null (an rlstream config). */
export function detectDialect(doc: Obj): Dialect | null {
  const top = Object.keys(doc);
  return DIALECTS.find((d) => d.marks.some((m) => top.includes(m))) ?? null;
}

const INTERP = /\$\{([A-Za-z0-9_.-]+)\}/g;

/**
 * Resolves OmegaConf interpolations as verl's YAML writes them: a value that is exactly
 * `${a.b.c}` becomes that key's value (any type); `${a.b}` inside a longer string is replaced by
 * its text. Unresolvable references and cycles are problems.
 */
export function resolveInterpolations(doc: Obj): string[] {
  const problems: string[] = [];
  const resolving = new Set<string>();
  const resolveValue = (v: unknown, at: string): unknown => {
    if (typeof v === 'string' && v.includes('${')) {
      const whole = /^\$\{([A-Za-z0-9_.-]+)\}$/.exec(v);
      if (whole) return lookup(whole[1], at);
      return v.replace(INTERP, (_m, ref: string) => String(lookup(ref, at)));
    }
    if (Array.isArray(v)) return v.map((x, i) => resolveValue(x, `${at}.${i}`));
    if (isPlainObject(v)) {
      for (const [k, x] of Object.entries(v)) v[k] = resolveValue(x, `${at}.${k}`);
    }
    return v;
  };
  const lookup = (ref: string, at: string): unknown => {
    if (resolving.has(ref)) {
      problems.push(`${at}: the interpolation \${${ref}} refers to itself`);
      return null;
    }
    const target = getPath(doc, ref);
    if (target === undefined) {
      problems.push(`${at}: the interpolation \${${ref}} names no key of this config`);
      return null;
    }
    resolving.add(ref);
    const out = resolveValue(target, ref);
    resolving.delete(ref);
    setPath(doc, ref, out);
    return out;
  };
  for (const [k, v] of Object.entries(doc)) doc[k] = resolveValue(v, k);
  return problems;
}

/** One line per source key: what it became. */
export function formatTranslation(t: Translation, file?: string): string {
  const lines = [
    `# ${t.dialect.title} config${file ? ` ${file}` : ''} → rlstream (docs/dialects.md)`,
    `# "${t.dialect.title} default": not in the file, ${t.dialect.title}'s default where it differs from rlstream's`,
  ];
  // secrets never printed: a secret key's value is redacted, as are credentials inside URLs
  const show = (v: unknown, key?: string) => {
    if (key !== undefined && isSecretKey(key.split('.').pop() ?? '')) return REDACTED;
    const s = redactString(JSON.stringify(v) ?? 'null');
    return s.length > 70 ? `${s.slice(0, 67)}...` : s;
  };
  const width = Math.min(56, Math.max(...t.entries.map((e) => e.from.length + 2 + show(e.value, e.from).length)));
  for (const e of t.entries) {
    const left = `${e.from}: ${show(e.value, e.from)}`.padEnd(width);
    const origin = e.origin === 'default' ? ` (${t.dialect.title} default)` : '';
    let right: string;
    if (e.kind === 'not-applicable') right = 'not applicable here';
    else if (e.to.length === 0) right = `no effect of its own${e.note ? ` (${e.note})` : ''}`;
    else {
      right = e.to.map(([k, v]) => `${k} = ${show(v, k)}`).join(', ');
      if (e.kind === 'rule' && e.note) right += `  # ${e.note}`;
    }
    lines.push(`${left} → ${right}${origin}`);
  }
  return lines.join('\n') + '\n';
}
