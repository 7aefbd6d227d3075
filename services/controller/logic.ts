/**
 * Controller logic (pure): decides which prompt batches to publish, given the run plan and the
 * events it has seen. No I/O, no clock, no randomness beyond the seeded permutation — so the same
 * events always yield the same commands, and a restarted controller re-derives everything.
 *
 * Steps are 1-based like verl's `global_step`; policy version v = number of updates applied
 * (v0 = the initial weights). Step s may be rolled out once a version v ≥ s − 1 − max_staleness
 * exists (max_staleness 0 = strictly on-policy: step s uses version s − 1).
 *
 * Step s draws its prompts from epoch ⌊(s−1)/steps_per_epoch⌋ of the training set, in a
 * permutation seeded by (seed, epoch) when shuffling. An incomplete final batch is dropped (as
 * verl's dataloader with drop_last). When online filtering drops groups, the advantage stage asks
 * for a refill: try t of step s takes the needed number of prompts from a permutation seeded by
 * (seed, step, t), so refills are deterministic and do not shift later steps' prompts.
 */
import { Rng } from '../../lib/util/rng.ts';
import type { Config } from '../../lib/config/index.ts';
import {
  chunkId,
  controlEvent,
  controlId,
  groupIdFor,
  hashId,
  type ControlEventOf,
  type ControlPayloads,
  type ControlType,
  type PromptBatch,
  type ScoredGroup,
} from '../../lib/contracts/index.ts';
import type { RunData } from '../../lib/pipeline/data.ts';
import { sampleRow } from '../../lib/pipeline/rows.ts';
import type { MetricRow, PromptImageRow, TrajectoryRow, ValGenerationRow } from '../../lib/store/port.ts';
import { stepsPerEpoch, totalSteps, valScheduled, type ControllerPlan } from '../../lib/pipeline/plan.ts';

export { stepsPerEpoch, totalSteps, valScheduled, type ControllerPlan };

export interface PolicyRef {
  version: number;
  step: number;
  path: string;
  sha256: string;
}

export interface ControllerState {
  /** Highest train step whose prompts were published (0 = none). */
  emittedStep: number;
  latest: PolicyRef | null;
  /** Refill tries used per step. */
  refills: Record<number, number>;
  /** Validation rounds (identified by the policy version they evaluate) published / finished. */
  valEmitted: number[];
  valDone: number[];
  done: boolean;
  /** The run failed (done without run_done); absent in states saved before it existed. */
  failed?: boolean;
}

export type ControllerEvent =
  | { type: 'policy'; policy: PolicyRef }
  /** `request`: the advantage stage's 1-based request number for the step (a redelivered request is ignored). */
  /** `reason`: why the step is short of usable groups (the advantage stage's account: reward failures with the last error, online filtering). */
  | { type: 'refill'; step: number; needed: number; request?: number; reason?: string }
  | { type: 'val_done'; version: number }
  /** The run was started again with more steps than it finished with (trainer.total_epochs / max_steps raised). */
  | { type: 'extend' };

export interface PromptRef {
  /** Slot within the step (0..B−1 for the first draw; refills continue after). */
  promptIndex: number;
  /** Row index into the dataset. */
  datasetIndex: number;
}

export type ControllerCommand =
  | { type: 'train_prompts'; step: number; epoch: number; attempt: number; policy: PolicyRef; prompts: PromptRef[] }
  | { type: 'val_prompts'; version: number; policy: PolicyRef; prompts: PromptRef[] }
  | { type: 'run_done'; finalVersion: number }
  | { type: 'fail'; message: string };

export function initialState(): ControllerState {
  return { emittedStep: 0, latest: null, refills: {}, valEmitted: [], valDone: [], done: false };
}

const permCache = new Map<string, Uint32Array>();

/** A deterministic permutation of 0..n−1 for a seed label (memoised; pure). */
export function permutation(n: number, label: string): Uint32Array {
  const key = `${n}:${label}`;
  let p = permCache.get(key);
  if (!p) {
    const arr = Array.from({ length: n }, (_, i) => i);
    Rng.fromSeed(label).shuffle(arr);
    p = Uint32Array.from(arr);
    if (permCache.size > 64) permCache.clear();
    permCache.set(key, p);
  }
  return p;
}

