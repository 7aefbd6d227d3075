/**
 * Datasets for the controller: JSONL rows `{prompt, answer, images?, videos?}` with configurable
 * keys (the seed's format) and verl/EasyR1 parquet rows (`prompt` as chat messages,
 * `reward_model.ground_truth`). Every row is validated; a bad row is reported with its file and
 * line (parquet: row number) and the load either stops (`on_bad_row: stop`) or skips it and
 * reports it (`skip`) — never silently.
 */
import { readFileSync, existsSync } from 'node:fs';
import { extname } from 'node:path';
import { ConfigError } from '../errors.ts';

export interface DatasetRow {
  /** Position in the loaded dataset (0-based, after skipping bad rows and filtering). */
  index: number;
  /** The prompt as text (chat messages joined by chatToText, for a tokenizer without a chat template). */
  prompt: string;
  /** The prompt as given when it was chat messages (verl parquet), else null (a string prompt). */
  messages: Array<{ role: string; content: string }> | null;
  answer: string;
  /** Images as raw bytes (decoded from base64 or data URLs in the file). */
  images: Buffer[];
  source: { file: string; line: number };
  /** The row's `data_source` field (verl), when it has one. */
  dataSource?: string;
  /** The row's `extra_info` object (verl) as JSON text, when it has one. */
  extraInfo?: string;
}

export interface BadRow { file: string; line: number; reason: string }

export interface DatasetOptions {
  prompt_key: string;
  answer_key: string;
  image_key: string;
  format?: 'auto' | 'jsonl' | 'parquet';
  on_bad_row?: 'stop' | 'skip';
  max_rows?: number | null;
}

export interface LoadedDataset { rows: DatasetRow[]; bad: BadRow[] }

function get(obj: unknown, path: string): unknown {
  let cur: unknown = obj;
  for (const part of path.split('.')) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string, unknown>)[part];
  }
  return cur;
}

/** Chat messages (verl parquet) → prompt text: a lone user message is its content; otherwise `role: content` lines. */
export function chatToText(messages: unknown): string | null {
  if (!Array.isArray(messages)) return null;
  const parts: Array<{ role: string; content: string }> = [];
  for (const m of messages) {
    if (!m || typeof m !== 'object') return null;
    const role = (m as Record<string, unknown>).role;
    const content = (m as Record<string, unknown>).content;
    if (typeof role !== 'string' || typeof content !== 'string') return null;
    parts.push({ role, content });
  }
  if (parts.length === 1 && parts[0].role === 'user') return parts[0].content;
  return parts.map((p) => `${p.role}: ${p.content}`).join('\n');
}

function decodeImage(v: unknown): Buffer | null {
  if (typeof v === 'string') {
    const b64 = v.startsWith('data:') ? v.slice(v.indexOf(',') + 1) : v;
    if (!/^[A-Za-z0-9+/=\s]*$/.test(b64)) return null;
    return Buffer.from(b64, 'base64');
  }
  if (v instanceof Uint8Array) return Buffer.from(v);
  if (v && typeof v === 'object' && (v as { bytes?: unknown }).bytes instanceof Uint8Array) return Buffer.from((v as { bytes: Uint8Array }).bytes);
  return null;
}

