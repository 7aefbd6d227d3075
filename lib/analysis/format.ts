/**
 * Printing query results: an aligned text table (default), CSV (RFC 4180) or JSON.
 *
 * Cells arrive as node-postgres parsed them (lib/analysis/query.ts keeps dates and times as the
 * server's text): numbers, strings, booleans, null, arrays (real[] → number[]), parsed jsonb
 * objects and Buffers (bytea). In table mode long arrays and long text are shortened with `…`
 * (the full value is in CSV/JSON), newlines are shown as `↵`; numbers keep full precision in
 * CSV/JSON (array elements show 4 significant digits in the table). JSON has no NaN/Infinity, so those are written as the strings "NaN", "Infinity",
 * "-Infinity" (a NaN loss is information, not null).
 */
import { formatNumber } from '../console/progress.ts';

export interface ResultColumn {
  name: string;
  /** PostgreSQL type oid of the column. */
  typeId: number;
}

export interface QueryResult {
  columns: ResultColumn[];
  /** One array of cells per row, in column order. */
  rows: unknown[][];
  /** The command tag's verb (SELECT, SHOW, EXPLAIN, …). */
  command: string;
}

export interface TableOptions {
  /** Longest cell in characters before it is cut with `…` (0 = no limit). Default 60. */
  maxWidth?: number;
  /** Array elements shown before `…`. Default 8. */
  maxArray?: number;
}

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && !Buffer.isBuffer(v);

function numberText(v: number, compact: boolean): string {
  if (!compact || Number.isSafeInteger(v)) return String(v);
  return formatNumber(v);
}

/** A compact rendering of an array: `[1, 2.5, …(+120)]` in table mode, JSON-like in full mode. */
function arrayText(a: unknown[], compact: boolean, maxArray: number): string {
  const shown = compact && a.length > maxArray ? a.slice(0, maxArray) : a;
  const parts = shown.map((x) =>
    Array.isArray(x)
      ? arrayText(x, compact, maxArray)
      : compact && typeof x === 'number' && Number.isFinite(x) && !Number.isSafeInteger(x)
        ? String(Number(x.toPrecision(4)))
        : scalarText(x, compact, true),
  );
  if (shown.length < a.length) parts.push(`…(+${a.length - shown.length})`);
  return `[${parts.join(compact ? ', ' : ',')}]`;
}

function scalarText(v: unknown, compact: boolean, inArray = false): string {
  if (v === null || v === undefined) return inArray ? 'null' : compact ? 'NULL' : '';
  if (typeof v === 'number') return numberText(v, compact);
  if (typeof v === 'bigint') return v.toString();
  if (typeof v === 'boolean') return compact ? (v ? 't' : 'f') : String(v);
  if (typeof v === 'string') return inArray ? JSON.stringify(v) : v;
  if (Buffer.isBuffer(v)) return `\\x${v.toString('hex')}`;
  if (v instanceof Date) return v.toISOString();
  if (Array.isArray(v)) return arrayText(v, compact, Number.POSITIVE_INFINITY);
  return JSON.stringify(v, (_k, x) => (typeof x === 'number' && !Number.isFinite(x) ? String(x) : x));
}

/** One cell as text: `compact` for the table (shortened), full otherwise (CSV). */
export function cellText(v: unknown, opts: TableOptions & { compact: boolean }): string {
  const maxArray = opts.maxArray ?? 8;
  let s = Array.isArray(v)
    ? arrayText(v, opts.compact, opts.compact ? maxArray : Number.POSITIVE_INFINITY)
    : scalarText(v, opts.compact);
  if (!opts.compact) return s;
  s = s.replace(/\r?\n/g, '↵').replace(/\t/g, ' ');
  const maxWidth = opts.maxWidth ?? 60;
  // Arrays are already bounded by maxArray; text is cut at maxWidth.
  if (!Array.isArray(v) && maxWidth > 0 && [...s].length > maxWidth)
    s = [...s].slice(0, Math.max(1, maxWidth - 1)).join('') + '…';
  return s;
}

const displayWidth = (s: string) => [...s].length;

/** Aligned text table with a header rule; numeric columns right-aligned. Empty result → header only. */
export function formatResultTable(res: QueryResult, opts: TableOptions = {}): string {
  const header = res.columns.map((c) => c.name);
  const body = res.rows.map((r) => r.map((v) => cellText(v, { ...opts, compact: true })));
  const numeric = res.columns.map(
    (_, i) =>
      res.rows.length > 0 &&
      res.rows.every((r) => r[i] === null || typeof r[i] === 'number' || typeof r[i] === 'bigint'),
  );
  const widths = header.map((h, i) => Math.max(displayWidth(h), ...body.map((r) => displayWidth(r[i]))));
  const pad = (s: string, i: number) => {
    const fill = ' '.repeat(Math.max(0, widths[i] - displayWidth(s)));
    return numeric[i] ? fill + s : s + fill;
  };
  const line = (cells: string[]) => cells.map(pad).join('  ').trimEnd();
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...body.map(line)].join('\n');
}

function csvField(s: string): string {
  return /[",\r\n]/.test(s) || s !== s.trim() ? `"${s.replaceAll('"', '""')}"` : s;
}

/** CSV with a header row; NULL is an empty field, arrays and JSON are JSON text, bytea is \x… hex. */
export function formatResultCsv(res: QueryResult): string {
  const lines = [res.columns.map((c) => csvField(c.name)).join(',')];
  for (const r of res.rows) lines.push(r.map((v) => csvField(cellText(v, { compact: false }))).join(','));
  return lines.join('\r\n') + '\r\n';
}

function jsonValue(v: unknown): unknown {
  if (v === undefined) return null;
  if (typeof v === 'number') return Number.isFinite(v) ? v : String(v);
  if (typeof v === 'bigint') return v.toString();
  if (Buffer.isBuffer(v)) return `\\x${v.toString('hex')}`;
  if (v instanceof Date) return v.toISOString();
  if (Array.isArray(v)) return v.map(jsonValue);
  if (isPlainObject(v)) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, jsonValue(x)]));
  return v;
}

/** Unique keys for the JSON objects: a repeated column name gets `_2`, `_3`, … */
export function uniqueColumnNames(columns: readonly ResultColumn[]): string[] {
  const seen = new Map<string, number>();
  const taken = new Set(columns.map((c) => c.name));
  return columns.map((c) => {
    const k = (seen.get(c.name) ?? 0) + 1;
    seen.set(c.name, k);
    if (k === 1) return c.name;
    let n = k,
      name = `${c.name}_${n}`;
    while (taken.has(name)) name = `${c.name}_${++n}`;
    taken.add(name);
    return name;
  });
}

/** A JSON array of row objects, one row per line. */
export function formatResultJson(res: QueryResult): string {
  const keys = uniqueColumnNames(res.columns);
  const rows = res.rows.map((r) => JSON.stringify(Object.fromEntries(keys.map((k, i) => [k, jsonValue(r[i])]))));
  return rows.length === 0 ? '[]\n' : `[\n${rows.join(',\n')}\n]\n`;
}