/** The prompts of train step s (1-based), and its epoch. */
export function stepPrompts(plan: ControllerPlan, step: number): { epoch: number; prompts: PromptRef[] } {
  const spe = stepsPerEpoch(plan);
  const epoch = Math.floor((step - 1) / spe);
  const within = (step - 1) % spe;
  const perm = plan.shuffle ? permutation(plan.trainSize, `${plan.seed}:epoch:${epoch}`) : null;
  const prompts: PromptRef[] = [];
  for (let j = 0; j < plan.rolloutBatchSize; j++) {
    const pos = within * plan.rolloutBatchSize + j;
    prompts.push({ promptIndex: j, datasetIndex: perm ? perm[pos] : pos });
  }
  return { epoch, prompts };
}

/** Refill attempt t (1-based) of step s: `needed` prompts from a (seed, step, t) permutation. */
export function refillPrompts(plan: ControllerPlan, step: number, attempt: number, needed: number): PromptRef[] {
  const perm = permutation(plan.trainSize, `${plan.seed}:refill:${step}:${attempt}`);
  const base = plan.rolloutBatchSize * attempt;
  return Array.from({ length: Math.min(needed, plan.trainSize) }, (_, j) => ({
    promptIndex: base + j,
    datasetIndex: perm[j],
  }));
}

function valPrompts(plan: ControllerPlan): PromptRef[] {
  return Array.from({ length: plan.valSize }, (_, i) => ({ promptIndex: i, datasetIndex: i }));
}

function finished(plan: ControllerPlan, s: ControllerState): boolean {
  const last = totalSteps(plan);
  if (!s.latest || s.latest.version < last) return false;
  return s.valEmitted.every((v) => s.valDone.includes(v));
}

/** Why a step failed when online filtering ran out of refills, in the terms of its semantics. */
export function filterExhausted(
  plan: Pick<ControllerPlan, 'maxTryMakeBatch' | 'filterSemantics' | 'filterKey'>,
  step: number,
): string {
  const head = `step ${step}: online filtering kept too few groups after ${plan.maxTryMakeBatch} extra batches (algorithm.max_try_make_batch)`;
  const key = plan.filterKey ?? 'overall';
  if (plan.filterSemantics === 'dapo') {
    return `${head}; with algorithm.filter_semantics = dapo a group is kept only when its "${key}" values are not all equal, and too many groups were all right or all wrong — raise max_try_make_batch or rollout.n, use a reward metric with more spread (algorithm.filter_key), or turn off algorithm.online_filtering`;
  }
  return `${head}; too many groups' mean "${key}" lies outside (algorithm.filter_low, algorithm.filter_high) — widen the filter, raise max_try_make_batch, or turn off algorithm.online_filtering`;
}

/** A refill request's reasons that are this version's accounts (older records say only this). */
const GENERIC_REFILL_REASON = 'online filtering / reward failures left too few groups';

/** Why the run stops when a step stays short of usable groups: the advantage stage's reason when it gave one, else online filtering's. */
function shortfallMessage(plan: ControllerPlan, step: number, reason: string | undefined): string {
  if (reason && reason !== GENERIC_REFILL_REASON)
    return `step ${step}: too few usable groups after ${plan.maxTryMakeBatch} extra batches (algorithm.max_try_make_batch): ${reason}`;
  return filterExhausted(plan, step);
}

