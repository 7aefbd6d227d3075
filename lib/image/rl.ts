/**
 * One RL iteration of an image policy: sample n images per prompt, score them, update.
 *
 * - Flow-GRPO (Liu et al. 2025, arXiv 2505.05470): SDE sampling (sde.ts) with each step's
 *   log-probability recorded; group-normalised advantages A = (R − mean_group)/(std_group + 1e-4);
 *   one update per recorded denoising step (the clipped ratio of that step, KL to the reference's
 *   step mean when klCoef > 0), all images of the iteration in one batch.
 * - DiffusionNFT (Zheng et al. 2025, arXiv 2509.16117): any sampler (ODE here); optimality
 *   r = ½ + ½·clip((R − mean_group)/Z, −1, 1), Z the batch std of the centred rewards; updates on
 *   fresh (t, ε) of the forward process from the clean images, v_old = the sampling policy's velocity.
 */
import { Rng } from '../util/rng.ts';
import type { ImageLossConfig } from './flow-graph.ts';
import { gaussian, sampleImages } from './sde.ts';
import type { DitWeights } from './dit.ts';
import type { ImageTrainer } from './trainer.ts';

/** Scores B images (flat [B, C, S, S] in [−1, 1]) for their classes; one reward per image. */
export type ImageRewardFn = (images: Float32Array, cls: number[]) => Promise<number[]>;

/** (R − mean)/(std + eps) within consecutive groups of n (population std, as Flow-GRPO). */
export function groupAdvantages(rewards: readonly number[], n: number, eps = 1e-4): number[] {
  if (rewards.length % n !== 0) throw new RangeError(`${rewards.length} rewards do not split into groups of ${n}`);
  const out: number[] = [];
  for (let g = 0; g < rewards.length; g += n) {
    const r = rewards.slice(g, g + n);
    const m = r.reduce((a, b) => a + b, 0) / n;
    const sd = Math.sqrt(r.reduce((a, b) => a + (b - m) ** 2, 0) / n);
    for (const x of r) out.push((x - m) / (sd + eps));
  }
  return out;
}

/** DiffusionNFT's optimality probabilities r ∈ [0, 1] (see the header). */
export function nftOptimality(rewards: readonly number[], n: number): number[] {
  if (rewards.length % n !== 0) throw new RangeError(`${rewards.length} rewards do not split into groups of ${n}`);
  const centred: number[] = [];
  for (let g = 0; g < rewards.length; g += n) {
    const r = rewards.slice(g, g + n);
    const m = r.reduce((a, b) => a + b, 0) / n;
    for (const x of r) centred.push(x - m);
  }
  const z = Math.sqrt(centred.reduce((a, b) => a + b * b, 0) / centred.length);
  return centred.map((c) => 0.5 + 0.5 * Math.max(-1, Math.min(1, z > 0 ? c / z : 0)));
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
  /** Reference weights (Flow-GRPO KL). */
  reference?: DitWeights;
  rng: Rng;
}

export interface RlIterationResult {
  rewards: number[];
  images: Float32Array;
  cls: number[];
  metrics: Record<string, number>;
}

export async function rlIteration(
  trainer: ImageTrainer,
  reward: ImageRewardFn,
  o: RlIterationOptions,
): Promise<RlIterationResult> {
  const cls = o.prompts.flatMap((c) => Array(o.groupSize).fill(c) as number[]);
  const B = cls.length;
  const C = trainer.config.channels,
    S = trainer.config.imageSize,
    pix = C * S * S;
  const old = new Map([...trainer.weights].map(([k, v]) => [k, Float32Array.from(v)]));
  const velocity = (x: Float32Array, t: number[], c: number[]) => trainer.velocity(x, t, c, old);
  const grpo = o.loss.name === 'flow_grpo';
  const sample = await sampleImages(velocity, {
    cls,
    pixels: pix,
    steps: o.steps,
    rng: o.rng,
    noiseLevel: grpo ? (o.noiseLevel ?? 0.7) : 0,
  });
  const rewards = await reward(sample.x0, cls);
  const metrics: Record<string, number> = {};
  const add = (m: Record<string, number>, k: number) => {
    for (const [n, v] of Object.entries(m)) metrics[n] = (metrics[n] ?? 0) + v / k;
  };
  if (grpo) {
    const adv = groupAdvantages(rewards, o.groupSize);
    for (const st of sample.steps) {
      const floats: Record<string, Float32Array | number[]> = {
        x_t: st.xT,
        x_next: st.xNext,
        t: Array(B).fill(st.t),
        t_next: Array(B).fill(st.tNext),
        sigma: Array(B).fill(st.sigma),
        old_log_probs: st.logProbs,
        advantages: adv,
      };
      if ((o.loss.klCoef ?? 0) > 0) {
        if (!o.reference) throw new Error('flow_grpo with klCoef > 0 needs reference weights');
        const vRef = await trainer.velocity(st.xT, Array(B).fill(st.t), cls, o.reference);
        const dt = st.tNext - st.t,
          s2 = st.sigma ** 2;
        const kx = 1 + (s2 * dt) / (2 * st.t),
          kv = (1 + (s2 * (1 - st.t)) / (2 * st.t)) * dt;
        const m = new Float32Array(st.xT.length);
        for (let i = 0; i < m.length; i++) m[i] = st.xT[i] * kx + vRef[i] * kv;
        floats.ref_mean = m;
      }
      add(await trainer.step(o.loss, { floats, cls }), sample.steps.length);
    }
  } else {
    const r = nftOptimality(rewards, o.groupSize);
    const k = o.nftUpdates ?? 1;
    for (let u = 0; u < k; u++) {
      const t = Array.from({ length: B }, () => o.rng.next());
      const noise = gaussian(o.rng, B * pix);
      const xt = new Float32Array(B * pix);
      for (let b = 0; b < B; b++)
        for (let i = b * pix; i < (b + 1) * pix; i++) xt[i] = (1 - t[b]) * sample.x0[i] + t[b] * noise[i];
      const vOld = await velocity(xt, t, cls);
      add(await trainer.step(o.loss, { floats: { x0: sample.x0, noise, t, v_old: vOld, nft_r: r }, cls }), k);
    }
  }
  metrics.reward_mean = rewards.reduce((a, b) => a + b, 0) / B;
  return { rewards, images: sample.x0, cls, metrics };
}
