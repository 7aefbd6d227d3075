/**
 * One RL iteration of an image policy: sample n images per prompt, score them, update.
 *
 * - Flow-GRPO (Liu et al. 2025, arXiv 2505.05470): SDE sampling (sde.ts) with each step's
 *   log-probability recorded; group-normalised advantages A = (R − mean_group)/(std_group + 1e-4);
 *   one update per recorded denoising step (the clipped ratio of that step, KL to the reference's
 *   step mean when klCoef > 0), all images of the iteration in one batch.
 * - DiffusionNFT (Zheng et al. 2025, arXiv 2509.16117): any sampler (ODE here); optimality
 *   r = ½ + ½·clip(A/5, −1, 1), A = (R − mean_group)/(std_batch(R) + 1e-4) (nftOptimality); updates on
 *   fresh (t, ε) of the forward process from the clean images, v_old = the sampling policy's velocity.
 *   The sampling policy θ_old is a soft copy of the trained weights (the paper's §3.3 / Alg. 1):
 *   after each iteration i (1, 2, …) θ_old ← η_i·θ_old + (1 − η_i)·θ with η_i = min(rate·i, max)
 *   (defaults rate 0.001, max 0.5); rate 0 and max 0 is θ_old = θ (on-policy).
 * - Guidance (loss.cfgScale w ≠ 1): rollouts sample with the guided velocity of θ_old
 *   v_∅ + w·(v_c − v_∅) and the loss trains the guided velocity of θ (flow-graph.ts), so Flow-GRPO's
 *   stored step log-probabilities are those of the velocity sampled with, and DiffusionNFT's v_old
 *   is the guided velocity of θ_old.
 */
import { Rng } from '../util/rng.ts';
import type { ImageLossConfig } from './flow-graph.ts';
import type { GeneratedImage, UpdateGroup } from '../contracts/index.ts';
import { ConfigError } from '../errors.ts';
import { gaussian, guidedVelocity, sampleImages, sdeStepMean, type VelocityFn } from './sde.ts';
import { cleanImage, generationRecords, stepBatches } from './trajectory.ts';
import type { DitWeights } from './dit.ts';
import type { ImageTrainer } from './trainer.ts';

/** Scores B images (flat [B, C, S, S] in [−1, 1]) for their classes; one reward per image. */
export type ImageRewardFn = (images: Float32Array, cls: number[]) => Promise<number[]>;

/** Mean and population std of xs. */
function meanStd(xs: readonly number[]): { mean: number; std: number } {
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  return { mean, std: Math.sqrt(xs.reduce((a, b) => a + (b - mean) ** 2, 0) / xs.length) };
}

/** (R − mean)/(std + eps) within consecutive groups of n (population std, as Flow-GRPO). */
export function groupAdvantages(rewards: readonly number[], n: number, eps = 1e-4): number[] {
  if (rewards.length % n !== 0) throw new RangeError(`${rewards.length} rewards do not split into groups of ${n}`);
  const out: number[] = [];
  for (let g = 0; g < rewards.length; g += n) {
    const r = rewards.slice(g, g + n);
    const { mean, std } = meanStd(r);
    for (const x of r) out.push((x - mean) / (std + eps));
  }
  return out;
}

/**
 * How DiffusionNFT's rewards become optimality probabilities (see `nftOptimality`).
 * `clip` c: r = ½ + ½·clip(A/c, −1, 1); `std`: Z of A = (R − mean_group)/Z, `global` the batch
 * std of the raw rewards + 1e-4, `centred` the batch std of the group-centred rewards. The
 * defaults, c = 5 and `global`, are DiffusionNFT's (its code's adv_clip_max and global std).
 */
export interface NftOptimalityOptions {
  clip?: number;
  std?: 'centred' | 'global';
}

/**
 * DiffusionNFT's optimality probabilities r ∈ [0, 1] of rewards in consecutive groups of n
 * (Zheng et al. 2025, §3.2): A = (R − mean_group)/Z, r = ½ + ½·clip(A/c, −1, 1)
 * (NftOptimalityOptions; defaults c = 5, Z = the batch std of the raw rewards + 1e-4).
 */
export function nftOptimality(rewards: readonly number[], n: number, o: NftOptimalityOptions = {}): number[] {
  if (rewards.length % n !== 0) throw new RangeError(`${rewards.length} rewards do not split into groups of ${n}`);
  const c = o.clip ?? 5;
  if (!(c > 0)) throw new RangeError(`DiffusionNFT's advantage clip must be > 0, got ${c}`);
  const centred: number[] = [];
  for (let g = 0; g < rewards.length; g += n) {
    const r = rewards.slice(g, g + n);
    const { mean } = meanStd(r);
    for (const x of r) centred.push(x - mean);
  }
  const z =
    (o.std ?? 'global') === 'global'
      ? meanStd(rewards).std + 1e-4
      : Math.sqrt(centred.reduce((a, b) => a + b * b, 0) / centred.length);
  return centred.map((d) => 0.5 + 0.5 * Math.max(-1, Math.min(1, z > 0 ? d / z / c : 0)));
}