/** Validates one raw record; returns the row fields or a reason. */
export function validateRecord(rec: unknown, opts: DatasetOptions, parquet: boolean): { prompt: string; messages: DatasetRow['messages']; answer: string; images: Buffer[]; dataSource?: string; extraInfo?: string } | { reason: string } {
  if (!rec || typeof rec !== 'object' || Array.isArray(rec)) return { reason: 'row is not a JSON object' };
  let promptRaw = get(rec, opts.prompt_key);
  if (promptRaw === undefined) return { reason: `missing prompt field "${opts.prompt_key}" (set data.prompt_key)` };
  let messages: DatasetRow['messages'] = null;
  if (typeof promptRaw !== 'string') {
    const t = chatToText(promptRaw);
    if (t === null) return { reason: `prompt field "${opts.prompt_key}" must be a string or a list of {role, content} messages` };
    messages = (promptRaw as Array<Record<string, unknown>>).map((m) => ({ role: m.role as string, content: m.content as string }));
    promptRaw = t;
  }
  const prompt = promptRaw as string;
  if (prompt.length === 0) return { reason: `prompt field "${opts.prompt_key}" is empty` };
  let answerRaw = get(rec, opts.answer_key);
  if (answerRaw === undefined && parquet) answerRaw = get(rec, 'reward_model.ground_truth');
  if (answerRaw === undefined) return { reason: `missing answer field "${opts.answer_key}" (set data.answer_key)` };
  if (typeof answerRaw === 'number' || typeof answerRaw === 'bigint' || typeof answerRaw === 'boolean') answerRaw = String(answerRaw);
  if (typeof answerRaw !== 'string') return { reason: `answer field "${opts.answer_key}" must be a string or number` };
  const images: Buffer[] = [];
  const imgRaw = get(rec, opts.image_key);
  if (imgRaw !== undefined && imgRaw !== null) {
    const list = Array.isArray(imgRaw) ? imgRaw : [imgRaw];
    for (let i = 0; i < list.length; i++) {
      const b = decodeImage(list[i]);
      if (!b) return { reason: `image ${i} in "${opts.image_key}" is not base64 / bytes` };
      images.push(b);
    }
  }
  // verl's per-row data_source and extra_info, passed to the reward function
  const ds = get(rec, 'data_source');
  if (ds !== undefined && ds !== null && typeof ds !== 'string') return { reason: 'field "data_source" must be a string' };
  const extra = get(rec, 'extra_info');
  if (extra !== undefined && extra !== null && (typeof extra !== 'object' || Array.isArray(extra))) return { reason: 'field "extra_info" must be an object' };
  return {
    prompt, messages, answer: answerRaw, images,
    ...(typeof ds === 'string' ? { dataSource: ds } : {}),
    ...(extra ? { extraInfo: JSON.stringify(extra, (_k, v: unknown) => (typeof v === 'bigint' ? Number(v) : v instanceof Uint8Array ? Buffer.from(v).toString('base64') : v)) } : {}),
  };
}

function detectFormat(file: string, format: DatasetOptions['format']): 'jsonl' | 'parquet' {
  if (format && format !== 'auto') return format;
  const ext = extname(file).toLowerCase();
  if (ext === '.parquet') return 'parquet';
  if (ext === '.jsonl' || ext === '.json' || ext === '.ndjson') return 'jsonl';
  throw new ConfigError(`cannot tell the format of data file ${file} from its extension; use .jsonl or .parquet, or set data.format`);
}

async function readParquet(file: string): Promise<unknown[]> {
  const { parquetReadObjects } = await import('hyparquet');
  const buf = readFileSync(file);
  const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  return await parquetReadObjects({ file: ab as ArrayBuffer });
}

export async function loadDataset(files: string[], opts: DatasetOptions): Promise<LoadedDataset> {
  const rows: DatasetRow[] = [];
  const bad: BadRow[] = [];
  const onBad = opts.on_bad_row ?? 'stop';
  const report = (b: BadRow) => {
    if (onBad === 'stop') throw new ConfigError(`bad row at ${b.file}:${b.line}: ${b.reason} (set data.on_bad_row=skip to skip bad rows)`);
    bad.push(b);
  };
  for (const file of files) {
    if (!existsSync(file)) throw new ConfigError(`data file not found: ${file}`);
    const fmt = detectFormat(file, opts.format);
    const records: Array<{ line: number; rec: unknown } | { line: number; error: string }> = [];
    if (fmt === 'jsonl') {
      const lines = readFileSync(file, 'utf8').split('\n');
      for (let i = 0; i < lines.length; i++) {
        const text = lines[i].trim();
        if (!text) continue;
        try { records.push({ line: i + 1, rec: JSON.parse(text) }); } catch (e) { records.push({ line: i + 1, error: `not valid JSON (${(e as Error).message})` }); }
      }
    } else {
      const objs = await readParquet(file);
      objs.forEach((rec, i) => records.push({ line: i + 1, rec }));
    }
    for (const r of records) {
      if (opts.max_rows && rows.length >= opts.max_rows) break;
      if ('error' in r) { report({ file, line: r.line, reason: r.error }); continue; }
      const v = validateRecord(r.rec, opts, fmt === 'parquet');
      if ('reason' in v) { report({ file, line: r.line, reason: v.reason }); continue; }
      rows.push({ index: rows.length, ...v, source: { file, line: r.line } });
    }
  }
  if (rows.length === 0) throw new ConfigError(`no usable rows in ${files.join(', ')}${bad.length ? ` (${bad.length} bad rows skipped; first: ${bad[0].file}:${bad[0].line}: ${bad[0].reason})` : ''}`);
  return { rows, bad };
}
