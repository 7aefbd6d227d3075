/**
 * Update-stage logic (pure): assembling a step's batch, splitting it into PPO mini-batches and
 * micro-batches, packing them into the training graph's tensors, deciding when to checkpoint. No
 * I/O.
 */
import { ConfigError } from '../../lib/errors.ts';
import type { UpdateGroup, UpdateSample } from '../../lib/contracts/index.ts';
import type { ImagePixels } from '../../lib/data/images.ts';
import type { TrainBatch } from '../../lib/model/index.ts';
import { rolloutCorrection, type RolloutCorrectionConfig } from '../../lib/rl/rollout-correction.ts';
import type { Config } from '../../lib/config/index.ts';
import type { StepPacking } from '../../lib/pipeline/update-train.ts';
import { trainsNft } from '../../lib/pipeline/trainer-settings.ts';

export interface SampleKey {
  id: string;
}

/**
 * The step's batch: every sample of every kept group, ordered by deterministic id, duplicates
 * (redelivered groups) dropped — so the batch, and therefore the update, does not depend on
 * arrival order, partitioning or the number of rollout replicas.
 */
export function assembleBatch<S extends SampleKey>(
  groups: Array<{ samples: S[] }>,
): { samples: S[]; duplicates: number } {
  const byId = new Map<string, S>();
  let duplicates = 0;
  for (const g of groups) {
    for (const s of g.samples) {
      if (byId.has(s.id)) {
        duplicates++;
        continue;
      }
      byId.set(s.id, s);
    }
  }
  const samples = [...byId.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return { samples, duplicates };
}

/**
 * Explains the batch arithmetic (rollout_batch_size × n samples per step, split into mini-batches
 * of global_batch_size, each accumulated over micro-batches) and rejects inconsistent sizes.
 */
export function checkBatchArithmetic(a: {
  rolloutBatchSize: number;
  n: number;
  globalBatchSize: number;
  microBatchSize: number;
}): { samplesPerStep: number; miniBatches: number; microPerMini: number } {
  const samplesPerStep = a.rolloutBatchSize * a.n;
  const why = `each step has data.rollout_batch_size × rollout.n = ${a.rolloutBatchSize} × ${a.n} = ${samplesPerStep} samples, split into mini-batches of actor.global_batch_size = ${a.globalBatchSize} samples (one optimizer step each), each accumulated over micro-batches of actor.micro_batch_size_per_device_for_update = ${a.microBatchSize}`;
  if (a.globalBatchSize > samplesPerStep)
    throw new ConfigError(
      `${why}: the mini-batch is larger than the step; lower actor.global_batch_size to at most ${samplesPerStep}`,
    );
  if (samplesPerStep % a.globalBatchSize !== 0)
    throw new ConfigError(
      `${why}: ${samplesPerStep} is not a multiple of ${a.globalBatchSize}; choose a divisor of ${samplesPerStep}`,
    );
  if (a.globalBatchSize % a.microBatchSize !== 0)
    throw new ConfigError(
      `${why}: ${a.globalBatchSize} is not a multiple of ${a.microBatchSize}; choose a divisor of ${a.globalBatchSize}`,
    );
  return {
    samplesPerStep,
    miniBatches: samplesPerStep / a.globalBatchSize,
    microPerMini: a.globalBatchSize / a.microBatchSize,
  };
}

/** Mini-batches of `size` consecutive samples (in id order), then micro-batches inside each. */
export function splitBatches<T>(items: T[], miniSize: number, microSize: number): T[][][] {
  const minis: T[][][] = [];
  for (let i = 0; i < items.length; i += miniSize) {
    const mini = items.slice(i, i + miniSize);
    const micros: T[][] = [];
    for (let j = 0; j < mini.length; j += microSize) micros.push(mini.slice(j, j + microSize));
    minis.push(micros);
  }
  return minis;
}

// which steps are checkpointed and which versions are written as files (pure, shared with lib/pipeline/update-commit.ts)
export { shouldCheckpoint, versionFilesOf, writesVersionFile } from '../../lib/pipeline/version-files.ts';

/** The update stage's state as far as a start decides on it. */
export interface StartState {
  version: number;
  /** trainer.load_checkpoint_path the run started from (null: a fresh start). */
  initFrom?: string | null;
}

/**
 * Why the update stage must not start, or null: a run that already has state is continued only
 * with trainer.find_last_checkpoint, and only from the trainer.load_checkpoint_path it started with.
 */
export function startRefusal(a: {
  runId: string;
  /** Where the run's database is (for the message). */
  where: string;
  state: StartState | null;
  /** Other stages with state (when the update stage has none). */
  otherStages: readonly string[];
  lastCheckpointPath: string | null;
  findLastCheckpoint: boolean;
  loadPath: string | null;
}): string | null {
  const { runId, state, otherStages, lastCheckpointPath: last, loadPath } = a;
  if ((state || otherStages.length) && !a.findLastCheckpoint)
    return (
      `run ${runId} already has state in ${a.where} (${state ? `update stage at policy version ${state.version}` : `stages ${otherStages.join(', ')}`}${last ? `, last checkpoint ${last}` : ''}) and trainer.find_last_checkpoint = false refuses to continue it. ` +
      'To resume it, set trainer.find_last_checkpoint=true (the default); to start over, use a new run (another trainer.run_dir, or pipeline.run_id=…); ' +
      `to start a new run from one of its checkpoints, give that run trainer.load_checkpoint_path=${last ?? '<run_dir>/checkpoints/global_step_N'}`
    );
  if (state && (state.initFrom ?? null) !== loadPath)
    return (
      `run ${runId} already has state (update stage at policy version ${state.version}, started ${state.initFrom ? `from ${state.initFrom}` : 'from scratch'}); trainer.load_checkpoint_path = ${loadPath ?? 'null'} applies to a new run only — ` +
      `resume this run with ${state.initFrom ? `trainer.load_checkpoint_path=${state.initFrom}` : 'trainer.load_checkpoint_path unset'}, or start a new run (pipeline.run_id=… or another trainer.run_dir) from the checkpoint`
    );
  return null;
}

/**
 * Pipeline throughput over a step: its kept samples (and their prompt + response tokens) per
 * second of `seconds`, the wall time since the previous version.
 */
export function stepThroughput(groups: readonly UpdateGroup[], seconds: number): Record<string, number> {
  const kept = groups.filter((g) => !g.filtered);
  const samples = kept.reduce((a, g) => a + g.samples.length, 0);
  const tokens = kept.reduce(
    (a, g) => a + g.samples.reduce((t, x) => t + g.prompt_ids.length + x.response_ids.length, 0),
    0,
  );
  return { 'perf/samples_per_second': samples / seconds, 'perf/tokens_per_second': tokens / seconds };
}

/** Staleness of a step's kept groups: how many versions behind `version` their samples were drawn. */
export function stepStaleness(kept: readonly UpdateGroup[], version: number): Record<string, number> {
  const stal = kept.map((g) => version - g.policy_version);
  return {
    'staleness/mean': stal.reduce((a, b) => a + b, 0) / Math.max(1, stal.length),
    'staleness/max': Math.max(0, ...stal),
  };
}

/** The stage_pending bucket of a training step's update groups (zero-padded: buckets sort by step). */
export function stepBucket(step: number): string {
  return `step:${String(step).padStart(8, '0')}`;
}

/**
 * The consumer positions after a batch: each record's "<topic>/<partition>" moves to its offset + 1
 * (never back). Updates `positions` in place and returns it.
 */
export function advancePositions(
  positions: Record<string, number>,
  messages: ReadonlyArray<{ topic: string; partition: number; offset: number }>,
): Record<string, number> {
  for (const m of messages) {
    const k = `${m.topic}/${m.partition}`;
    positions[k] = Math.max(positions[k] ?? 0, m.offset + 1);
  }
  return positions;
}

/**
 * The batch's update groups that wait for their step, as stage_pending items (the encoded
 * message, bucketed by step): groups of steps up to `version` are trained already (a redelivery).
 */
export function pendingUpdates<P, H>(
  records: ReadonlyArray<{ value: unknown; message: { value: P; headers: H } }>,
  version: number,
): Array<{ bucket: string; id: string; payload: P; headers: H }> {
  return records
    .filter((r) => (r.value as UpdateGroup).step > version)
    .map((r) => ({
      bucket: stepBucket((r.value as UpdateGroup).step),
      id: (r.value as UpdateGroup).id,
      payload: r.message.value,
      headers: r.message.headers,
    }));
}

/**
 * Per training step not yet trained, the first offset of its groups in each "<topic>/<partition>"
 * of the update stage's input: updated in place with the batch's records of steps after `version`
 * (a checkpoint records from where the groups of the steps after it can be read again).
 */
export function noteStepStarts(
  starts: Record<string, Record<string, number>>,
  records: ReadonlyArray<{ value: unknown; message: { topic: string; partition: number; offset: number } }>,
  version: number,
): Record<string, Record<string, number>> {
  for (const r of records) {
    const step = (r.value as UpdateGroup).step;
    if (step <= version) continue;
    const k = `${r.message.topic}/${r.message.partition}`;
    const at = (starts[String(step)] ??= {});
    at[k] = Math.min(at[k] ?? Infinity, r.message.offset);
  }
  return starts;
}

/**
 * Where the update stage's input holds every group of the steps after `step`, per
 * "<topic>/<partition>": the first offset of a step not trained yet, else the consumer's position.
 */
export function rereadFrom(
  positions: Readonly<Record<string, number>>,
  starts: Readonly<Record<string, Record<string, number>>>,
  step: number,
): Record<string, number> {
  const from = { ...positions };
  for (const [s, at] of Object.entries(starts)) {
    if (Number(s) <= step) continue;
    for (const [k, off] of Object.entries(at)) from[k] = Math.min(from[k] ?? Infinity, off);
  }
  return from;
}

/** Optimizer steps over the whole run: steps × mini-batches per step × ppo_epochs (at least 1; the LR schedule's length). */
export function totalOptimizerSteps(totalSteps: number, miniBatches: number, ppoEpochs: number): number {
  return Math.max(1, totalSteps * miniBatches * ppoEpochs);
}

/**
 * A trained step's metrics: the learner's (`trained`, completed in place with the approx_kl and
 * clipfrac aliases of ppo_kl and pg_clipfrac), the staleness of its kept groups against `version`
 * (the version they were trained on) and the tokens it trained on.
 */
export function stepMetrics(
  trained: Record<string, number>,
  kept: readonly UpdateGroup[],
  version: number,
  tokens: number,
  correction: Record<string, number> = {},
): Record<string, number> {
  const m = trained;
  m['actor/approx_kl'] = m['actor/ppo_kl'] ?? 0;
  m['actor/clipfrac'] = m['actor/pg_clipfrac'] ?? 0;
  Object.assign(m, stepStaleness(kept, version), correction);
  m['perf/update_tokens'] = tokens;
  return m;
}

/** What a trained step's `policy` record says of it: its groups, samples, trained tokens and the consumed offsets. */
export function stepRecord(
  groups: readonly UpdateGroup[],
  tokens: number,
  positions: Readonly<Record<string, number>>,
): { groups: number; samples: number; tokens: number; consumed: ReturnType<typeof consumedOffsets> } {
  return {
    groups: groups.length,
    samples: groups.reduce((a, g) => a + g.samples.length, 0),
    tokens,
    consumed: consumedOffsets(positions),
  };
}

/** The consumer positions ("<topic>/<partition>" → next offset) as the policy record's consumed offsets. */
export function consumedOffsets(
  positions: Readonly<Record<string, number>>,
): Array<{ topic: string; partition: number; next_offset: number }> {
  return Object.entries(positions).map(([k, next]) => ({
    topic: k.slice(0, k.lastIndexOf('/')),
    partition: Number(k.slice(k.lastIndexOf('/') + 1)),
    next_offset: next,
  }));
}

/** What the update stage reads of the controller's stored stage state (`{ ctl: ControllerState, … }`). */
export interface ControllerProgress {
  ctl?: { valEmitted?: number[]; valDone?: number[]; latest?: { version: number } | null };
}

/**
 * Policy versions a validation round may still sample with, so pruning must keep them: rounds the
 * controller published and has not seen finish, and every version up to `newest` the controller
 * has not seen yet (it may schedule a round for it; a replay's update stage runs ahead of its
 * controller, as nothing waits for rollouts).
 */
export function versionsInUse(progress: ControllerProgress | null | undefined, newest: number): number[] {
  const c = progress?.ctl;
  const inUse = (c?.valEmitted ?? []).filter((v) => !(c?.valDone ?? []).includes(v));
  for (let v = (c?.latest?.version ?? -1) + 1; v <= newest; v++) inUse.push(v);
  return inUse;
}

export interface NftGroupInput {
  id: string;
  reward_fn: string;
  samples: ReadonlyArray<{ id: string; reward: number | null; reward_details: Readonly<Record<string, number>> }>;
}

/** What the nft policy loss needs of one sample: its ±1 outcome and the accuracy of its whole group. */
export interface NftTarget {
  /** +1 correct, −1 incorrect (lib/rl/nft.ts). */
  reward: 1 | -1;
  /** Fraction of correct responses in the sample's group, in [0, 1] (r̂ before clamping). */
  groupAccuracy: number;
}

/**
 * NFT targets (Chen et al. 2025, arXiv 2505.18116) of the kept groups, by sample id: NFT splits
 * responses into correct and incorrect by a binary verifier outcome, read from the reward metric
 * `key` (reward_details[key]; "overall" falls back to the scalar reward, as algorithm.filter_key),
 * which must be 1 (correct) or 0 / −1 (incorrect). The group accuracy is taken over the whole
 * group here, because a mini-batch may hold only part of a group.
 */
export function nftTargets(groups: readonly NftGroupInput[], key: string): Map<string, NftTarget> {
  const out = new Map<string, NftTarget>();
  for (const g of groups) {
    if (g.samples.length === 0) continue;
    const outcomes = g.samples.map((x): 1 | -1 => {
      const v = x.reward_details[key] ?? (key === 'overall' || key === 'accuracy' ? x.reward : undefined);
      if (v === undefined || v === null) {
        throw new ConfigError(
          `algorithm.policy_loss = nft reads each response's correctness from reward metric "${key}" (algorithm.nft.correct_key), but sample ${x.id} (reward ${g.reward_fn}) has none; ` +
            `its reward reports: ${Object.keys(x.reward_details).join(', ') || '(no metrics; use "overall" for the scalar reward)'}`,
        );
      }
      if (v === 1) return 1;
      if (v === 0 || v === -1) return -1;
      throw new ConfigError(
        `algorithm.policy_loss = nft needs a binary correctness per response (1 = correct, 0 or −1 = incorrect), but sample ${x.id} has ${key} = ${v} (reward ${g.reward_fn}). ` +
          `Set algorithm.nft.correct_key to a 0/1 metric of the reward (this one reports: ${Object.keys(x.reward_details).join(', ') || 'none'}), or use a verifier reward that returns 1/0 (e.g. reward.reward_fn=exact_match)`,
      );
    });
    const acc = outcomes.filter((o) => o === 1).length / outcomes.length;
    g.samples.forEach((x, i) => out.set(x.id, { reward: outcomes[i], groupAccuracy: acc }));
  }
  return out;
}

/**
 * What the update trains a sample with: loss_weights × token_mask and advantages × α (the paper's
 * masked loss and shaped advantages). A sample without VPPO fields (VPPO off, or a trajectory
 * recorded without them) is returned unchanged.
 */
export function applyVppoToSample(s: {
  advantages: Float32Array;
  loss_weights: Float32Array;
  vppo_token_mask?: Uint8Array | null;
  vppo_scaling?: number | null;
}): { advantages: Float32Array; loss_weights: Float32Array } {
  if (s.vppo_token_mask == null && s.vppo_scaling == null)
    return { advantages: s.advantages, loss_weights: s.loss_weights };
  const L = s.advantages.length;
  if (s.loss_weights.length !== L)
    throw new ConfigError(`vppo: ${s.loss_weights.length} loss weights for ${L} advantages`);
  const m = s.vppo_token_mask;
  if (m != null && m.length !== L) throw new ConfigError(`vppo: token mask of ${m.length} for ${L} response tokens`);
  const alpha = s.vppo_scaling ?? 1;
  if (!Number.isFinite(alpha) || alpha < 0)
    throw new ConfigError(`vppo: trajectory scaling factor ${alpha} is not a finite number ≥ 0`);
  const advantages = new Float32Array(L),
    loss_weights = new Float32Array(L);
  for (let t = 0; t < L; t++) {
    advantages[t] = s.advantages[t] * alpha;
    loss_weights[t] = m != null ? s.loss_weights[t] * m[t] : s.loss_weights[t];
  }
  return { advantages, loss_weights };
}

/** How a step's samples are packed into training tensors. */
export interface PackOptions {
  /** Samples per mini-batch, one optimizer step each (actor.global_batch_size). */
  miniBatchSize: number;
  /** Token id of the padding after each row's prompt + response. */
  padTokenId: number;
  /** data.max_response_length: the loss_scale_factor of the seq-mean-token-sum-norm aggregation. */
  lossScaleFactor: number;
  /** Apply each sample's VPPO token mask and scaling (algorithm.vppo.enable; updates.v2). */
  vppo: boolean;
  /** Pass the reference log-probs (algorithm.use_kl_loss: the KL loss reads them). */
  klLoss: boolean;
}

/** The packing options of the run's config; `padTokenId` is the policy model's padding token. */
export function packOptions(cfg: Config, padTokenId: number): PackOptions {
  return {
    miniBatchSize: cfg.actor.global_batch_size,
    padTokenId,
    lossScaleFactor: cfg.data.max_response_length,
    vppo: cfg.algorithm.vppo.enable,
    klLoss: cfg.algorithm.use_kl_loss,
  };
}

/** One mini-batch for the trainer, and its prompt + response token count (perf/update_tokens). */
export interface PackedBatch {
  batch: TrainBatch;
  tokens: number;
}

/** A sample with the group it came from (the prompt and images are the group's). */
interface Row {
  g: UpdateGroup;
  x: UpdateSample;
}

/** The kept groups' samples in id order (assembleBatch), split into mini-batches of `size`. */
function miniBatchesOf(groups: readonly UpdateGroup[], size: number): Row[][] {
  const { samples } = assembleBatch(groups.map((g) => ({ samples: g.samples.map((x) => ({ id: x.id, g, x })) })));
  return splitBatches(samples, size, size).map(([mini]) => mini);
}

/**
 * The [B, T] layout every mini-batch shares: row b is its prompt then its response, right-padded
 * to the longest row T; `at(b)` is where row b's response starts in the flat arrays.
 */
function layout(
  mini: readonly Row[],
  o: PackOptions,
  images: ReadonlyMap<UpdateGroup, ImagePixels[]>,
): {
  base: Pick<
    TrainBatch,
    'batchSize' | 'seqLen' | 'tokens' | 'attentionMask' | 'responseMask' | 'globalBatch' | 'images'
  >;
  at: (b: number) => number;
  tokens: number;
} {
  const B = mini.length;
  const T = Math.max(...mini.map(({ g, x }) => g.prompt_ids.length + x.response_ids.length));
  const tokens = new Int32Array(B * T).fill(o.padTokenId);
  const attn = new Float32Array(B * T),
    resp = new Float32Array(B * T);
  let ntok = 0;
  mini.forEach(({ g, x }, b) => {
    const P = g.prompt_ids.length,
      L = x.response_ids.length;
    tokens.set(g.prompt_ids, b * T);
    tokens.set(x.response_ids, b * T + P);
    attn.fill(1, b * T, b * T + P + L);
    resp.fill(1, b * T + P, b * T + P + L);
    // multi-turn: environment tokens are context, not trained (no loss, KL or entropy)
    if (x.response_mask.length) for (let t = 0; t < L; t++) resp[b * T + P + t] = x.response_mask[t];
    ntok += P + L;
  });
  return {
    base: {
      batchSize: B,
      seqLen: T,
      tokens,
      attentionMask: attn,
      responseMask: resp,
      globalBatch: { loss_scale_factor: o.lossScaleFactor },
      ...(images.size ? { images: mini.map(({ g }) => images.get(g)) } : {}),
    },
    at: (b) => b * T + mini[b].g.prompt_ids.length,
    tokens: ntok,
  };
}

/**
 * The policy's mini-batches of a step: tokens and masks [B, T], and at each response position the
 * advantage, old log-prob (`oldLogprobs` by sample id — recomputed with the current weights — else
 * the sample's behaviour log-prob), reference log-prob and loss weight; VPPO scales advantages
 * by the trajectory's α and masks loss weights by its token mask. With `nft` (the NFT loss) each
 * row carries its ±1 outcome and its whole group's accuracy (a mini-batch may split a group).
 */
export function packPolicyBatches(
  groups: readonly UpdateGroup[],
  inputs: {
    oldLogprobs: ReadonlyMap<string, Float32Array>;
    /** Rollout-correction weights by sample id (lib/rl/rollout-correction.ts), multiplied into the loss weights. */
    isWeights?: ReadonlyMap<string, Float32Array> | null;
    nft?: ReadonlyMap<string, NftTarget> | null;
    images?: ReadonlyMap<UpdateGroup, ImagePixels[]>;
  },
  o: PackOptions,
): PackedBatch[] {
  return miniBatchesOf(groups, o.miniBatchSize).map((mini) => {
    const { base, at, tokens } = layout(mini, o, inputs.images ?? new Map());
    const N = base.batchSize * base.seqLen;
    const adv = new Float32Array(N),
      oldLp = new Float32Array(N),
      refLp = new Float32Array(N),
      w = new Float32Array(N);
    mini.forEach(({ x }, b) => {
      const v =
        o.vppo && x.vppo
          ? applyVppoToSample({
              advantages: x.advantages,
              loss_weights: x.loss_weights,
              vppo_token_mask: x.vppo.token_mask,
              vppo_scaling: x.vppo.scaling_factor,
            })
          : x;
      adv.set(v.advantages, at(b));
      oldLp.set(inputs.oldLogprobs.get(x.id) ?? x.behaviour_logprobs, at(b));
      if (x.ref_logprobs.length) refLp.set(x.ref_logprobs, at(b));
      w.set(v.loss_weights, at(b));
      const is = inputs.isWeights?.get(x.id);
      if (is) for (let t = 0, o = at(b); t < is.length; t++) w[o + t] *= is[t];
    });
    const nftRows = inputs.nft ? mini.map(({ x }) => inputs.nft!.get(x.id)!) : null;
    return {
      batch: {
        ...base,
        advantages: adv,
        oldLogprobs: oldLp,
        refLogprobs: o.klLoss ? refLp : undefined,
        lossWeights: w,
        rewards: nftRows?.map((r) => r.reward),
        groupAccuracy: nftRows?.map((r) => r.groupAccuracy),
      },
      tokens,
    };
  });
}

/** The critic's mini-batches of a step: tokens and masks [B, T], and each response position's old value and return. */
export function packValueBatches(
  groups: readonly UpdateGroup[],
  images: ReadonlyMap<UpdateGroup, ImagePixels[]>,
  o: PackOptions,
): PackedBatch[] {
  return miniBatchesOf(groups, o.miniBatchSize).map((mini) => {
    const { base, at, tokens } = layout(mini, o, images);
    const N = base.batchSize * base.seqLen;
    const vals = new Float32Array(N),
      rets = new Float32Array(N);
    mini.forEach(({ x }, b) => {
      vals.set(x.values, at(b));
      rets.set(x.returns, at(b));
    });
    return { batch: { ...base, values: vals, returns: rets }, tokens };
  });
}

/**
 * Rollout-correction weights (lib/rl/rollout-correction.ts) of the samples whose old log-probs the
 * trainer recomputed (`old`), against their engine's behaviour log-probs; null weights when the
 * mode is off (the mismatch metrics are returned either way).
 */
export function rolloutCorrectionOf(
  groups: readonly UpdateGroup[],
  old: ReadonlyMap<string, Float32Array>,
  cfg: RolloutCorrectionConfig,
): { weights: Map<string, Float32Array> | null; metrics: Record<string, number> } {
  const ids: string[] = [];
  const rows = groups.flatMap((g) =>
    g.samples.flatMap((x) => {
      const o = old.get(x.id);
      if (!o) return [];
      ids.push(x.id);
      return [{ old: o, behaviour: x.behaviour_logprobs, mask: x.response_mask }];
    }),
  );
  const r = rolloutCorrection(rows, cfg);
  return { weights: cfg.mode === 'off' ? null : new Map(ids.map((id, i) => [id, r.weights[i]])), metrics: r.metrics };
}

/**
 * The packing and metrics a training step uses (lib/pipeline/update-train.ts): the policy's
 * mini-batches with the step's old log-probs, rollout-correction weights, NFT targets
 * (algorithm.loss = nft) and images; the critic's; the rollout correction; the step's metrics.
 */
export function stepPacking(cfg: Config, packing: PackOptions): StepPacking {
  return {
    policyBatches: (kept, old, isWeights, images) =>
      packPolicyBatches(
        kept,
        {
          oldLogprobs: old,
          isWeights,
          nft: trainsNft(cfg) ? nftTargets(kept, cfg.algorithm.nft.correct_key) : null,
          images,
        },
        packing,
      ),
    criticBatches: (kept, images) => packValueBatches(kept, images, packing),
    correction: (kept, old) => rolloutCorrectionOf(kept, old, cfg.algorithm.rollout_correction),
    metrics: stepMetrics,
  };
}
