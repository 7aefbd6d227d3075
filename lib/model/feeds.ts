/**
 * Graph inputs shared by the policy graphs: the weights (HF-named inputs read in place) and the
 * prompts of a generation batch (each distinct prompt once, left-padded; decode-graph.ts GEN_IO).
 */
import { ort, tensor } from '../onnx/runtime.ts';
import type { ModelConfig } from './config.ts';
import { GEN_IO } from './decode-graph.ts';
import { paramSpecs, type Weights } from './params.ts';
import { visionFeeds, type ImagePixels } from './vision.ts';

/** Identity numbers of image objects: prompts share a prefill only when they share the very image objects. */
const imageIds = new WeakMap<ImagePixels, number>();
let nextImageId = 0;
export function imageKey(images: readonly ImagePixels[] | undefined): string {
  if (!images || images.length === 0) return '';
  return `|img:${images
    .map((im) => {
      let k = imageIds.get(im);
      if (k === undefined) {
        k = nextImageId++;
        imageIds.set(im, k);
      }
      return k;
    })
    .join(',')}`;
}

const built = new WeakMap<Weights, { config: ModelConfig; feeds: Record<string, ort.Tensor> }>();

/**
 * ORT input tensors over the weight arrays (no copy), by HF name. The tensors of a weights map are
 * built once and reused while every name still maps to the same array (a per-step caller pays a
 * lookup, not a tensor per weight).
 */
export function weightTensors(c: ModelConfig, w: Weights): Record<string, ort.Tensor> {
  const specs = paramSpecs(c);
  const hit = built.get(w);
  if (hit && hit.config === c && specs.every((s) => hit.feeds[s.name]?.data === w.get(s.name))) return hit.feeds;
  const feeds: Record<string, ort.Tensor> = {};
  for (const s of specs) feeds[s.name] = tensor('float32', w.get(s.name)!, s.shape);
  built.set(w, { config: c, feeds });
  return feeds;
}

/**
 * The prompt inputs of a batch of B rows: `prompt_ids` / `prompt_mask` [U, P] (each distinct
 * prompt, with its images, once; left-padded to the longest), `prompt_rows` [B] (the prompt each
 * row continues) and a VLM's vision inputs. `what` names the batch in errors.
 */
export function promptFeeds(
  c: ModelConfig,
  prompts: readonly { prompt: ArrayLike<number>; images?: readonly ImagePixels[] }[],
  what: string,
): Record<string, ort.Tensor> {
  const B = prompts.length;
  const P = Math.max(...prompts.map((r) => r.prompt.length));
  const uniq = new Map<string, number>();
  const rows = new BigInt64Array(B);
  const distinct: (typeof prompts)[number][] = [];
  prompts.forEach((r, i) => {
    const key = Array.prototype.join.call(r.prompt, ',') + imageKey(r.images);
    let k = uniq.get(key);
    if (k === undefined) {
      k = distinct.length;
      uniq.set(key, k);
      distinct.push(r);
    }
    rows[i] = BigInt(k);
  });
  const U = distinct.length;
  const ids = new BigInt64Array(U * P).fill(BigInt(c.padTokenId));
  const mask = new BigInt64Array(U * P);
  distinct.forEach((r, k) => {
    const off = k * P + P - r.prompt.length;
    for (let t = 0; t < r.prompt.length; t++) {
      ids[off + t] = BigInt(r.prompt[t]);
      mask[off + t] = 1n;
    }
  });
  return {
    [GEN_IO.promptIds]: tensor('int64', ids, [U, P]),
    [GEN_IO.promptMask]: tensor('int64', mask, [U, P]),
    [GEN_IO.promptRows]: tensor('int64', rows, [B]),
    ...(c.vision
      ? visionFeeds(
          c,
          ids,
          U,
          P,
          distinct.map((r) => r.images),
          what,
        )
      : {}),
  };
}
