/**
 * Loading the run configuration: schema defaults → YAML file → `RLSTREAM_<SECTION>__<KEY>`
 * environment overrides → `a.b.c=value` overrides (values parsed as YAML scalars or flow
 * collections), then the DISABLE_RL_REWARD_MODEL switch, derived
 * defaults and the cross-field checks. Every problem found is reported at once, one per line,
 * each naming its full key path and where the value came from (file:line:col or the override).
 */
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { parse as parseYaml } from 'yaml';
import type { z } from 'zod';
import { ConfigError } from '../errors.ts';
import { configSchema, type Config } from './schema.ts';
import { Sources, readYamlFile, type Path, type Source } from './sources.ts';
import { objectShape, schemaAt, schemaEntries, describeType, enumValues, kindOf } from './introspect.ts';
import { closest, RENAMED_KEYS } from './suggest.ts';
import { resolveDerived, checkConfig } from './checks.ts';
import { isSecretKey, redactString, REDACTED } from './redact.ts';
import { detectDialect, getDialect, resolveInterpolations, translate, type Translation } from './dialects/index.ts';

export interface LoadConfigOptions {
  /** YAML file with any subset of the sections. */
  file?: string;
  /** `a.b.c=value` overrides applied after the file, in order. */
  overrides?: string[];
  /** Environment read for DISABLE_RL_REWARD_MODEL and reward.remote.auth_token_env; default process.env. */
  env?: NodeJS.ProcessEnv;
  /** Receives each warning (a setting that is legal but probably not meant); default: process.emitWarning. */
  onWarning?: (message: string) => void;
  /** The command the config is for: `sft` checks only the keys `rlstream sft` reads (checks.ts checkSftConfig). Default train. */
  command?: 'train' | 'sft';
  /**
   * The file's dialect (easyr1, verl, mtrl: lib/config/dialects/); default: recognised by its
   * sections, else rlstream's own. A dialect's file and the `overrides` (in the dialect's key
   * names, Hydra-style `+key=value` accepted) are translated to rlstream's config first.
   */
  dialect?: string;
  /**
   * Receives the translation of a dialect config (before validation, also when it fails). Default:
   * its not-applicable keys, if any, go to onWarning as one line.
   */
  onTranslation?: (t: Translation) => void;
}

/** The one line listing a translation's not-applicable keys, or null when there are none. */
export function notApplicableLine(t: Translation): string | null {
  if (t.notApplicable.length === 0) return null;
  return `${t.dialect.title} config: not applicable here (single-process ONNX trainer; docs/dialects.md): ${t.notApplicable.join(', ')}`;
}

/** Name of the environment switch that turns the reward servers off (sets reward.remote.enabled = false). */
export const DISABLE_REWARD_MODEL_ENV = 'DISABLE_RL_REWARD_MODEL';

type Obj = Record<string, unknown>;
const isPlainObject = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v);
const dotted = (path: Path) => path.map(String).join('.');

/** A ConfigError listing every problem, one per line. */
export function configProblems(problems: string[]): ConfigError {
  const msg =
    problems.length === 1
      ? `invalid configuration: ${problems[0]}`
      : `invalid configuration (${problems.length} problems):\n  ${problems.join('\n  ')}`;
  return new ConfigError(msg, { problems });
}

// ---------------------------------------------------------------------------------------------
// Messages

/** Shows a given value in a message: short, typed, secrets redacted. */
function show(value: unknown, path: Path): string {
  if (path.some((seg) => typeof seg === 'string' && isSecretKey(seg))) return REDACTED;
  let text: string;
  let kind: string;
  if (value === undefined) return 'nothing';
  if (value === null) return 'null';
  if (typeof value === 'string') {
    text = JSON.stringify(redactString(value));
    kind = 'a string';
  } else if (Array.isArray(value)) {
    text = JSON.stringify(value);
    kind = 'a list';
  } else if (typeof value === 'object') {
    text = JSON.stringify(value);
    kind = 'a mapping';
  } else {
    text = String(value);
    kind = typeof value === 'number' ? 'a number' : typeof value === 'boolean' ? 'a boolean' : typeof value;
  }
  if (typeof value !== 'string' && typeof value === 'object') text = redactString(text);
  if (text.length > 80) text = `${text.slice(0, 77)}...`;
  return `${text} (${kind})`;
}