/** decide: (plan, state, event) → commands and the next state. */
export function decide(
  plan: ControllerPlan,
  state: ControllerState,
  event: ControllerEvent,
): { state: ControllerState; commands: ControllerCommand[] } {
  const s: ControllerState = {
    ...state,
    refills: { ...state.refills },
    valEmitted: [...state.valEmitted],
    valDone: [...state.valDone],
  };
  const commands: ControllerCommand[] = [];
  const last = totalSteps(plan);
  // a finished run extended: go on from its last policy version (a failed run stays failed: s.failed)
  if (event.type === 'extend' && s.done && !s.failed && s.latest && s.latest.version < last) {
    s.done = false;
    event = { type: 'policy', policy: s.latest };
    s.latest = null;
  }
  if (s.done) return { state: s, commands };
  if (plan.trainSize > 0 && stepsPerEpoch(plan) === 0 && !plan.valOnly) {
    s.done = true;
    s.failed = true;
    return {
      state: s,
      commands: [
        {
          type: 'fail',
          message: `the training set has ${plan.trainSize} usable rows, fewer than data.rollout_batch_size = ${plan.rolloutBatchSize}; add data or lower data.rollout_batch_size`,
        },
      ],
    };
  }
  switch (event.type) {
    case 'policy': {
      if (s.latest && event.policy.version <= s.latest.version) break; // duplicate or old
      s.latest = event.policy;
      const v = event.policy.version;
      if (valScheduled(plan, v) && !s.valEmitted.includes(v)) {
        s.valEmitted.push(v);
        commands.push({ type: 'val_prompts', version: v, policy: event.policy, prompts: valPrompts(plan) });
      }
      while (!plan.replayValidation && s.emittedStep < last && v >= s.emittedStep + 1 - 1 - plan.maxStaleness) {
        const step = s.emittedStep + 1;
        const { epoch, prompts } = stepPrompts(plan, step);
        commands.push({ type: 'train_prompts', step, epoch, attempt: 0, policy: event.policy, prompts });
        s.emittedStep = step;
      }
      break;
    }
    case 'refill': {
      if (event.step > s.emittedStep || event.needed <= 0) break;
      // at-least-once delivery (Kafka) can hand over the same request twice: it must not draw twice
      if (event.request !== undefined && event.request <= (s.refills[event.step] ?? 0)) break;
      const tries = (s.refills[event.step] ?? 0) + 1;
      if (tries > plan.maxTryMakeBatch) {
        s.done = true;
        s.failed = true;
        commands.push({ type: 'fail', message: shortfallMessage(plan, event.step, event.reason) });
        return { state: s, commands };
      }
      s.refills[event.step] = tries;
      if (!s.latest) break;
      const { epoch } = stepPrompts(plan, event.step);
      commands.push({
        type: 'train_prompts',
        step: event.step,
        epoch,
        attempt: tries,
        policy: s.latest,
        prompts: refillPrompts(plan, event.step, tries, event.needed),
      });
      break;
    }
    case 'val_done': {
      if (!s.valDone.includes(event.version)) s.valDone.push(event.version);
      break;
    }
  }
  if (finished(plan, s)) {
    s.done = true;
    commands.push({ type: 'run_done', finalVersion: s.latest!.version });
  }
  return { state: s, commands };
}

/** A validation round being collected: the groups of one policy version's validation prompts. */
export interface ValRound {
  groups: string[];
  rewardSum: number;
  accSum: number;
  n: number;
  failures: number;
  /** The first trainer.val_generations_to_log generations, logged with the round. */
  gens: Array<{
    idx: number;
    prompt: string;
    response: string;
    gt: string;
    reward: number | null;
    failure: string | null;
  }>;
}

/** What a validation round reads of a scored validation group. */
export interface ValGroup {
  id: string;
  /** The policy version evaluated. */
  step: number;
  prompt_index: number;
  prompt_text: string;
  ground_truth: string;
  samples: ReadonlyArray<{
    sample_index: number;
    response_text: string;
    reward: number | null;
    reward_details: Readonly<Record<string, number>>;
    failure?: { message: string } | null;
  }>;
}

/**
 * Adds a validation group to its round in `rounds` (keyed by the version evaluated): the rewards
 * of its scored samples, accuracy (reward_details.accuracy, else the reward), failed rewards
 * counted apart, and the first `maxGens` generations. Returns the round, or null for a group it
 * already holds (a redelivery).
 */
export function addValGroup(rounds: Record<string, ValRound>, g: ValGroup, maxGens: number): ValRound | null {
  const key = String(g.step);
  const round = rounds[key] ?? (rounds[key] = { groups: [], rewardSum: 0, accSum: 0, n: 0, failures: 0, gens: [] });
  if (round.groups.includes(g.id)) return null;
  round.groups.push(g.id);
  for (const s of g.samples) {
    if (s.reward === null) round.failures++;
    else {
      round.rewardSum += s.reward;
      round.accSum += s.reward_details.accuracy ?? s.reward;
      round.n++;
    }
    if (round.gens.length < maxGens)
      round.gens.push({
        idx: g.prompt_index * 1000 + s.sample_index,
        prompt: g.prompt_text,
        response: s.response_text,
        gt: g.ground_truth,
        reward: s.reward,
        failure: s.failure?.message ?? null,
      });
  }
  return round;
}

/** A finished round's metrics (NaN where no sample was scored) and the line that reports it. */
export function valRoundResult(
  round: ValRound,
  version: number,
): {
  values: Record<'val/reward_score' | 'val/accuracy' | 'val/failures', number>;
  level: 'info' | 'warn';
  message: string;
} {
  const values = {
    'val/reward_score': round.n ? round.rewardSum / round.n : NaN,
    'val/accuracy': round.n ? round.accSum / round.n : NaN,
    'val/failures': round.failures,
  };
  // an accuracy over no scored sample is no number: say why instead of printing NaN
  if (round.n === 0)
    return {
      values,
      level: 'warn',
      message: `validation at version ${version}: no accuracy — the reward failed for all ${round.failures} samples (last error: ${round.gens.findLast((x) => x.failure)?.failure ?? 'see v_reward_failures'}); they are in v_reward_failures`,
    };
  return {
    values,
    level: 'info',
    message: `validation at version ${version}: accuracy ${values['val/accuracy'].toFixed(3)}${round.failures ? ` over ${round.n} samples (the reward failed for ${round.failures} more; see v_reward_failures)` : ''}`,
  };
}

