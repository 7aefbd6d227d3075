/**
 * Datasets for the controller: JSONL rows `{prompt, answer, images?, videos?}` with configurable
 * keys and verl/EasyR1 parquet rows (`prompt` as chat messages,
 * `reward_model.ground_truth`). Every row is validated; a bad row is reported with its file and
 * line (parquet: row number) and the load either stops (`on_bad_row: stop`) or skips it and
 * reports it (`skip`) — never silently. Images (`image_key`: paths, base64, data URLs or bytes, at
 * most `limit_images`) are decoded and resized here (lib/data/images.ts); one that is missing,
 * unreadable or too small makes its row a bad row.
 */
import { readFileSync, existsSync } from 'node:fs';
import { dirname, extname, resolve } from 'node:path';
import { ConfigError } from '../errors.ts';
import { ImageError, imageBytes, prepareImage, type ImageOptions, type PromptImage } from './images.ts';

export interface DatasetRow {
  /** Position in the loaded dataset (0-based, after skipping bad rows and filtering). */
  index: number;
  /** The prompt as text (chat messages joined by chatToText, for a tokenizer without a chat template). */
  prompt: string;
  /** The prompt as given when it was chat messages (verl parquet), else null (a string prompt). */
  messages: Array<{ role: string; content: string }> | null;
  answer: string;
  /** The row's images, decoded, resized to the patch grid and encoded as normalised PNGs. */
  images: PromptImage[];
  source: { file: string; line: number };
  /** The row's `data_source` field (verl), when it has one. */
  dataSource?: string;
  /** The row's `extra_info` object (verl) as JSON text, when it has one. */
  extraInfo?: string;
}

export interface BadRow {
  file: string;
  line: number;
  reason: string;
}

export interface DatasetOptions {
  prompt_key: string;
  answer_key: string;
  image_key: string;
  /** Field holding videos (data.video_key): a row with videos stops the load whatever on_bad_row says. Default videos. */
  video_key?: string;
  format?: 'auto' | 'jsonl' | 'parquet';
  on_bad_row?: 'stop' | 'skip';
  max_rows?: number | null;
  /** Directory that relative image paths resolve against; null/absent = the data file's directory. */
  image_dir?: string | null;
  /** Most images a row may carry (more is a bad row). Default 1. */
  limit_images?: number;
  /** Resizing (data.min_pixels, max_pixels, image_factor, image_resample). Default: EasyR1's. */
  image?: ImageOptions;
}

/** EasyR1's defaults: min_pixels 262144, max_pixels 4194304, Qwen2-VL's 28-pixel grid, bicubic. */
export const DEFAULT_IMAGE_OPTIONS: ImageOptions = {
  factor: 28,
  minPixels: 262144,
  maxPixels: 4194304,
  resample: 'bicubic',
};

export interface LoadedDataset {
  rows: DatasetRow[];
  bad: BadRow[];
}