function valueAt(root: unknown, path: Path): unknown {
  let cur = root;
  for (const seg of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Obj)[String(seg)];
  }
  return cur;
}

const ALL_PATHS = schemaEntries(configSchema).map((e) => e.path);

/**
 * `unknown key "a.b.c" — did you mean "a.b.d"?`. Tries, in order: the verl/EasyR1 rename table,
 * a sibling within typo distance (carrying `rest` over when it stays valid), a key of the same
 * name elsewhere (e.g. `actor.lr` → `actor.optim.lr`), else lists the valid keys there.
 */
export function unknownKeyMessage(path: Path, rest: Path = []): string {
  const full = dotted([...path, ...rest]);
  const at = dotted(path);
  const renamed = RENAMED_KEYS[at] ?? RENAMED_KEYS[full];
  if (renamed) return `unknown key "${full}" — rlstream calls it ${renamed}`;
  const parent = path.slice(0, -1);
  const leaf = String(path[path.length - 1]);
  const siblings = Object.keys(objectShape(schemaAt(configSchema, parent) ?? configSchema) ?? {});
  const near = closest(leaf, siblings);
  if (near) {
    const fixed = [...parent, near];
    const withRest = rest.length > 0 && schemaAt(configSchema, [...fixed, ...rest]) ? [...fixed, ...rest] : fixed;
    return `unknown key "${full}" — did you mean "${dotted(withRest)}"?`;
  }
  const sameName = ALL_PATHS.filter((p) => p[p.length - 1] === leaf);
  const inSection = sameName.filter((p) => parent.length > 0 && p[0] === parent[0]);
  const pick = (inSection.length > 0 ? inSection : sameName).slice(0, 3);
  if (pick.length > 0) return `unknown key "${full}" — did you mean ${pick.map((p) => `"${dotted(p)}"`).join(' or ')}?`;
  return parent.length === 0
    ? `unknown section "${full}" — valid sections: ${siblings.join(', ')}`
    : `unknown key "${full}" — valid keys under "${dotted(parent)}": ${siblings.join(', ')}`;
}

function expected(path: Path): string {
  const s = schemaAt(configSchema, path);
  if (!s) return 'a valid value';
  if (kindOf(s) === 'object') return `a mapping (section with keys ${Object.keys(objectShape(s)!).join(', ')})`;
  return describeType(s);
}

interface Problem {
  text: string;
  order: Source['order'];
}
const NO_SOURCE: Source['order'] = [2, 0, 0];

/** One zod issue → problems, each prefixed with where its value came from. */
function formatIssue(issue: z.core.$ZodIssue, raw: unknown, sources: Sources): Problem[] {
  const path = issue.path as Array<string | number>;
  return issueLines(issue, path, raw).map(([text, p]) => {
    const src = sources.lookup(p);
    return { text: src ? `${src.where}: ${text}` : text, order: src?.order ?? NO_SOURCE };
  });
}

function issueLines(issue: z.core.$ZodIssue, path: Array<string | number>, raw: unknown): Array<[string, Path]> {
  const given = valueAt(raw, path);
  const p = dotted(path) || '(top level)';
  switch (issue.code) {
    case 'unrecognized_keys':
      return issue.keys.map((k): [string, Path] => [unknownKeyMessage([...path, k]), [...path, k]]);
    case 'invalid_value':
    case 'invalid_union': {
      const s = schemaAt(configSchema, path);
      const values = s ? enumValues(s) : null;
      if (values) {
        const names = values.map(String);
        const hint = typeof given === 'string' ? closest(given, names) : null;
        return [
          [
            `${p}: ${show(given, path)} is not one of: ${names.join(', ')}${hint ? ` — did you mean "${hint}"?` : ''}`,
            path,
          ],
        ];
      }
      return [[`${p}: expected ${expected(path)}, got ${show(given, path)}`, path]];
    }
    case 'invalid_type':
      return [[`${p}: expected ${expected(path)}, got ${show(given, path)}`, path]];
    case 'too_small':
    case 'too_big': {
      if (issue.origin === 'number' || issue.origin === 'int' || issue.origin === 'bigint') {
        return [[`${p}: must be ${expected(path)}, got ${show(given, path)}`, path]];
      }
      if (issue.origin === 'string' && issue.code === 'too_small') return [[`${p}: must not be empty`, path]];
      return [[`${p}: expected ${expected(path)}, got ${show(given, path)}`, path]];
    }
    case 'custom':
    case 'invalid_format':
      return [[`${p}: ${show(given, path)} — ${issue.message}`, path]];
    default:
      return [[`${p}: ${issue.message} (got ${show(given, path)})`, path]];
  }
}

