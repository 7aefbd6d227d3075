/**
 * Images on their way to a vision-language policy (lib/model/vision.ts), for the stages:
 * - the controller renders a prompt with images as Qwen-VL does: each image marker `<image>` in
 *   the prompt (or, when it has none, one per image before the text) becomes
 *   `<|vision_start|>` + `<|image_pad|>` × (image tokens) + `<|vision_end|>`, so the prompt ids on
 *   the topics and in the store are exactly the ids the model sees;
 * - rollout, advantage and update decode each group's PNG bytes once (PixelCache, by hash) and
 *   pass them per row as GenerationRequest / ScoreRequest / TrainBatch images.
 * A text-only policy gets no images (they are only stored, as before).
 */
import { ConfigError } from '../errors.ts';
import { PixelCache } from '../data/pixel-cache.ts';
import { imageHashOf } from '../data/image-hash.ts';
import type { ImagePixels } from '../data/images.ts';
import type { ModelConfig, VisionConfig } from '../model/config.ts';
import type { Tokenizer } from '../model/index.ts';

/** Where a prompt's image goes in its text (EasyR1 / generate --image); none = before the text. */
export const IMAGE_MARK = '<image>';

/** Decoder tokens of an image of `width`×`height` (sides on the patch × merge grid): (h/p)·(w/p)/m². */
export function imageTokensOf(v: VisionConfig, size: { width: number; height: number }): number {
  const f = v.patchSize * v.spatialMergeSize;
  if (size.width % f !== 0 || size.height % f !== 0) {
    throw new ConfigError(
      `image ${size.width}×${size.height}: sides must be multiples of the vision tower's patch_size × spatial_merge_size = ${f} (set data.image_factor to ${f})`,
    );
  }
  return ((size.height / v.patchSize) * (size.width / v.patchSize)) / (v.spatialMergeSize * v.spatialMergeSize);
}

/** `text` with one IMAGE_MARK per image before it when it has no mark (Qwen-VL puts images first). */
export function withImageMarks(text: string, images: number): string {
  return images > 0 && !text.includes(IMAGE_MARK) ? IMAGE_MARK.repeat(images) + text : text;
}

/**
 * Ids of a rendered prompt holding one IMAGE_MARK per image: the text between marks encoded on
 * its own (the first piece with `addSpecialTokens`, as a whole prompt would be), each mark
 * replaced by the image's block with its pads expanded.
 */
export function imagePromptIds(
  tok: Tokenizer,
  text: string,
  addSpecialTokens: boolean,
  v: VisionConfig,
  sizes: readonly { width: number; height: number }[],
): Int32Array {
  const pieces = text.split(IMAGE_MARK);
  if (pieces.length - 1 !== sizes.length) {
    throw new ConfigError(
      `the prompt has ${pieces.length - 1} ${IMAGE_MARK} markers for ${sizes.length} images; write one per image, or none to put the images before the text`,
    );
  }
  const out: number[] = [];
  pieces.forEach((piece, i) => {
    if (i > 0) {
      out.push(v.visionStartTokenId);
      for (let k = imageTokensOf(v, sizes[i - 1]); k > 0; k--) out.push(v.imageTokenId);
      out.push(v.visionEndTokenId);
    }
    if (piece.length > 0 || (i === 0 && addSpecialTokens))
      for (const id of tok.encode(piece, { addSpecialTokens: i === 0 && addSpecialTokens })) out.push(id);
  });
  return Int32Array.from(out);
}

/**
 * Decoded images per row for a model: `undefined` for a text-only model (it refuses images),
 * else each row's pixels in the order of its PNGs (the prompt's image order).
 */
export class PolicyImages {
  readonly enabled: boolean;
  constructor(
    model: Pick<ModelConfig, 'vision'>,
    private readonly cache = new PixelCache(),
  ) {
    this.enabled = Boolean(model.vision);
  }

  /** The pixels of one prompt's images (PNG bytes as the topics carry them). */
  async of(pngs: readonly Uint8Array[]): Promise<ImagePixels[]> {
    return Promise.all(pngs.map((png) => this.cache.get(imageHashOf(png), png)));
  }

  /** Per-row images aligned with `rows` (each a prompt's PNGs), or undefined for a text-only model. */
  async rows(rows: readonly (readonly Uint8Array[])[]): Promise<ImagePixels[][] | undefined> {
    if (!this.enabled) return undefined;
    return Promise.all(rows.map((r) => this.of(r)));
  }

  /** Pixels by group object (a group's samples share them), empty for a text-only model. */
  async byGroup<G extends { images: readonly Uint8Array[] }>(groups: readonly G[]): Promise<Map<G, ImagePixels[]>> {
    const out = new Map<G, ImagePixels[]>();
    if (!this.enabled) return out;
    for (const g of groups) out.set(g, await this.of(g.images));
    return out;
  }
}
