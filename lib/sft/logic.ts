/**
 * Supervised fine-tuning, the pure part: which examples make step s, how examples are packed, and
 * how a batch becomes the trainer's [B, T] arrays. No I/O, no clock; the order is a permutation
 * seeded by (data.seed, epoch), so a run resumed at step s sees exactly the batches an
 * uninterrupted run sees.
 *
 * Loss (TRL's SFTTrainer with assistant-only loss; Ouyang et al. 2022 §3.5): next-token
 * cross-entropy −(1/N) Σ_t m_t · log π(x_{t+1} | x_{≤t}) over the N response tokens (m = 1 on
 * assistant tokens only), lib/model/loss.ts sftLossGraph in token-mean aggregation.
 */
import { ConfigError } from '../errors.ts';
import { Rng } from '../util/rng.ts';
import type { TrainBatch } from '../model/train.ts';
import { gaussian } from '../image/sde.ts';

/** One tokenized example: token ids [T] and the loss mask [T] (1 = a response token). */
export interface SftExample {
  tokens: Int32Array;
  mask: Uint8Array;
  /** file:line of the row (packed rows: of their first example). */
  source: string;
}

export interface SftPlan {
  /** Examples (or packed rows) per epoch. */
  units: number;
  /** Units per optimizer step (actor.global_batch_size). */
  batchSize: number;
  epochs: number;
  maxSteps: number | null;
  shuffle: boolean;
  seed: number;
}

/** Full batches per epoch (an incomplete last batch is dropped, as `train`'s controller does). */
export function sftStepsPerEpoch(p: Pick<SftPlan, 'units' | 'batchSize'>): number {
  return Math.floor(p.units / p.batchSize);
}

export function sftTotalSteps(p: SftPlan): number {
  const full = sftStepsPerEpoch(p) * p.epochs;
  return p.maxSteps != null ? Math.min(full, p.maxSteps) : full;
}

/** The units of optimizer step `step` (1-based), in batch order. */
export function sftBatchIndices(p: SftPlan, step: number): number[] {
  const spe = sftStepsPerEpoch(p);
  if (spe === 0)
    throw new ConfigError(
      `sft: ${p.units} training example(s) is fewer than actor.global_batch_size = ${p.batchSize}; lower actor.global_batch_size or add rows`,
    );
  if (!(Number.isInteger(step) && step >= 1)) throw new ConfigError(`sft: step must be an integer ≥ 1, got ${step}`);
  const epoch = Math.floor((step - 1) / spe),
    k = (step - 1) % spe;
  const order = p.shuffle ? epochPermutation(p.units, p.seed, epoch) : null;
  const out: number[] = [];
  for (let i = k * p.batchSize; i < (k + 1) * p.batchSize; i++) out.push(order ? order[i] : i);
  return out;
}

/** Epoch e's order of 0..n−1: the permutation seeded by "<seed>:sft:epoch:<e>". */
export function epochPermutation(n: number, seed: number, epoch: number): Uint32Array {
  const a = Array.from({ length: n }, (_, i) => i);
  Rng.fromSeed(`${seed}:sft:epoch:${epoch}`).shuffle(a);
  return Uint32Array.from(a);
}

/**
 * Packs examples, in order, into rows of at most `maxLength` tokens (a new row starts when the
 * next example does not fit). Each example keeps its own loss mask.
 */
export function packExamples(examples: readonly SftExample[], maxLength: number): SftExample[] {
  const rows: SftExample[] = [];
  let cur: SftExample[] = [],
    len = 0;
  const flush = () => {
    if (!cur.length) return;
    const tokens = new Int32Array(len),
      mask = new Uint8Array(len);
    let o = 0;
    for (const e of cur) {
      tokens.set(e.tokens, o);
      mask.set(e.mask, o);
      o += e.tokens.length;
    }
    rows.push({ tokens, mask, source: cur[0].source });
    cur = [];
    len = 0;
  };
  for (const e of examples) {
    if (e.tokens.length > maxLength)
      throw new ConfigError(`${e.source}: example is ${e.tokens.length} tokens, over sft.max_length = ${maxLength}`);
    if (len + e.tokens.length > maxLength) flush();
    cur.push(e);
    len += e.tokens.length;
  }
  flush();
  return rows;
}

/** A batch of examples as [B, T] arrays, right-padded with `padId` to the longest (attention mask 0 there). */
export function collate(examples: readonly SftExample[], padId: number): TrainBatch {
  const B = examples.length;
  const T = Math.max(2, ...examples.map((e) => e.tokens.length));
  const tokens = new Int32Array(B * T).fill(padId);
  const attentionMask = new Float32Array(B * T);
  const responseMask = new Float32Array(B * T);
  examples.forEach((e, r) => {
    tokens.set(e.tokens, r * T);
    for (let t = 0; t < e.tokens.length; t++) {
      attentionMask[r * T + t] = 1;
      responseMask[r * T + t] = e.mask[t];
    }
  });
  return { batchSize: B, seqLen: T, tokens, attentionMask, responseMask };
}

/** Where the data stands after `step` optimizer steps (trainer_state.json dataset_position). */
export function sftPosition(
  p: SftPlan,
  step: number,
): {
  step: number;
  epoch: number;
  index: number;
  train_size: number;
  rollout_batch_size: number;
  steps_per_epoch: number;
  shuffle: boolean;
  seed: number;
  shuffle_seed: string | null;
} {
  const spe = Math.max(1, sftStepsPerEpoch(p));
  const epoch = Math.floor(step / spe);
  return {
    step,
    epoch,
    index: (step % spe) * p.batchSize,
    train_size: p.units,
    rollout_batch_size: p.batchSize,
    steps_per_epoch: sftStepsPerEpoch(p),
    shuffle: p.shuffle,
    seed: p.seed,
    shuffle_seed: p.shuffle ? `${p.seed}:sft:epoch:${epoch}` : null,
  };
}

/**
 * Step `step`'s flow-matching batch of an image policy (lib/image/flow-graph.ts `flow_matching`;
 * Lipman et al. 2023, Liu et al. 2023): the images `indices` of `images` [n, C, S, S], noise
 * ε ~ N(0, I) [B, C, S, S] and t ~ U[0, 1) [B] from the stream "<seed>:sft:noise:<step>", and each
 * image's class replaced by the null class `nullClass` with probability `cfgDropout`
 * (classifier-free guidance's condition dropout, Ho & Salimans 2022), drawn from the same stream:
 * a pure function of its arguments, so a resumed run trains on the same batch.
 */
export function imageSftBatch(a: {
  images: Float32Array;
  cls: readonly number[];
  pixels: number;
  indices: readonly number[];
  seed: number;
  step: number;
  cfgDropout: number;
  nullClass: number;
}): { floats: { x0: Float32Array; noise: Float32Array; t: number[] }; cls: number[] } {
  const B = a.indices.length,
    px = a.pixels;
  const rng = Rng.fromSeed(`${a.seed}:sft:noise:${a.step}`);
  const x0 = new Float32Array(B * px);
  a.indices.forEach((k, i) => x0.set(a.images.subarray(k * px, (k + 1) * px), i * px));
  const noise = gaussian(rng, B * px);
  const t = Array.from({ length: B }, () => rng.next());
  const cls = a.indices.map((k) => (rng.next() < a.cfgDropout ? a.nullClass : a.cls[k]));
  return { floats: { x0, noise, t }, cls };
}