/** DiffusionNFT's η_i = min(rate·i, max) of iteration i ≥ 1 (the header). */
export function nftOldDecay(i: number, rate: number, max: number): number {
  return Math.min(rate * i, max);
}

/** θ_old ← η·θ_old + (1 − η)·θ in place (float32 per element, in weight order). */
export function softUpdate(old: DitWeights, current: DitWeights, eta: number): void {
  for (const [k, w] of current) {
    const o = old.get(k);
    if (!o || o.length !== w.length) throw new Error(`soft update: weight ${k} missing or of the wrong size`);
    for (let i = 0; i < o.length; i++) o[i] = eta * o[i] + (1 - eta) * w[i];
  }
}

/** The velocity of weights `w`, guided with the loss's cfgScale (sde.ts guidedVelocity; 1: conditional). */
export function lossVelocity(trainer: ImageTrainer, loss: ImageLossConfig, w?: DitWeights): VelocityFn {
  return guidedVelocity((x, t, c) => trainer.velocity(x, t, c, w), loss.cfgScale ?? 1, trainer.config.numClasses);
}

export interface RlIterationOptions {
  loss: ImageLossConfig;
  /** Prompt classes; each is sampled `groupSize` times. */
  prompts: number[];
  groupSize: number;
  /** Denoising steps while training (Flow-GRPO's denoising reduction). */
  steps: number;
  /** Flow-GRPO SDE noise level a. */
  noiseLevel?: number;
  /** DiffusionNFT: updates (fresh t, ε) per iteration. */
  nftUpdates?: number;
  /** DiffusionNFT: how rewards become optimality probabilities (nftOptimality). */
  nftOptimality?: NftOptimalityOptions;
  /** Reference weights (Flow-GRPO KL). */
  reference?: DitWeights;
  /** The sampling policy θ_old (sampled with, and DiffusionNFT's v_old); default: a copy of the trainer's weights. */
  old?: DitWeights;
  rng: Rng;
}

export interface RlIterationResult {
  rewards: number[];
  images: Float32Array;
  cls: number[];
  metrics: Record<string, number>;
}

/** A training step's samples as the update reads them from their records (trajectory.ts). */
export interface ImageUpdateBatch {
  cls: number[];
  samples: ReadonlyArray<{ generated: GeneratedImage; logprobs: Float32Array; tokens: Int32Array }>;
  /** flow_grpo: each sample's advantage; diffusion_nft: each sample's optimality r ∈ [0, 1]. */
  weights: readonly number[];
}

export interface ImageUpdateOptions {
  loss: ImageLossConfig;
  /** DiffusionNFT: updates (fresh t, ε) per step. */
  nftUpdates?: number;
  /** Reference weights (Flow-GRPO KL). */
  reference?: DitWeights;
  /** The sampling policy's weights (DiffusionNFT's v_old); default: the trainer's current ones. */
  old?: DitWeights;
  /** DiffusionNFT's draws of t and ε. */
  rng: Rng;
  /** The learning rate of the k-th optimizer step of this update (k = 0, 1, …); default the trainer's. */
  lr?: (k: number) => number;
}

/**
 * One update from recorded samples: Flow-GRPO trains once per recorded stochastic step (all
 * samples in one batch); DiffusionNFT `nftUpdates` times on fresh (t, ε) from the clean images.
 * Returns the mean of each loss metric.
 */