/** A field by dotted path (`a.b.c`); undefined when any part is missing. */
export function getPath(obj: unknown, path: string): unknown {
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

/** A record's fields before its images are decoded: `images` are the image field's raw values. */
export interface ValidatedRecord {
  prompt: string;
  messages: DatasetRow['messages'];
  answer: string;
  images: unknown[];
  dataSource?: string;
  extraInfo?: string;
}

/**
 * Validates one raw record; returns the row fields (images still raw) or a reason (`fatal`: stops
 * the load whatever data.on_bad_row says). The format flag is not read: every format falls back to
 * reward_model.ground_truth.
 */
export function validateRecord(
  rec: unknown,
  opts: DatasetOptions,
  _parquet: boolean,
): ValidatedRecord | { reason: string; fatal?: boolean } {
  if (!rec || typeof rec !== 'object' || Array.isArray(rec)) return { reason: 'row is not a JSON object' };
  let promptRaw = getPath(rec, opts.prompt_key);
  if (promptRaw === undefined) return { reason: `missing prompt field "${opts.prompt_key}" (set data.prompt_key)` };
  let messages: DatasetRow['messages'] = null;
  if (typeof promptRaw !== 'string') {
    const t = chatToText(promptRaw);
    if (t === null)
      return { reason: `prompt field "${opts.prompt_key}" must be a string or a list of {role, content} messages` };
    messages = (promptRaw as Array<Record<string, unknown>>).map((m) => ({
      role: m.role as string,
      content: m.content as string,
    }));
    promptRaw = t;
  }
  const prompt = promptRaw as string;
  if (prompt.length === 0) return { reason: `prompt field "${opts.prompt_key}" is empty` };
  // rlstream trains on text and images: a row's videos would be lost, so they stop the load
  const videos = getPath(rec, opts.video_key ?? 'videos');
  if (videos !== undefined && videos !== null && !(Array.isArray(videos) && videos.length === 0))
    return {
      reason: `the row has videos in "${opts.video_key ?? 'videos'}", and rlstream trains on text and images only; remove the videos from the data (or set data.video_key to a field the rows do not have)`,
      fatal: true,
    };
  // verl's preprocessing puts the ground truth in reward_model.ground_truth (parquet and JSONL alike)
  let answerRaw = getPath(rec, opts.answer_key);
  if (answerRaw === undefined) answerRaw = getPath(rec, 'reward_model.ground_truth');
  if (answerRaw === undefined)
    return {
      reason: `missing answer field "${opts.answer_key}" (and no reward_model.ground_truth; set data.answer_key)`,
    };
  if (typeof answerRaw === 'number' || typeof answerRaw === 'bigint' || typeof answerRaw === 'boolean')
    answerRaw = String(answerRaw);
  if (typeof answerRaw !== 'string') return { reason: `answer field "${opts.answer_key}" must be a string or number` };
  let images: unknown[] = [];
  const imgRaw = getPath(rec, opts.image_key);
  if (imgRaw !== undefined && imgRaw !== null) {
    images = Array.isArray(imgRaw) ? imgRaw : [imgRaw];
    const limit = opts.limit_images ?? 1;
    if (images.length > limit)
      return {
        reason: `${images.length} images in "${opts.image_key}", over data.limit_images = ${limit} (raise it, or drop images from the row)`,
      };
  }
  // verl's per-row data_source and extra_info, passed to the reward function
  const ds = getPath(rec, 'data_source');
  if (ds !== undefined && ds !== null && typeof ds !== 'string')
    return { reason: 'field "data_source" must be a string' };
  const extra = getPath(rec, 'extra_info');
  if (extra !== undefined && extra !== null && (typeof extra !== 'object' || Array.isArray(extra)))
    return { reason: 'field "extra_info" must be an object' };
  return {
    prompt,
    messages,
    answer: answerRaw,
    images,
    ...(typeof ds === 'string' ? { dataSource: ds } : {}),
    ...(extra
      ? {
          extraInfo: JSON.stringify(extra, (_k, v: unknown) =>
            typeof v === 'bigint' ? Number(v) : v instanceof Uint8Array ? Buffer.from(v).toString('base64') : v,
          ),
        }
      : {}),
  };
}

function detectFormat(file: string, format: DatasetOptions['format']): 'jsonl' | 'parquet' {
  if (format && format !== 'auto') return format;
  const ext = extname(file).toLowerCase();
  if (ext === '.parquet') return 'parquet';
  if (ext === '.jsonl' || ext === '.json' || ext === '.ndjson') return 'jsonl';
  throw new ConfigError(
    `cannot tell the format of data file ${file} from its extension; use .jsonl or .parquet, or set data.format`,
  );
}

async function readParquet(file: string): Promise<unknown[]> {
  const { parquetReadObjects } = await import('hyparquet');
  const buf = readFileSync(file);
  const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  // utf8: false keeps un-annotated binary columns (image bytes) as bytes; string columns are
  // annotated as such by every writer (pyarrow, datasets) and still read as strings
  return await parquetReadObjects({ file: ab as ArrayBuffer, utf8: false });
}

/** One record of a data file with its line (JSONL) or 1-based row number (parquet), or why it does not parse. */
export type FileRecord = { line: number; rec: unknown } | { line: number; error: string };

/** The records of a JSONL or parquet file (`format` auto: by extension), blank JSONL lines skipped. */
export async function readRecords(file: string, format: DatasetOptions['format']): Promise<FileRecord[]> {
  if (!existsSync(file)) throw new ConfigError(`data file not found: ${file}`);
  const records: FileRecord[] = [];
  if (detectFormat(file, format) === 'jsonl') {
    const lines = readFileSync(file, 'utf8').split('\n');
    for (let i = 0; i < lines.length; i++) {
      const text = lines[i].trim();
      if (!text) continue;
      try {
        records.push({ line: i + 1, rec: JSON.parse(text) });
      } catch (e) {
        records.push({ line: i + 1, error: `not valid JSON (${(e as Error).message})` });
      }
    }
  } else {
    const objs = await readParquet(file);
    objs.forEach((rec, i) => records.push({ line: i + 1, rec }));
  }
  return records;
}

export async function loadDataset(files: string[], opts: DatasetOptions): Promise<LoadedDataset> {
  const rows: DatasetRow[] = [];
  const bad: BadRow[] = [];
  const onBad = opts.on_bad_row ?? 'stop';
  const imageOpts = opts.image ?? DEFAULT_IMAGE_OPTIONS;
  const report = (b: BadRow) => {
    if (onBad === 'stop')
      throw new ConfigError(`bad row at ${b.file}:${b.line}: ${b.reason} (set data.on_bad_row=skip to skip bad rows)`);
    bad.push(b);
  };
  for (const file of files) {
    if (!existsSync(file)) throw new ConfigError(`data file not found: ${file}`);
    const fmt = detectFormat(file, opts.format);
    const imageDir = opts.image_dir ? resolve(opts.image_dir) : dirname(resolve(file));
    const records = await readRecords(file, fmt);
    for (const r of records) {
      if (opts.max_rows && rows.length >= opts.max_rows) break;
      if ('error' in r) {
        report({ file, line: r.line, reason: r.error });
        continue;
      }
      const v = validateRecord(r.rec, opts, fmt === 'parquet');
      if ('reason' in v && v.fatal) throw new ConfigError(`${file}:${r.line}: ${v.reason}`);
      if ('reason' in v) {
        report({ file, line: r.line, reason: v.reason });
        continue;
      }
      const images: PromptImage[] = [];
      let imageFailure: string | null = null;
      for (let i = 0; i < v.images.length && imageFailure === null; i++) {
        try {
          images.push(await prepareImage(imageBytes(v.images[i], imageDir), imageOpts));
        } catch (e) {
          if (!(e instanceof ImageError)) throw e;
          imageFailure = `image ${i} in "${opts.image_key}" ${e.message}`;
        }
      }
      if (imageFailure !== null) {
        report({ file, line: r.line, reason: imageFailure });
        continue;
      }
      rows.push({ index: rows.length, ...v, images, source: { file, line: r.line } });
    }
  }
  if (rows.length === 0)
    throw new ConfigError(
      `no usable rows in ${files.join(', ')}${bad.length ? ` (${bad.length} bad rows skipped; first: ${bad[0].file}:${bad[0].line}: ${bad[0].reason})` : ''}`,
    );
  return { rows, bad };
}
