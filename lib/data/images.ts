/**
 * Prompt images as the pipeline carries them: read from a dataset row (a file path relative to
 * data.image_dir, base64, a data URL, or parquet bytes), decoded with sharp (libvips), converted to
 * 8-bit RGB, resized to Qwen2-VL's patch grid (`smartResize`) with an explicit resampling kernel,
 * and encoded once as a normalised PNG. Its identity is `hash`: the lower-case hex sha256 of those
 * PNG bytes — the exact bytes that travel in the prompts topic and are stored in `prompt_images`,
 * so any stage holding the bytes can recompute the hash without decoding (a pixel hash would need
 * a decode). The PNG is encoded once, by the controller, so a run never sees two encodings of one
 * image.
 */
import { existsSync, readFileSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';
import sharp, { type Metadata, type OutputInfo } from 'sharp';
import { imageHash } from './image-hash.ts';
import { resizeBicubicPil } from './pil-resize.ts';
import { RESAMPLE_KERNELS, type ImageResample } from './image-resample.ts';

export { RESAMPLE_KERNELS, IMAGE_RESAMPLES, type ImageResample } from './image-resample.ts';

export { imageHash };

export interface SmartResizeOptions {
  /** Side multiple: the vision encoder's patch_size × merge_size (Qwen2-VL: 14 × 2 = 28). */
  factor: number;
  minPixels: number;
  maxPixels: number;
}

/** Qwen2-VL refuses images whose long side is more than this many times the short side. */
export const MAX_ASPECT_RATIO = 200;

/** Python's round(): halves go to the even neighbour (smart_resize uses it). */
function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/**
 * Qwen2-VL's smart_resize (transformers' Qwen2-VL image processor): both sides rounded to the
 * nearest multiple of `factor` (round half to even, as Python); when the area is then over
 * maxPixels, both sides are scaled by 1/√(h·w/maxPixels) and floored to the grid (at least one
 * factor); when under minPixels, scaled by √(minPixels/(h·w)) and ceiled to the grid. The result
 * keeps the aspect ratio approximately. Throws RangeError for sides < 1 or an aspect ratio over 200.
 * Returns [height, width].
 */
export function smartResize(height: number, width: number, o: SmartResizeOptions): [number, number] {
  const { factor, minPixels, maxPixels } = o;
  if (!(Number.isInteger(height) && Number.isInteger(width) && height >= 1 && width >= 1))
    throw new RangeError(`image size must be positive integers, got ${height}×${width}`);
  if (Math.max(height, width) / Math.min(height, width) > MAX_ASPECT_RATIO)
    throw new RangeError(
      `aspect ratio ${(Math.max(height, width) / Math.min(height, width)).toFixed(1)} is over ${MAX_ASPECT_RATIO}`,
    );
  let h = roundHalfEven(height / factor) * factor;
  let w = roundHalfEven(width / factor) * factor;
  if (h * w > maxPixels) {
    const beta = Math.sqrt((height * width) / maxPixels);
    h = Math.max(factor, Math.floor(height / beta / factor) * factor);
    w = Math.max(factor, Math.floor(width / beta / factor) * factor);
  } else if (h * w < minPixels) {
    const beta = Math.sqrt(minPixels / (height * width));
    h = Math.ceil((height * beta) / factor) * factor;
    w = Math.ceil((width * beta) / factor) * factor;
  }
  return [h, w];
}

export interface ImageOptions extends SmartResizeOptions {
  resample: ImageResample;
}

/** An image ready for the pipeline: the normalised PNG, its sha256 and its (resized) size. */
export interface PromptImage {
  hash: string;
  width: number;
  height: number;
  png: Buffer;
}

/** Why an image cannot be used; the dataset loader turns it into a bad row with its file:line. */
export class ImageError extends Error {}

const FILE_RE = /\.[A-Za-z0-9]{2,5}$/;

/**
 * The encoded bytes of one image field value: `{bytes}` / `{path}` objects (Hugging Face's Image
 * feature in parquet), raw bytes, a data URL, a file path (a string ending in an extension, which
 * base64 never does; relative to `imageDir`), or base64.
 */
export function imageBytes(v: unknown, imageDir: string): Buffer {
  if (v instanceof Uint8Array) return Buffer.from(v);
  if (v && typeof v === 'object' && !Array.isArray(v)) {
    const o = v as { bytes?: unknown; path?: unknown };
    if (o.bytes instanceof Uint8Array) return Buffer.from(o.bytes);
    if (typeof o.path === 'string') return imageBytes(o.path, imageDir);
    throw new ImageError('is an object without "bytes" or "path"');
  }
  if (typeof v !== 'string')
    throw new ImageError(`must be a file path, base64, a data URL or bytes, got ${v === null ? 'null' : typeof v}`);
  if (v.startsWith('data:')) {
    const comma = v.indexOf(',');
    if (comma < 0 || !/;base64$/i.test(v.slice(0, comma)))
      throw new ImageError('is a data URL that is not base64 (data:image/...;base64,...)');
    return Buffer.from(v.slice(comma + 1), 'base64');
  }
  if (FILE_RE.test(v)) {
    const file = isAbsolute(v) ? v : join(imageDir, v);
    if (!existsSync(file)) throw new ImageError(`file not found: ${file} (paths are relative to data.image_dir)`);
    try {
      return readFileSync(file);
    } catch (e) {
      throw new ImageError(`cannot read ${file} (${(e as Error).message})`);
    }
  }
  if (!/^[A-Za-z0-9+/=\s]+$/.test(v))
    throw new ImageError('is neither a file path (with an extension), a data URL nor base64');
  return Buffer.from(v, 'base64');
}

/**
 * Decodes `bytes` (any format libvips reads: PNG, JPEG, WebP, GIF, TIFF, AVIF, …), applies the EXIF
 * orientation, drops alpha (as PIL's convert('RGB')), resizes to smartResize's size with the kernel
 * and encodes a PNG. A side under `factor` pixels is too small (Qwen2-VL's processor refuses it).
 */
export async function prepareImage(bytes: Buffer, o: ImageOptions): Promise<PromptImage> {
  if (bytes.length === 0) throw new ImageError('is empty');
  let meta: Metadata;
  try {
    meta = await sharp(bytes).metadata();
  } catch (e) {
    throw new ImageError(`cannot be decoded (${(e as Error).message})`);
  }
  if (!meta.width || !meta.height) throw new ImageError('has no size (not an image)');
  // orientations 5–8 swap the sides
  const swap = (meta.orientation ?? 1) >= 5;
  const height = swap ? meta.width : meta.height;
  const width = swap ? meta.height : meta.width;
  if (height < o.factor || width < o.factor)
    throw new ImageError(
      `is ${width}×${height}, smaller than the ${o.factor}-pixel patch grid (data.image_factor) on a side`,
    );
  let size: [number, number];
  try {
    size = smartResize(height, width, o);
  } catch (e) {
    throw new ImageError(`is ${width}×${height}: ${(e as Error).message}`);
  }
  const [h, w] = size;
  let raw: { data: Buffer; info: OutputInfo };
  try {
    const decoded = sharp(bytes).rotate().removeAlpha().toColourspace('srgb');
    if (o.resample === 'bicubic') {
      const src = await decoded.raw().toBuffer({ resolveWithObject: true });
      const { width: sw, height: sh, channels } = src.info;
      const px = resizeBicubicPil(src.data, sw, sh, channels, w, h);
      raw = {
        data: Buffer.from(px.buffer, px.byteOffset, px.byteLength),
        info: { ...src.info, width: w, height: h, size: px.byteLength },
      };
    } else {
      raw = await decoded
        .resize(w, h, { fit: 'fill', kernel: RESAMPLE_KERNELS[o.resample] })
        .raw()
        .toBuffer({ resolveWithObject: true });
    }
  } catch (e) {
    throw new ImageError(`cannot be decoded (${(e as Error).message})`);
  }
  // zlib level 3: as small as the default 6 on photos in the benchmark (bench/images.ts), faster
  const png = await sharp(raw.data, {
    raw: { width: raw.info.width, height: raw.info.height, channels: raw.info.channels },
  })
    .png({ compressionLevel: 3 })
    .toBuffer();
  return { hash: imageHash(png), width: raw.info.width, height: raw.info.height, png };
}

/**
 * A generated image (raw RGB) as prepareImage would make it from its PNG: when smartResize keeps
 * its size, one PNG encode (the same bytes and hash prepareImage gives, without its three further
 * libvips passes: decode, no-op resize, re-encode); otherwise through prepareImage.
 */
export async function prepareRgbImage(img: ImagePixels, o: ImageOptions): Promise<PromptImage> {
  if (img.height >= o.factor && img.width >= o.factor) {
    let size: [number, number] | null = null;
    try {
      size = smartResize(img.height, img.width, o);
    } catch {
      /* prepareImage reports it */
    }
    if (size && size[0] === img.height && size[1] === img.width) {
      const png = await encodeRgbPng(img);
      return { hash: imageHash(png), width: img.width, height: img.height, png };
    }
  }
  return await prepareImage(await encodeRgbPng(img), o);
}

/** Raw 8-bit RGB (height × width × 3) → PNG bytes (a generated image, before prepareImage). */
export async function encodeRgbPng(img: ImagePixels): Promise<Buffer> {
  if (img.data.length !== img.width * img.height * 3)
    throw new RangeError(`RGB data has ${img.data.length} bytes, expected ${img.width}×${img.height}×3`);
  return await sharp(img.data, { raw: { width: img.width, height: img.height, channels: 3 } })
    .png({ compressionLevel: 3 })
    .toBuffer();
}

/** Decoded pixels of a normalised PNG: 8-bit RGB, row-major (height × width × 3). */
export interface ImagePixels {
  width: number;
  height: number;
  data: Uint8Array;
}

export async function decodePixels(png: Uint8Array): Promise<ImagePixels> {
  const { data, info } = await sharp(png).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  return {
    width: info.width,
    height: info.height,
    data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
  };
}