export async function imageUpdate(
  trainer: ImageTrainer,
  batch: ImageUpdateBatch,
  o: ImageUpdateOptions,
): Promise<Record<string, number>> {
  const { cls } = batch;
  const B = cls.length;
  const pix = trainer.config.channels * trainer.config.imageSize * trainer.config.imageSize;
  const metrics: Record<string, number> = {};
  let k0 = 0;
  const lr = () => (o.lr ? o.lr(k0++) : trainer.optim.lr);
  const add = (m: Record<string, number>, k: number) => {
    for (const [n, v] of Object.entries(m)) metrics[n] = (metrics[n] ?? 0) + v / k;
  };
  if (o.loss.name === 'flow_grpo') {
    const steps = stepBatches(batch.samples, pix);
    for (const st of steps) {
      const floats: Record<string, Float32Array | number[]> = {
        x_t: st.xT,
        x_next: st.xNext,
        t: Array(B).fill(st.t),
        t_next: Array(B).fill(st.tNext),
        sigma: Array(B).fill(st.sigma),
        old_log_probs: st.oldLogProbs,
        advantages: [...batch.weights],
      };
      if ((o.loss.klCoef ?? 0) > 0) {
        if (!o.reference) throw new Error('flow_grpo with klCoef > 0 needs reference weights');
        const vRef = await lossVelocity(trainer, o.loss, o.reference)(st.xT, Array(B).fill(st.t), cls);
        floats.ref_mean = sdeStepMean(st.xT, vRef, st.t, st.tNext, st.sigma).mean;
      }
      add(await trainer.step(o.loss, { floats, cls }, lr()), steps.length);
    }
    return metrics;
  }
  const x0 = new Float32Array(B * pix);
  batch.samples.forEach((s, b) => x0.set(cleanImage(s.generated, pix), b * pix));
  const k = o.nftUpdates ?? 1;
  const old = o.old ?? new Map([...trainer.weights].map(([n, v]) => [n, Float32Array.from(v)]));
  for (let u = 0; u < k; u++) {
    const t = Array.from({ length: B }, () => o.rng.next());
    const noise = gaussian(o.rng, B * pix);
    const xt = new Float32Array(B * pix);
    for (let b = 0; b < B; b++)
      for (let i = b * pix; i < (b + 1) * pix; i++) xt[i] = (1 - t[b]) * x0[i] + t[b] * noise[i];
    const vOld = await lossVelocity(trainer, o.loss, old)(xt, t, cls);
    add(await trainer.step(o.loss, { floats: { x0, noise, t, v_old: vOld, nft_r: [...batch.weights] }, cls }, lr()), k);
  }
  return metrics;
}

export async function rlIteration(
  trainer: ImageTrainer,
  reward: ImageRewardFn,
  o: RlIterationOptions,
): Promise<RlIterationResult> {
  const cls = o.prompts.flatMap((c) => Array(o.groupSize).fill(c) as number[]);
  const C = trainer.config.channels,
    S = trainer.config.imageSize;
  const old = o.old ?? new Map([...trainer.weights].map(([k, v]) => [k, Float32Array.from(v)]));
  const grpo = o.loss.name === 'flow_grpo';
  const sample = await sampleImages(lossVelocity(trainer, o.loss, old), {
    cls,
    pixels: C * S * S,
    steps: o.steps,
    rng: o.rng,
    noiseLevel: grpo ? (o.noiseLevel ?? 0.7) : 0,
  });
  const rewards = await reward(sample.x0, cls);
  const samples = await generationRecords(sample, C, S);
  const weights = grpo ? groupAdvantages(rewards, o.groupSize) : nftOptimality(rewards, o.groupSize, o.nftOptimality);
  const metrics = await imageUpdate(
    trainer,
    { cls, samples, weights },
    { loss: o.loss, nftUpdates: o.nftUpdates, reference: o.reference, old, rng: o.rng },
  );
  metrics.reward_mean = rewards.reduce((a, b) => a + b, 0) / cls.length;
  return { rewards, images: sample.x0, cls, metrics };
}

/**
 * An image policy's step (lib/image/rl.ts imageUpdate): the kept groups' samples, groups in id
 * order and each group's samples by index, with their prompt class (`classOf`, from the prompt)
 * and recorded trajectories. Weights: flow_grpo, each sample's advantage (the advantage stage's,
 * the same on each of its denoising steps); diffusion_nft, DiffusionNFT's optimality r from the
 * group-centred rewards (lib/image/rl.ts nftOptimality, with `nft`'s options). A sample without a generated image or a
 * reward is refused, naming it.
 */
export function imageUpdateBatch(
  kept: readonly UpdateGroup[],
  loss: 'flow_grpo' | 'diffusion_nft',
  classOf: (g: UpdateGroup) => number,
  nft: NftOptimalityOptions = {},
): ImageUpdateBatch {
  const groups = [...kept].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const cls: number[] = [],
    samples: ImageUpdateBatch['samples'][number][] = [],
    weights: number[] = [];
  const n = groups[0]?.samples.length ?? 0;
  for (const g of groups) {
    if (g.samples.length !== n)
      throw new ConfigError(`image policy: group ${g.id} has ${g.samples.length} samples, the step's first has ${n}`);
    for (const s of [...g.samples].sort((a, b) => a.sample_index - b.sample_index)) {
      if (!s.generated)
        throw new ConfigError(`sample ${s.id} has no generated image: it was not sampled by an image policy`);
      if (s.reward === null)
        throw new ConfigError(`sample ${s.id} has no reward: failed samples are filtered before the update`);
      cls.push(classOf(g));
      samples.push({ generated: s.generated, logprobs: s.behaviour_logprobs, tokens: s.response_ids });
      weights.push(loss === 'flow_grpo' ? (s.advantages[0] ?? 0) : s.reward);
    }
  }
  return { cls, samples, weights: loss === 'flow_grpo' ? weights : nftOptimality(weights, n, nft) };
}
