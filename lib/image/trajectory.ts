/**
 * An image policy's samples as trajectory records and back. A record (contracts GeneratedImage)
 * holds the PNG the reward scores, the time grid t_0 = 1 > … > t_K = 0, each step's σ_t (0 for a
 * deterministic step) and the states x_{t_0} … x_{t_K}; the sample's tokens index its stochastic
 * steps and its behaviour log-probs are theirs (Flow-GRPO, Liu et al. 2025, arXiv 2505.05470), so
 * the update recomputes nothing the sampler drew.
 */
import type { GeneratedImage } from '../contracts/index.ts';
import { imageHash } from '../data/image-hash.ts';
import { imageToPng } from './png.ts';
import { Rng } from '../util/rng.ts';
import { sampleImages, type SampleResult, type VelocityFn } from './sde.ts';

/** One image of a sampled batch as the rollout publishes it. */
export interface ImageGeneration {
  /** Indices k of the stochastic steps (σ_k > 0). */
  tokens: Int32Array;
  /** log p(x_{t_{k+1}} | x_{t_k}) of each stochastic step (pixel mean). */
  logprobs: Float32Array;
  generated: GeneratedImage;
}

/** The B images of `r` (flat [B, C, S, S] states) as records, in batch order. */
export async function generationRecords(r: SampleResult, channels: number, size: number): Promise<ImageGeneration[]> {
  const pix = channels * size * size;
  const B = r.x0.length / pix;
  const stochastic = r.sigmas.flatMap((s, k) => (s > 0 ? [k] : []));
  if (stochastic.length !== r.steps.length)
    throw new Error(`${r.steps.length} recorded steps for ${stochastic.length} stochastic ones`);
  const out: ImageGeneration[] = [];
  for (let b = 0; b < B; b++) {
    const latents = new Float32Array(r.states.length * pix);
    r.states.forEach((x, k) => latents.set(x.subarray(b * pix, (b + 1) * pix), k * pix));
    const png = Buffer.from(await imageToPng(r.x0.subarray(b * pix, (b + 1) * pix), channels, size));
    out.push({
      tokens: Int32Array.from(stochastic),
      logprobs: Float32Array.from(r.steps, (s) => s.logProbs[b]),
      generated: {
        png,
        hash: imageHash(png),
        timesteps: Float32Array.from(r.grid),
        sigmas: Float32Array.from(r.sigmas),
        latents,
      },
    });
  }
  return out;
}

/** The clean image x_{t_K} of a record (before PNG quantisation): [C, S, S] flat. */
export function cleanImage(g: GeneratedImage, pixels: number): Float32Array {
  const K = g.timesteps.length - 1;
  if (g.latents.length !== (K + 1) * pixels)
    throw new RangeError(`generated image ${g.hash}: ${g.latents.length} latent values, expected ${(K + 1) * pixels}`);
  return g.latents.subarray(K * pixels, (K + 1) * pixels);
}

/** One stochastic denoising step of a batch: inputs of the flow_grpo loss. */
export interface StepBatch {
  t: number;
  tNext: number;
  sigma: number;
  /** x_t and x_{t_next} of every sample, flat [B, C, S, S]. */
  xT: Float32Array;
  xNext: Float32Array;
  /** The behaviour log-probability of the step of every sample. */
  oldLogProbs: number[];
}

/**
 * The stochastic steps of a batch of records (one StepBatch per step index, in order), with each
 * sample's recorded log-probs. The records must share their time grid and σ schedule: the
 * sampler's settings of one training step.
 */
export function stepBatches(
  samples: ReadonlyArray<{ generated: GeneratedImage; logprobs: Float32Array; tokens: Int32Array }>,
  pixels: number,
): StepBatch[] {
  if (!samples.length) return [];
  const first = samples[0].generated;
  const same = (a: Float32Array, b: Float32Array) => a.length === b.length && a.every((v, i) => v === b[i]);
  for (const s of samples)
    if (!same(s.generated.timesteps, first.timesteps) || !same(s.generated.sigmas, first.sigmas))
      throw new Error(
        `generated image ${s.generated.hash} was sampled on another time grid or noise schedule than ${first.hash}; a training step's samples share one`,
      );
  const B = samples.length;
  const out: StepBatch[] = [];
  samples[0].tokens.forEach((k, j) => {
    const xT = new Float32Array(B * pixels),
      xNext = new Float32Array(B * pixels);
    samples.forEach((s, b) => {
      if (s.tokens[j] !== k) throw new Error(`generated image ${s.generated.hash}: its stochastic steps differ`);
      xT.set(s.generated.latents.subarray(k * pixels, (k + 1) * pixels), b * pixels);
      xNext.set(s.generated.latents.subarray((k + 1) * pixels, (k + 2) * pixels), b * pixels);
    });
    out.push({
      t: first.timesteps[k],
      tNext: first.timesteps[k + 1],
      sigma: first.sigmas[k],
      xT,
      xNext,
      oldLogProbs: samples.map((s) => s.logprobs[j]),
    });
  });
  return out;
}

/** One image to sample: its deterministic sample id (the seed of its noise) and its prompt class. */
export interface ImageRequest {
  id: string;
  cls: number;
}

/**
 * Samples one image per request in one batch, each from its own random stream `seed/id` (so an
 * image depends only on its id, the seed and the weights, not on the batch): Flow-GRPO's SDE when
 * `noiseLevel` > 0, else the Euler ODE. Returns the generations in request order, shaped as the
 * rollout's results (finished, tokens = stochastic step indices).
 */
export async function sampleRequests(
  velocity: VelocityFn,
  requests: readonly ImageRequest[],
  o: { channels: number; size: number; steps: number; noiseLevel: number; seed: number },
): Promise<Array<ImageGeneration & { id: string; finishReason: 'eos' }>> {
  if (!requests.length) return [];
  const r = await sampleImages(velocity, {
    cls: requests.map((q) => q.cls),
    pixels: o.channels * o.size * o.size,
    steps: o.steps,
    noiseLevel: o.noiseLevel,
    rng: requests.map((q) => Rng.fromSeed(`${o.seed}/${q.id}`)),
  });
  const recs = await generationRecords(r, o.channels, o.size);
  return recs.map((g, i) => ({ ...g, id: requests[i].id, finishReason: 'eos' as const }));
}
