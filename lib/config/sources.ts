/**
 * Where each configured value came from: `file.yaml:line:col` for keys read from the YAML file,
 * `override "a.b=c"` for command-line overrides. Error messages look up the longest recorded
 * prefix of a problem's path, so a bad value points at the line or override that set it.
 */
import { readFileSync } from 'node:fs';
import { LineCounter, parseDocument, isMap, isSeq, isScalar, type Node as YamlNode } from 'yaml';
import { ConfigError } from '../errors.ts';

export type Path = ReadonlyArray<string | number>;

const keyOf = (path: Path) => path.map(String).join('\u0000');

/** Provenance of configured values, by path. */
export interface Source {
  /** `file.yaml:3:5` or `override "a.b=c"`. */
  where: string;
  /** Sort key: file positions in file order first, then overrides in the order given. */
  order: [number, number, number];
}

export class Sources {
  private readonly map = new Map<string, Source>();

  set(path: Path, source: Source): void {
    this.map.set(keyOf(path), source);
  }

  /** Forget a path and everything under it (its value was replaced). */
  clear(path: Path): void {
    const k = keyOf(path);
    for (const key of [...this.map.keys()]) {
      if (key === k || k === '' || key.startsWith(k + '\u0000')) this.map.delete(key);
    }
  }

  /** The source of the longest recorded prefix of `path`, or undefined (a default). */
  lookup(path: Path): Source | undefined {
    for (let n = path.length; n >= 0; n--) {
      const hit = this.map.get(keyOf(path.slice(0, n)));
      if (hit !== undefined) return hit;
    }
    return undefined;
  }
}

/** Reads a YAML config file; records the position of every key. YAML errors are reported all at once. */
export function readYamlFile(file: string, sources: Sources): unknown {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as { code?: string }).code;
    throw new ConfigError(
      code === 'ENOENT'
        ? `config file not found: ${file}`
        : `cannot read config file ${file}: ${(err as Error).message}`,
    );
  }
  return parseYamlText(text, file, sources);
}

export function parseYamlText(text: string, file: string, sources: Sources): unknown {
  const lc = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lc, prettyErrors: false, uniqueKeys: true });
  if (doc.errors.length > 0) {
    const lines = doc.errors.map((e) => {
      const pos = e.linePos?.[0] ?? lc.linePos(e.pos[0]);
      return `${file}:${pos.line}:${pos.col}: YAML syntax error: ${e.message.split('\n')[0]}`;
    });
    throw new ConfigError(
      lines.length === 1
        ? `invalid configuration: ${lines[0]}`
        : `invalid configuration (${lines.length} problems):\n  ${lines.join('\n  ')}`,
      { problems: lines },
    );
  }
  const at = (offset: number): Source => {
    const p = lc.linePos(offset);
    return { where: `${file}:${p.line}:${p.col}`, order: [0, p.line, p.col] };
  };
  const walk = (node: unknown, path: Array<string | number>) => {
    if (isMap(node)) {
      for (const item of node.items) {
        const k = item.key as YamlNode | null;
        const name = isScalar(k) ? String(k.value) : String(k);
        const p = [...path, name];
        const range = (k as YamlNode | null)?.range;
        if (range) sources.set(p, at(range[0]));
        walk(item.value, p);
      }
    } else if (isSeq(node)) {
      node.items.forEach((item, i) => {
        const p = [...path, i];
        const range = (item as YamlNode | null)?.range;
        if (range) sources.set(p, at(range[0]));
        walk(item, p);
      });
    }
  };
  walk(doc.contents, []);
  const value = doc.toJS({ maxAliasCount: 1000 }) as unknown;
  if (value === null || value === undefined) return {};
  if (typeof value !== 'object' || Array.isArray(value)) {
    throw new ConfigError(
      `invalid configuration: ${file}: the top level must be a mapping of sections (data, algorithm, rollout, actor, critic, reward, trainer, pipeline), got ${Array.isArray(value) ? 'a list' : typeof value}`,
    );
  }
  return value;
}
