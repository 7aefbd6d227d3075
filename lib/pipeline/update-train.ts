/**
 * One training step of the update stage on a step's groups, for a language policy's learner or an
 * image policy's. A language step: old log-probs recomputed with the current weights for on-policy
 * samples (stale samples, behaviour version < current, keep their behaviour log-probs: the
 * decoupled PPO importance ratio), the rollout correction of those samples, then ppo_epochs over
 * the policy's mini-batches and the critic's. An image step trains on its samples' records
 * (lib/pipeline/image-policy.ts). The batches and metrics are made by the update stage's pure
 * functions (services/update/logic.ts), passed in as `StepPacking`.
 */
import type { Config } from '../config/index.ts';
import type { UpdateGroup } from '../contracts/index.ts';
import type { ImagePixels } from '../data/images.ts';
import type { ImageLearner } from './image-policy.ts';
import type { PolicyImages } from './images.ts';
import type { Learner, LearnerBatch } from './learner.ts';
import { memMark } from './mem-trace.ts';

/** What the update stage packs a language step's batches and a step's metrics with (services/update/logic.ts). */
export interface StepPacking {
  /** The policy's mini-batches: old log-probs by sample id (else behaviour), rollout-correction weights, images. */
  policyBatches(
    kept: readonly UpdateGroup[],
    old: ReadonlyMap<string, Float32Array>,
    isWeights: ReadonlyMap<string, Float32Array> | null,
    images: ReadonlyMap<UpdateGroup, ImagePixels[]>,
  ): LearnerBatch[];
  /** The critic's mini-batches. */
  criticBatches(kept: readonly UpdateGroup[], images: ReadonlyMap<UpdateGroup, ImagePixels[]>): LearnerBatch[];
  /** Rollout-correction weights of the recomputed samples (null: off) and the mismatch metrics. */
  correction(
    kept: readonly UpdateGroup[],
    old: ReadonlyMap<string, Float32Array>,
  ): { weights: Map<string, Float32Array> | null; metrics: Record<string, number> };
  /** The step's metrics from the learner's, the kept groups' staleness against `version`, the tokens trained. */
  metrics(
    trained: Record<string, number>,
    kept: readonly UpdateGroup[],
    version: number,
    tokens: number,
    correction?: Record<string, number>,
  ): Record<string, number>;
}

/** What a training step runs with. */
export interface StepTrainer {
  cfg: Config;
  learner: Learner | ImageLearner;
  packing: StepPacking;
  /** A vision policy (and critic) score and train each row with its prompt's images. */
  images: PolicyImages;
  criticImages: PolicyImages | null;
  /** Replay: the source run's sha256 of each behaviour version (a sample is on-policy only while the version has those bytes). */
  behaviourSha?: ReadonlyMap<number, string>;
  totalOptimizerSteps: number;
}

/**
 * Trains one step on `groups` from version `version` after `optimizerSteps` optimizer steps;
 * returns the step's metrics and the optimizer steps taken so far.
 */
export async function trainUpdateStep(
  t: StepTrainer,
  version: number,
  optimizerSteps: number,
  groups: readonly UpdateGroup[],
): Promise<{ metrics: Record<string, number>; optimizerSteps: number }> {
  const { learner, packing, cfg } = t;
  const kept = groups.filter((g) => !g.filtered);
  if (!('oldLogprobs' in learner)) {
    const r = await learner.trainGroups(kept, version + 1, optimizerSteps, t.totalOptimizerSteps);
    return { metrics: packing.metrics(r.metrics, kept, version, r.tokens), optimizerSteps: r.optimizerSteps };
  }
  const px = await t.images.byGroup(kept);
  const old = await learner.oldLogprobs(kept, px, t.behaviourSha);
  memMark('update:old-logprobs', { version });
  const fix = packing.correction(kept, old);
  const r = await learner.trainStep({
    policyBatches: () => packing.policyBatches(kept, old, fix.weights, px),
    criticBatches: async () => packing.criticBatches(kept, await t.criticImages!.byGroup(kept)),
    epochs: cfg.actor.ppo_epochs,
    criticEpochs: cfg.critic.ppo_epochs ?? cfg.actor.ppo_epochs,
    optimizerSteps,
    totalOptimizerSteps: t.totalOptimizerSteps,
  });
  return {
    metrics: packing.metrics(r.metrics, kept, version, r.tokens, fix.metrics),
    optimizerSteps: r.optimizerSteps,
  };
}
