/**
 * `rlstream sft`'s rows for an image policy (actor.model.kind = image): JSONL or parquet records
 * (data.train_files) with a prompt (sft.prompt_key: a string, or one user message) and one image
 * (data.image_key: a file path relative to data.image_dir or the data file, base64, a data URL,
 * bytes, or a {bytes}/{path} object; one value or a one-element list), read as the controller
 * reads prompt images (lib/data/images.ts imageBytes) and decoded to the model's C × S × S in
 * [−1, 1] (lib/image/png.ts decodeImage: short side to S, centre crop).
 *
 * The prompt vocabulary: a model directory's class_names (actor.model.path; a row whose prompt is
 * not one of them is a bad row), else the distinct prompts of the rows (trimmed) in JavaScript's string order
 * (UTF-16 code units). A row without a prompt or image, with several images, or whose image does not decode is
 * a bad row: data.on_bad_row = stop names its file:line, skip reports it.
 */
import { dirname, resolve } from 'node:path';
import type { Config } from '../config/index.ts';
import { ConfigError } from '../errors.ts';
import { chatToText, getPath, readRecords } from '../data/dataset.ts';
import { ImageError, imageBytes } from '../data/images.ts';
import { decodeImage } from '../image/png.ts';

export interface ImageSftData {
  /** Training images [n, C, S, S] in [−1, 1]. */
  images: Float32Array;
  /** The class of each image (an index into classNames). */
  cls: number[];
  /** The prompt of each class. */
  classNames: string[];
  /** file:line of each image's row. */
  sources: string[];
  skipped: Array<{ where: string; reason: string }>;
}

/** A record's prompt text and raw image value, or why it has none. */
export function parseImageSftRow(
  rec: unknown,
  keys: { prompt: string; image: string },
): { prompt: string; image: unknown } | { reason: string } {
  if (rec === null || typeof rec !== 'object' || Array.isArray(rec))
    return { reason: `a row is a JSON object with "${keys.prompt}" and "${keys.image}"` };
  const raw = getPath(rec, keys.prompt);
  const text = typeof raw === 'string' ? raw : chatToText(raw);
  if (text === null || text.trim().length === 0)
    return {
      reason: `no prompt: "${keys.prompt}" (sft.prompt_key) is ${raw === undefined ? 'missing' : JSON.stringify(raw)?.slice(0, 40)}; give the prompt the image is drawn for as a non-empty string`,
    };
  let img = getPath(rec, keys.image);
  if (Array.isArray(img)) {
    if (img.length !== 1)
      return {
        reason: `"${keys.image}" (data.image_key) holds ${img.length} images; an image policy learns one image per row`,
      };
    img = img[0];
  }
  if (img === undefined || img === null)
    return {
      reason: `no image: "${keys.image}" (data.image_key) is missing; give the image as a path (relative to the data file or data.image_dir), base64, a data URL or bytes`,
    };
  return { prompt: text.trim(), image: img };
}

/** The (prompt, image) rows of data.train_files at the model's shape; `classNames`: the model's vocabulary, null = from the data. */
export async function loadImageSftData(
  cfg: Config,
  shape: { channels: 1 | 3; imageSize: number },
  classNames: readonly string[] | null,
): Promise<ImageSftData> {
  const skipped: ImageSftData['skipped'] = [];
  const bad = (where: string, reason: string) => {
    if (cfg.data.on_bad_row === 'stop')
      throw new ConfigError(`${where}: ${reason} (or set data.on_bad_row=skip to skip such rows)`);
    skipped.push({ where, reason });
  };
  const rows: Array<{ prompt: string; x: Float32Array; where: string }> = [];
  for (const file of cfg.data.train_files) {
    const imageDir = cfg.data.image_dir ? resolve(cfg.data.image_dir) : dirname(resolve(file));
    for (const rec of await readRecords(file, cfg.data.format)) {
      if (cfg.data.max_rows && rows.length >= cfg.data.max_rows) break;
      const where = `${file}:${rec.line}`;
      if ('error' in rec) {
        bad(where, rec.error);
        continue;
      }
      const p = parseImageSftRow(rec.rec, { prompt: cfg.sft.prompt_key, image: cfg.data.image_key });
      if ('reason' in p) {
        bad(where, p.reason);
        continue;
      }
      if (classNames && !classNames.includes(p.prompt)) {
        bad(
          where,
          `prompt ${JSON.stringify(p.prompt)} is not one of the model's prompts (actor.model.path config.json class_names: ${classNames.join(', ')}); an image model draws a closed set of prompts — start a fresh model (unset actor.model.path) to learn new ones`,
        );
        continue;
      }
      let x: Float32Array;
      try {
        x = await decodeImage(imageBytes(p.image, imageDir), shape.channels, shape.imageSize);
      } catch (e) {
        bad(
          where,
          `image in "${cfg.data.image_key}" ${e instanceof ImageError ? e.message : `cannot be decoded (${(e as Error).message})`}`,
        );
        continue;
      }
      rows.push({ prompt: p.prompt, x, where });
    }
  }
  if (rows.length === 0)
    throw new ConfigError(
      `no usable rows in ${cfg.data.train_files.join(', ')}${skipped.length ? ` (${skipped.length} bad rows skipped; first: ${skipped[0].where}: ${skipped[0].reason})` : ''}`,
    );
  const names = classNames ? [...classNames] : [...new Set(rows.map((r) => r.prompt))].sort();
  const px = shape.channels * shape.imageSize * shape.imageSize;
  const images = new Float32Array(rows.length * px);
  rows.forEach((r, i) => images.set(r.x, i * px));
  return {
    images,
    cls: rows.map((r) => names.indexOf(r.prompt)),
    classNames: names,
    sources: rows.map((r) => r.where),
    skipped,
  };
}