// ---------------------------------------------------------------------------------------------
// Overrides

export interface ParsedOverride {
  path: string[];
  value: unknown;
  text: string;
}

const SEGMENT = /^[A-Za-z0-9_-]+$/;

/** `a.b.c=value` → path and YAML-parsed value (`=` alone → null). Throws nothing: returns an error string. */
export function parseOverride(text: string): ParsedOverride | string {
  const eq = text.indexOf('=');
  const keyText = eq > 0 ? text.slice(0, eq).trim() : '';
  const safeText =
    eq > 0 && isSecretKey(keyText.split('.').pop() ?? '') ? `${keyText}=${REDACTED}` : redactString(text);
  if (eq <= 0) return `override "${safeText}": expected key.path=value (e.g. actor.optim.lr=1e-5)`;
  const path = keyText.split('.');
  if (!path.every((s) => SEGMENT.test(s))) {
    return `override "${safeText}": "${keyText}" is not a key path (dot-separated names such as actor.optim.lr)`;
  }
  const valueText = text.slice(eq + 1);
  let value: unknown;
  try {
    value = parseYaml(valueText);
  } catch (err) {
    return `override "${safeText}": the value is not valid YAML (${(err as Error).message.split('\n')[0]}); quote strings with special characters`;
  }
  return { path, value: value === undefined ? null : value, text: safeText };
}

/** Merges `value` into `target[key]` where the schema has a section; replaces elsewhere. Records provenance. */
function assign(target: Obj, key: string, value: unknown, path: string[], sources: Sources, where: Source): void {
  const s = schemaAt(configSchema, path);
  if (s && kindOf(s) === 'object' && isPlainObject(value)) {
    if (!isPlainObject(target[key])) {
      target[key] = {};
      sources.clear(path);
    }
    for (const [k, v] of Object.entries(value)) assign(target[key] as Obj, k, v, [...path, k], sources, where);
    if (Object.keys(value).length === 0) sources.set(path, where);
    return;
  }
  target[key] = value;
  sources.clear(path);
  sources.set(path, where);
}

/** Applies the index-th override to the raw object; problems are appended. */
function applyOverride(
  raw: Obj,
  text: string,
  index: number,
  sources: Sources,
  problems: Problem[],
  source?: Source,
  orderOf: Source['order'] = [1, index, 0],
): void {
  const order: Source['order'] = source?.order ?? orderOf;
  const o = parseOverride(text);
  if (typeof o === 'string') {
    problems.push({ text: source ? `${source.where}: ${o.replace(/^override "[^"]*": /, '')}` : o, order });
    return;
  }
  const where: Source = source ?? { where: `override "${o.text}"`, order };
  for (let i = 0; i < o.path.length; i++) {
    const parent = schemaAt(configSchema, o.path.slice(0, i))!;
    const kind = kindOf(parent);
    if (kind === 'object') {
      if (!objectShape(parent)![o.path[i]]) {
        problems.push({
          text: `${where.where}: ${unknownKeyMessage(o.path.slice(0, i + 1), o.path.slice(i + 1))}`,
          order,
        });
        return;
      }
    } else if (kind !== 'record') {
      problems.push({
        text: `${where.where}: "${o.path.slice(0, i).join('.')}" is ${describeType(parent)}, not a section, so it has no key "${o.path[i]}"`,
        order,
      });
      return;
    }
    if (kind === 'record' && i < o.path.length - 1) {
      // inside a record value (e.g. reward.reward_fn_kwargs.a.b): free-form from here on
      break;
    }
  }
  let cur = raw;
  for (let i = 0; i < o.path.length - 1; i++) {
    const seg = o.path[i];
    if (!isPlainObject(cur[seg])) {
      cur[seg] = {};
      sources.clear(o.path.slice(0, i + 1));
    }
    cur = cur[seg] as Obj;
  }
  assign(cur, o.path[o.path.length - 1], o.value, o.path, sources, where);
}