/**
 * A control event of the controller: its id derives from the run, the type and `detail` (one
 * event per type and detail), so a redelivered batch emits the same event again.
 */
export function controllerEvent<T extends ControlType>(
  runId: string,
  type: T,
  step: number,
  version: number,
  payload: ControlPayloads[T],
  timeMs: number,
  detail?: string,
): ControlEventOf<T> {
  return controlEvent(type, payload, {
    run_id: runId,
    id: controlId(runId, type, detail),
    step,
    policy_version: version,
    time_ms: timeMs,
  });
}

/**
 * One prompt batch of `refs` (a training batch holds one group; a validation batch up to
 * data.val_batch_size) with the training or validation sampling, and the prompts' images as
 * prompt_images rows (stored in the transaction that emits the batch).
 */
export function promptBatch(
  cfg: Config,
  runId: string,
  data: Pick<RunData, 'train' | 'val' | 'dataSource'>,
  at: { kind: 'train' | 'val'; step: number; epoch: number; attempt: number; version: number },
  refs: readonly PromptRef[],
): { batch: PromptBatch; images: PromptImageRow[] } {
  const { kind, step } = at;
  const rows = kind === 'train' ? data.train : data.val;
  const images: PromptImageRow[] = [];
  for (const ref of refs)
    for (const x of rows[ref.datasetIndex].images)
      images.push({ runId, hash: x.hash, width: x.width, height: x.height, png: x.png });
  const v = cfg.rollout.val_override;
  const sampling =
    kind === 'train'
      ? {
          temperature: cfg.rollout.temperature,
          top_p: cfg.rollout.top_p,
          top_k: cfg.rollout.top_k,
          max_new_tokens: cfg.data.max_response_length,
        }
      : {
          temperature: v.temperature,
          top_p: v.top_p,
          top_k: v.top_k ?? cfg.rollout.top_k,
          max_new_tokens: cfg.data.max_response_length,
        };
  const groups = refs.map((ref) => {
    const row = rows[ref.datasetIndex];
    const id = groupIdFor(kind, runId, step, ref.promptIndex);
    return {
      id,
      group_uid: hashId(id),
      n: kind === 'train' ? cfg.rollout.n : v.n,
      prompt_index: ref.promptIndex,
      dataset_index: ref.datasetIndex,
      prompt_ids: row.promptIds,
      prompt_text: row.prompt,
      images: row.images.map((x) => x.png),
      image_refs: row.images.map((x) => ({ hash: x.hash, width: x.width, height: x.height })),
      data_source: row.dataSource ?? data.dataSource,
      ground_truth: row.answer,
      extra_info: row.extraInfo ?? '{}',
    };
  });
  const batch: PromptBatch = {
    run_id: runId,
    id: chunkId(kind, runId, step, refs[0].promptIndex, refs.length),
    step,
    policy_version: at.version,
    kind,
    epoch: at.epoch,
    attempt: at.attempt,
    sampling,
    groups,
  };
  return { batch, images };
}

/** A validation group's samples as trajectory rows (kind 'val', step = the policy version evaluated). */
export function valTrajectoryRows(runId: string, g: ScoredGroup): TrajectoryRow[] {
  return g.samples.map((x) => sampleRow(runId, g, x, x.reward_text, { step: g.step }));
}

/**
 * What a complete validation round stores: its finite metrics (stage 'controller', at the policy
 * version evaluated) and its logged generations.
 */
export function valRoundRows(
  runId: string,
  version: number,
  values: Readonly<Record<string, number>>,
  round: ValRound,
): { metrics: MetricRow[]; generations: ValGenerationRow[] } {
  return {
    metrics: Object.entries(values)
      .filter(([, x]) => Number.isFinite(x))
      .map(([name, value]) => ({ runId, step: version, name, value, stage: 'controller' })),
    generations: round.gens.map((x) => ({
      runId,
      step: version,
      idx: x.idx,
      prompt: x.prompt,
      response: x.response,
      groundTruth: x.gt,
      reward: x.reward,
      rewardFailure: x.failure,
    })),
  };
}
