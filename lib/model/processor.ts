/**
 * The image processor of a Qwen2-VL / Qwen2.5-VL model directory (`preprocessor_config.json`,
 * transformers' Qwen2VLImageProcessor): smart_resize to multiples of patch_size × merge_size
 * within [min_pixels, max_pixels], bicubic resampling, rescale by 1/255 and CLIP mean / std
 * normalisation, patches of temporal_patch_size × patch_size² in merge-window order (vision.ts
 * patchify). Read and checked against the model's vision config; a setting this engine does not
 * compute is refused with one line naming the key.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from '../errors.ts';
import { isQwenVl, type ModelConfig } from './config.ts';
import { IMAGE_MEAN, IMAGE_STD } from './vision.ts';

export const PREPROCESSOR_FILE = 'preprocessor_config.json';

export interface ImageProcessorConfig {
  minPixels: number;
  maxPixels: number;
  /** Side multiple: patch_size × merge_size. */
  factor: number;
  resample: 'bicubic';
}

/** transformers' Qwen2VLImageProcessor defaults. */
export const QWEN_VL_MIN_PIXELS = 56 * 56,
  QWEN_VL_MAX_PIXELS = 28 * 28 * 1280;

/** preprocessor_config.json for a model (written with a fresh Qwen-VL directory). */
export function preprocessorJson(
  c: ModelConfig,
  min = QWEN_VL_MIN_PIXELS,
  max = QWEN_VL_MAX_PIXELS,
): Record<string, unknown> {
  const v = c.vision!;
  return {
    do_convert_rgb: true,
    do_normalize: true,
    do_rescale: true,
    do_resize: true,
    image_mean: [...IMAGE_MEAN],
    image_std: [...IMAGE_STD],
    image_processor_type: 'Qwen2VLImageProcessor',
    max_pixels: max,
    merge_size: v.spatialMergeSize,
    min_pixels: min,
    patch_size: v.patchSize,
    processor_class: c.modelType === 'qwen2_vl' ? 'Qwen2VLProcessor' : 'Qwen2_5_VLProcessor',
    resample: 3,
    rescale_factor: 1 / 255,
    temporal_patch_size: v.temporalPatchSize,
  };
}

/**
 * The image processor of a model directory: its preprocessor_config.json (required for
 * model_type qwen2_vl / qwen2_5_vl; null for other models without one).
 */
export function readImageProcessor(dir: string, c: ModelConfig): ImageProcessorConfig | null {
  const file = join(dir, PREPROCESSOR_FILE);
  if (!existsSync(file)) {
    if (isQwenVl(c))
      throw new ConfigError(
        `${dir}: ${PREPROCESSOR_FILE} not found; a ${c.modelType} directory needs its image processor config (copy it from the model's repository)`,
      );
    return null;
  }
  const v = c.vision;
  if (!v) return null;
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  } catch (e) {
    throw new ConfigError(`${file} is not valid JSON (${(e as Error).message})`);
  }
  const bad = (k: string, want: string) =>
    new ConfigError(`${file}: ${k}=${JSON.stringify(j[k])} is not supported (${want})`);
  const eq = (k: string, want: number, what: string) => {
    if (j[k] !== undefined && j[k] !== want) throw bad(k, `must equal ${what} ${want}`);
  };
  eq('patch_size', v.patchSize, "vision_config's patch_size");
  eq('merge_size', v.spatialMergeSize, "vision_config's spatial_merge_size");
  eq('temporal_patch_size', v.temporalPatchSize, "vision_config's temporal_patch_size");
  for (const k of ['do_resize', 'do_rescale', 'do_normalize', 'do_convert_rgb'])
    if (j[k] !== undefined && j[k] !== true) throw bad(k, 'only true');
  if (j.resample !== undefined && j.resample !== 3) throw bad('resample', 'only 3, bicubic');
  if (typeof j.rescale_factor === 'number' && Math.abs(j.rescale_factor - 1 / 255) > 1e-9)
    throw bad('rescale_factor', 'only 1/255');
  const near = (a: unknown, b: readonly number[]) =>
    Array.isArray(a) && a.length === 3 && a.every((x, i) => typeof x === 'number' && Math.abs(x - b[i]) < 1e-6);
  if (j.image_mean !== undefined && !near(j.image_mean, IMAGE_MEAN))
    throw bad('image_mean', `only CLIP's [${IMAGE_MEAN}]`);
  if (j.image_std !== undefined && !near(j.image_std, IMAGE_STD)) throw bad('image_std', `only CLIP's [${IMAGE_STD}]`);
  // min/max pixels: top-level (Qwen's files) or size {shortest_edge, longest_edge} (newer transformers)
  const size = (j.size && typeof j.size === 'object' ? j.size : {}) as Record<string, unknown>;
  const pick = (k: string, sk: string, dflt: number): number => {
    const x = j[k] ?? size[sk] ?? dflt;
    if (typeof x !== 'number' || !Number.isInteger(x) || x <= 0) throw bad(k, 'a positive integer');
    return x;
  };
  const minPixels = pick('min_pixels', 'shortest_edge', QWEN_VL_MIN_PIXELS);
  const maxPixels = pick('max_pixels', 'longest_edge', QWEN_VL_MAX_PIXELS);
  if (maxPixels < minPixels) throw bad('max_pixels', `at least min_pixels ${minPixels}`);
  return { minPixels, maxPixels, factor: v.patchSize * v.spatialMergeSize, resample: 'bicubic' };
}