// ---------------------------------------------------------------------------------------------
// Paths

/**
 * Keys that name input files or directories. A relative path written in the config file resolves
 * against that file's directory (so `rlstream train other/dir/run.yaml` finds the data next to the
 * yaml); one given as a command-line override resolves against the working directory, like any
 * shell argument; `~/…` is under the home directory. All are made absolute when loaded.
 * trainer.run_dir (an output) resolves the same way, so a config file means the same run directory
 * from wherever it is started.
 */
export const FILE_PATH_KEYS: ReadonlyArray<readonly string[]> = [
  ['data', 'train_files'],
  ['data', 'val_files'],
  ['data', 'image_dir'],
  ['actor', 'model', 'path'],
  ['critic', 'model', 'path'],
  ['reward', 'reward_fn_path'],
  ['rollout', 'multi_turn', 'interaction', 'path'],
  ['rollout', 'multi_turn', 'tool_config_path'],
  ['rollout', 'multi_turn', 'tool_executor', 'path'],
  ['reward', 'model', 'path'],
  ['trainer', 'load_checkpoint_path'],
  ['trainer', 'run_dir'],
];

/** Keys that name a program: resolved like FILE_PATH_KEYS when the value is a path (has a `/`), else a name looked up on PATH. */
export const PROGRAM_PATH_KEYS: ReadonlyArray<readonly string[]> = [['reward', 'python']];

const DATA_FILE_KEYS = new Set(['data.train_files', 'data.val_files']);

