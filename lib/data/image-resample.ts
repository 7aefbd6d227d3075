import type { KernelEnum } from 'sharp';

/**
 * data.image_resample names. `bicubic` is Pillow's BICUBIC computed exactly (pil-resize.ts), as
 * transformers' Qwen2-VL image processor resizes; the others are sharp's (libvips) kernels.
 */
export const RESAMPLE_KERNELS = {
  nearest: 'nearest',
  bilinear: 'linear',
  mitchell: 'mitchell',
  lanczos2: 'lanczos2',
  lanczos3: 'lanczos3',
} as const satisfies Record<string, keyof KernelEnum>;
export const IMAGE_RESAMPLES = ['bicubic', ...(Object.keys(RESAMPLE_KERNELS) as (keyof typeof RESAMPLE_KERNELS)[])] as [
  'bicubic',
  ...(keyof typeof RESAMPLE_KERNELS)[],
];
export type ImageResample = (typeof IMAGE_RESAMPLES)[number];