/** `a.jsonl, b.jsonl` → [a.jsonl, b.jsonl] (data.train_files / val_files; empty parts dropped). */
export function splitFileList(v: string): string[] {
  return v
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

/**
 * Makes the relative input paths absolute (see FILE_PATH_KEYS): those from `file` against its
 * directory, those from overrides against the working directory — so the config a run stores
 * (and a replay or resume reloads) means the same files wherever it is read.
 */
function resolveFilePaths(raw: Obj, file: string | undefined, sources: Sources): void {
  const fileBase = file === undefined ? null : dirname(resolve(file));
  const baseOf = (path: Path) => {
    const src = sources.lookup(path);
    // file: its directory; environment (1) and command-line (2) overrides: the working directory
    return src?.order[0] === 0 ? fileBase : src !== undefined && src.order[0] >= 1 ? process.cwd() : null;
  };
  const fix = (v: unknown, path: Path): unknown => {
    // `~/…` is the home directory, as verl's and EasyR1's Python (os.path.expanduser) reads it
    if (typeof v === 'string' && (v === '~' || v.startsWith('~/'))) return join(homedir(), v.slice(1));
    if (typeof v !== 'string' || v.length === 0 || isAbsolute(v)) return v;
    const base = baseOf(path);
    return base === null ? v : resolve(base, v);
  };
  for (const key of [...FILE_PATH_KEYS, ...PROGRAM_PATH_KEYS]) {
    const parent = valueAt(raw, key.slice(0, -1));
    if (!isPlainObject(parent)) continue;
    const leaf = key[key.length - 1];
    let v = parent[leaf];
    if (PROGRAM_PATH_KEYS.includes(key) && !(typeof v === 'string' && v.includes('/'))) continue;
    // verl/EasyR1 write several data files as one comma-separated string (data.train_files=a,b)
    if (DATA_FILE_KEYS.has(key.join('.')) && typeof v === 'string') v = splitFileList(v);
    parent[leaf] = Array.isArray(v) ? v.map((x, i) => fix(x, [...key, i])) : fix(v, key);
  }
}

// ---------------------------------------------------------------------------------------------
// Environment

/** Parses DISABLE_RL_REWARD_MODEL: true/1/yes/on → true; false/0/no/off/unset/empty → false. */
export function readDisableRewardModel(env: NodeJS.ProcessEnv): boolean | string {
  const v = env[DISABLE_REWARD_MODEL_ENV];
  if (v === undefined) return false;
  const t = v.trim().toLowerCase();
  if (['true', '1', 'yes', 'on'].includes(t)) return true;
  if (['false', '0', 'no', 'off', ''].includes(t)) return false;
  return `${DISABLE_REWARD_MODEL_ENV}=${JSON.stringify(v)} is not a boolean; set it to true or false (or unset it)`;
}

/** Prefix of the environment overrides: `RLSTREAM_<SECTION>__<KEY>[__<SUB>…]=value`. */
export const ENV_OVERRIDE_PREFIX = 'RLSTREAM_';

/**
 * The environment overrides, in name order: `RLSTREAM_PIPELINE__DATABASE_URL=postgres://…` is the
 * override `pipeline.database_url=postgres://…` (names lowercased, `__` separates keys, the value
 * parsed as a YAML scalar or flow collection like a command-line override:
 * `RLSTREAM_PIPELINE__BROKERS=[kafka:9092]`). They apply after the file and before the
 * command-line overrides. Only names with `__` count (RLSTREAM_LOG_JSON and the like are not
 * config). `where` names the variable, never its value when the key is a secret.
 */
export function envOverrides(env: NodeJS.ProcessEnv): Array<{ name: string; text: string; where: string }> {
  const out: Array<{ name: string; text: string; where: string }> = [];
  for (const name of Object.keys(env).sort()) {
    if (!name.startsWith(ENV_OVERRIDE_PREFIX) || !name.includes('__')) continue;
    const value = env[name];
    if (value === undefined) continue;
    const path = name.slice(ENV_OVERRIDE_PREFIX.length).toLowerCase().split('__');
    out.push({ name, text: `${path.join('.')}=${value}`, where: `environment ${name}` });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

/**
 * Only the `pipeline` section, from the `pipeline.*` overrides (others are ignored) over its
 * defaults, validated like the whole config but without the cross-section checks: for locating a
 * stored run (its database, bus) before the run's own config is known (`rlstream replay`).
 */
export function loadPipelineSection(overrides: readonly string[]): Config['pipeline'] {
  const sources = new Sources();
  const problems: Problem[] = [];
  const raw: Obj = {};
  overrides.forEach((text, i) => {
    if (text.startsWith('pipeline.')) applyOverride(raw, text, i, sources, problems);
  });
  const parsed = configSchema.shape.pipeline.safeParse(raw.pipeline ?? {});
  if (!parsed.success) {
    for (const issue of parsed.error.issues)
      problems.push(...formatIssue({ ...issue, path: ['pipeline', ...issue.path] } as z.core.$ZodIssue, raw, sources));
  }
  if (problems.length > 0 || !parsed.success) throw configProblems(problems.map((x) => x.text));
  return parsed.data;
}

/**
 * Builds the run configuration: defaults → `file` → `overrides`, then the environment switch,
 * derived defaults and cross-field checks. Throws one ConfigError listing every problem (its
 * `details.problems` holds them one per entry).
 */
export function loadConfig(opts: LoadConfigOptions = {}): Config {
  const env = opts.env ?? process.env;
  let sources = new Sources();
  const problems: Problem[] = [];
  let raw: Obj = opts.file !== undefined ? (readYamlFile(opts.file, sources) as Obj) : {};
  let overrides = opts.overrides ?? [];
  const dialect = opts.dialect !== undefined ? getDialect(opts.dialect) : detectDialect(raw);
  if (dialect) {
    const d = fromDialect(dialect, raw, overrides, sources, problems);
    (opts.onTranslation ?? defaultOnTranslation(opts))(d.translation);
    ({ raw, sources } = d);
    overrides = [];
  }
  const fromEnv = envOverrides(env);
  fromEnv.forEach((o, i) => applyOverride(raw, o.text, i, sources, problems, { where: o.where, order: [1, i, 0] }));
  overrides.forEach((text, i) => applyOverride(raw, text, i, sources, problems, undefined, [2, i, 0]));
  resolveFilePaths(raw, opts.file, sources);
  const disable = readDisableRewardModel(env);
  if (typeof disable === 'string') problems.push({ text: disable, order: NO_SOURCE });
  const parsed = configSchema.safeParse(raw);
  if (!parsed.success) {
    for (const issue of parsed.error.issues) problems.push(...formatIssue(issue, raw, sources));
  }
  if (problems.length > 0 || !parsed.success) {
    const cmp = (a: Problem, b: Problem) =>
      a.order[0] - b.order[0] || a.order[1] - b.order[1] || a.order[2] - b.order[2];
    throw configProblems([...problems].sort(cmp).map((p) => p.text));
  }
  const cfg = parsed.data;
  if (disable === true) cfg.reward.remote.enabled = false;
  const resolved = resolveDerived(cfg);
  valOnlyCheckpointActor(resolved);
  const { errors, warnings } = checkConfig(resolved, env, opts.command ?? 'train');
  if (errors.length > 0) throw configProblems(errors);
  const warn = opts.onWarning ?? ((m: string) => process.emitWarning(m, 'ConfigWarning'));
  for (const w of warnings) warn(w);
  return resolved;
}

function defaultOnTranslation(opts: LoadConfigOptions): (t: Translation) => void {
  const warn = opts.onWarning ?? ((m: string) => process.emitWarning(m, 'ConfigWarning'));
  return (t) => {
    const line = notApplicableLine(t);
    if (line) warn(line);
  };
}

/**
 * A dialect document → rlstream's raw config: the overrides (dialect key names; Hydra's `+` and
 * `++` prefixes accepted) set into the document, interpolations resolved, the document translated.
 * Each rlstream key keeps the position of the source key it came from (`file:line:col (EasyR1
 * worker.actor.global_batch_size)`), so problems and relative paths resolve as in a native file.
 */
function fromDialect(
  d: ReturnType<typeof getDialect>,
  doc: Obj,
  overrides: readonly string[],
  sources: Sources,
  problems: Problem[],
): { raw: Obj; sources: Sources; translation: Translation } {
  overrides.forEach((text, i) => {
    const o = parseOverride(text.replace(/^\+{1,2}/, ''));
    const order: Source['order'] = [2, i, 0];
    if (typeof o === 'string') {
      problems.push({ text: o, order });
      return;
    }
    let cur = doc;
    for (const seg of o.path.slice(0, -1)) {
      if (!isPlainObject(cur[seg])) cur[seg] = {};
      cur = cur[seg] as Obj;
    }
    cur[o.path[o.path.length - 1]] = o.value;
    sources.clear(o.path);
    sources.set(o.path, { where: `override "${o.text}"`, order });
  });
  for (const p of resolveInterpolations(doc)) problems.push({ text: p, order: NO_SOURCE });
  const t = translate(d, doc);
  for (const p of t.problems) {
    const src = sources.lookup(p.key.split('.'));
    problems.push({ text: `${src ? `${src.where}: ` : ''}${d.title} ${p.text}`, order: src?.order ?? NO_SOURCE });
  }
  const out = new Sources();
  for (const e of t.entries) {
    if (e.origin === 'default') continue;
    const src = sources.lookup(e.from.split('.'));
    if (!src) continue;
    for (const [to] of e.to) out.set(to.split('.'), { where: `${src.where} (${d.title} ${e.from})`, order: src.order });
  }
  return { raw: t.config, sources: out, translation: t };
}

/**
 * trainer.val_only with a training checkpoint (<run_dir>/checkpoints/global_step_N) evaluates that
 * checkpoint's policy: the checkpoint directory means its actor/, loaded as a model at version 0
 * (validating a checkpoint does not continue its run, so its step and data position do not apply).
 */
function valOnlyCheckpointActor(cfg: Config): void {
  const p = cfg.trainer.load_checkpoint_path;
  if (!cfg.trainer.val_only || !p) return;
  if (existsSync(join(p, 'trainer_state.json')) && existsSync(join(p, 'actor', 'model.safetensors')))
    cfg.trainer.load_checkpoint_path = join(p, 'actor');
}

/** The defaults with derived values filled (no file, no overrides, no checks). */
export function defaultConfig(): Config {
  return resolveDerived(configSchema.parse({}));
}
