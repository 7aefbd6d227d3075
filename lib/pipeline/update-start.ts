/**
 * The update stage's start, its I/O: what a start decides on (the stage's saved state, the other
 * stages' state, the last checkpoint, trainer.load_checkpoint_path), the learner opened (at the
 * trainer base a resume re-trains the logged steps from, started from a checkpoint, or fresh),
 * and the run directory's checkpoints made whole (half-written ones removed; with a policy store
 * in the database, kept ones this node lacks rebuilt). The decision whether a start is allowed is
 * services/update/logic.ts startRefusal.
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import type { Config } from '../config/index.ts';
import { ConfigError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { ModelConfig } from '../model/index.ts';
import { ADAPTER_MODEL_FILE } from '../model/lora.ts';
import { MODEL_FILE } from '../model/checkpoint.ts';
import { datasetPosition, describePosition, readCheckpointPath, removeTempCheckpoints } from './checkpoints.ts';
import { Learner, type LearnerSetup, type TrainerBase } from './learner.ts';
import { ImageLearner, imageOptimizerStepsPerEpoch, isImagePolicy, type ImageLearnerSetup } from './image-policy.ts';
import type { ControllerPlan } from './plan.ts';
import { criticModelConfig, policyLora, policyModelConfig, tokenizerFor } from './policy.ts';
import { rebuildCheckpointDirs, type RunCheckpoints } from './run-checkpoints.ts';
import { RunVersions } from './run-versions.ts';
import type { Pipeline } from './runtime.ts';
import { trainerSettings, type TrainerSettings } from './trainer-settings.ts';
import { loadStageState, saveStageState, stagesWithState, txOf, type Executor } from './stage-state.ts';

/** How the update stage is started (app/replay.ts: from a source run's versions). */
export interface UpdateOptions {
  /** Rows of the training set (the run's plan). */
  trainSize: number;
  /**
   * Replay: sha256 of the source run's policy versions. A sample of version v counts as on-policy
   * (old log-probs recomputed, as the source did) only when this run's version v has those exact
   * bytes; otherwise the importance ratio uses its recorded behaviour log-probs.
   */
  behaviourSha?: ReadonlyMap<number, string>;
  /** Replay: the initial policy (v0) directory to start from instead of actor.model.path / init_seed. */
  initialWeightsDir?: string;
  /** The rollout runs in this process (`rlstream train`): policy.version_files defaults to checkpoints. */
  rolloutInProcess?: boolean;
}

/** The update stage's saved state (stage_state 'update'). */
export interface UpdateState {
  version: number;
  optimizerSteps: number;
  /** Consumer positions in the updates topic ("<topic>/<partition>" → next offset), for checkpoint rows. */
  positions?: Record<string, number>;
  /** trainer.load_checkpoint_path the run started from (null: a fresh start). */
  initFrom?: string | null;
  /** The step and optimizer steps the run started at (a load_checkpoint_path start; absent: 0 and 0). */
  startedAt?: { step: number; optimizerSteps: number };
  /**
   * Per step not trained yet, the first offset of its groups per "<topic>/<partition>" of the input
   * (a checkpoint records from where the steps after it are read again).
   */
  stepStarts?: Record<string, Record<string, number>>;
  /** sha256 of the weights of each version trained after the last checkpoint (re-trained steps take it back). */
  versionSha?: Record<string, string>;
}

/**
 * Where a resume starts the trainer from (the last checkpoint of the run, else its start), the
 * optimizer steps done there, and from where the update stage's input holds every group of the
 * steps after it ("<topic>/<partition>" → offset; absent: from the beginning).
 */
export interface ResumeBase extends TrainerBase {
  optimizerSteps: number;
  rereadFrom: Record<string, number>;
}

/** What the update stage's start decides on. */
export interface UpdateStart {
  /** The stage's saved state (null: it has not started yet). */
  state: UpdateState | null;
  /** Other stages with state (read only when the update stage has none). */
  otherStages: string[];
  lastCheckpointPath: string | null;
  /** trainer.load_checkpoint_path, resolved (null: unset). */
  loadPath: string | null;
}

/** The update stage's learner at the run's current version, and the versions and checkpoints it stores to. */
export interface StartedLearner {
  /** A language policy's learner, or an image policy's (actor.model.kind = image). */
  learner: Learner | ImageLearner;
  state: UpdateState;
  settings: TrainerSettings;
  versions: RunVersions;
  checkpoints: RunCheckpoints;
  /** An image policy's optimizer steps per epoch of a step (null: a language policy's, from the batch arithmetic). */
  perEpoch: number | null;
}

/**
 * The model configs of the policy and (critic.enable) the critic: the language policy's from its
 * tokenizer and actor.model; null for an image policy (its model directory is read by its learner).
 */
export function policyModels(cfg: Config): { model: ModelConfig | null; criticModel: ModelConfig | null } {
  const tok = tokenizerFor(cfg);
  const model = isImagePolicy(cfg) ? null : policyModelConfig(cfg, tok);
  return { model, criticModel: cfg.critic.enable === true ? criticModelConfig(cfg, tok) : null };
}

/**
 * Starts the update stage's learner: half-written checkpoints removed, the start checked
 * (`refusal`: why this start is not allowed, or null; it throws a ConfigError), the learner opened
 * (openLearner), and the kept checkpoints this node lacks rebuilt.
 */
export async function startLearner(
  p: Pipeline,
  a: {
    /** The language policy's model config; null for an image policy. */
    model: ModelConfig | null;
    criticModel: ModelConfig | null;
    plan: ControllerPlan;
    log: Logger;
    /** Replay: the initial policy (v0) directory to start from instead of actor.model.path / init_seed. */
    initialWeightsDir?: string;
    refusal: (start: UpdateStart) => string | null;
  },
): Promise<StartedLearner> {
  const { cfg } = p;
  const { model, criticModel, log } = a;
  await removeHalfWrittenCheckpoints(p.runDir, log);
  const checkpoints: RunCheckpoints = { runId: p.runId, runDir: p.runDir, store: p.store };
  const lora = policyLora(cfg);
  // every policy version is a complete model directory: the source's generation config and tokenizer files go along
  const versions = new RunVersions(p.policies, checkpoints, {
    lora,
    assetsFrom: cfg.actor.model.path,
    db: p.db.db,
    policyDtype: cfg.policy.dtype,
  });
  const settings = trainerSettings(cfg);
  const init = a.initialWeightsDir ? { initialWeightsDir: a.initialWeightsDir } : {};
  // an image policy's learner has the language learner's life cycle (lib/pipeline/image-policy.ts)
  const kind = model
    ? languageLearner({ cfg, model, criticModel, settings, lora, versions, log, ...init })
    : imageLearner({ cfg, versions, log, schedule: settings.actor.schedule, ...init });
  const start = await readUpdateStart(p);
  const refusal = a.refusal(start);
  if (refusal) throw new ConfigError(refusal);
  // a resume starts the trainer from the last checkpoint: this node must have its directory
  await rebuildMissingCheckpoints(p, checkpoints, versions, criticModel !== null, log);
  const { learner, state } = await openLearner(p, kind, log, a.plan, start);
  const perEpoch = learner instanceof ImageLearner ? imageOptimizerStepsPerEpoch(learner.settings) : null;
  return { learner, state, settings, versions, checkpoints, perEpoch };
}

/** The sha256 recorded for policy version `version`'s weights ('' when the store no longer holds it). */
export async function recordedSha(p: Pipeline, version: number, db: Executor = p.db.db): Promise<string> {
  const files = await p.policies.files('policy', version, db);
  return files.find((f) => f.name === MODEL_FILE || f.name === ADAPTER_MODEL_FILE)?.sha256 ?? '';
}

/**
 * The trainer base a resume of the update stage at `state` starts from: its newest checkpoint
 * (row and directory: weights, AdamW states, optimizer steps, the offsets recorded with it), else
 * the checkpoint the run was started from (trainer.load_checkpoint_path), else the run's initial
 * weights with a fresh optimizer at step 0. `db`: the batch's executor inside a batch.
 */
export async function resumeBase(p: Pipeline, state: UpdateState, db: Executor = p.db.db): Promise<ResumeBase> {
  const rows = await p.store.listCheckpoints(p.runId, { tx: txOf(db) });
  const last = rows.filter((r) => r.step <= state.version).at(-1);
  if (last)
    return {
      step: last.step,
      dir: last.path,
      sha: last.sha256,
      optimizerSteps: Number((last.lrState as { optimizer_steps?: number }).optimizer_steps ?? 0),
      rereadFrom: last.consumedOffsets as Record<string, number>,
    };
  const step = state.startedAt?.step ?? (state.initFrom ? (readCheckpointPath(state.initFrom).state?.step ?? 0) : 0);
  return {
    step,
    dir: state.initFrom ?? null,
    sha: await recordedSha(p, step, db),
    optimizerSteps: state.startedAt?.optimizerSteps ?? 0,
    rereadFrom: {},
  };
}

/** Reads what the update stage's start decides on from the run's database and config. */
export async function readUpdateStart(p: Pipeline): Promise<UpdateStart> {
  const state = (await loadStageState<UpdateState>(p.db.db, p.runId, 'update')) ?? null;
  const load = p.cfg.trainer.load_checkpoint_path;
  return {
    state,
    loadPath: load ? resolve(load) : null,
    otherStages: state ? [] : await stagesWithState(p.db.db, p.runId),
    lastCheckpointPath: (await p.store.latestCheckpoint(p.runId))?.path ?? null,
  };
}

/**
 * The learner at the run's current version: resumed from its stored version, started from
 * trainer.load_checkpoint_path, or fresh (version 0); the state of a start is saved before any
 * event names it.
 */
export async function openLearner(
  p: Pipeline,
  kind: LearnerKind,
  log: Logger,
  plan: ControllerPlan,
  start: UpdateStart,
): Promise<{ learner: Learner | ImageLearner; state: UpdateState }> {
  const { state: saved, loadPath } = start;
  const versions = kind.setup.versions;
  if (saved) {
    const base = await resumeBase(p, saved);
    const learner = await kind.atBase(base);
    const what = base.dir && existsSync(base.dir) ? `checkpoint ${base.dir}` : `the run's initial weights`;
    const from =
      base.step === saved.version
        ? `from ${what} (sha256 ${base.sha})`
        : `from ${what} at step ${base.step} (sha256 ${base.sha}), re-training steps ${base.step + 1}–${saved.version} from the update stage's input log`;
    const at = datasetPosition(plan, saved.version);
    log.info({ ...at }, `resumed at ${describePosition(at)}, ${from}`);
    // the reference policy (v0: KL reference, the initial weights) is read by later steps only: a
    // damaged one stops the resume now, before anything is trained or committed
    if (saved.version > 0) await versions.find('policy', 0);
    return { learner, state: saved };
  }
  if (loadPath) {
    const { learner, optimizerSteps } = await kind.fromCheckpoint(loadPath);
    const state: UpdateState = {
      version: learner.version,
      optimizerSteps,
      positions: {},
      initFrom: loadPath,
      startedAt: { step: learner.version, optimizerSteps },
    };
    await saveStageState(p.db.db, p.runId, 'update', state);
    const at = datasetPosition(plan, learner.version);
    log.info({ ...at }, `resumed at ${describePosition(at)}, from checkpoint ${loadPath} (sha256 ${learner.sha})`);
    return { learner, state };
  }
  const learner = await kind.fresh();
  const state: UpdateState = { version: 0, optimizerSteps: 0, positions: {}, initFrom: null };
  await saveStageState(p.db.db, p.runId, 'update', state);
  return { learner, state };
}

/** How a learner of one policy kind is opened: fresh, at a trainer base, or from a checkpoint. */
export interface LearnerKind {
  setup: { versions: RunVersions };
  fresh(): Promise<Learner | ImageLearner>;
  atBase(base: TrainerBase): Promise<Learner | ImageLearner>;
  fromCheckpoint(path: string): Promise<{ learner: Learner | ImageLearner; optimizerSteps: number }>;
}

function languageLearner(setup: LearnerSetup): LearnerKind {
  return {
    setup,
    fresh: () => Learner.fresh(setup),
    atBase: (base) => Learner.atBase(setup, base),
    fromCheckpoint: (path) => Learner.fromCheckpoint(setup, path),
  };
}

function imageLearner(setup: ImageLearnerSetup): LearnerKind {
  return {
    setup,
    fresh: () => ImageLearner.fresh(setup),
    atBase: (base) => ImageLearner.atBase(setup, base),
    fromCheckpoint: (path) => ImageLearner.fromCheckpoint(setup, path),
  };
}

/** Removes the checkpoint directories an interrupted write left half-written (they are never listed). */
export async function removeHalfWrittenCheckpoints(runDir: string, log: Logger): Promise<void> {
  const leftovers = await removeTempCheckpoints(runDir);
  if (leftovers.length)
    log.warn(
      { removed: leftovers },
      `removed ${leftovers.length} half-written checkpoint(s) left by an interrupted write`,
    );
}

/**
 * policy_store = postgres or s3: the kept checkpoints this node's run directory lacks are rebuilt
 * from the run's database (lib/pipeline/run-checkpoints.ts rebuildCheckpointDirs). A filesystem
 * policy store keeps them in the run directory itself: nothing to do.
 */
export async function rebuildMissingCheckpoints(
  p: Pipeline,
  checkpoints: RunCheckpoints,
  versions: RunVersions,
  withCritic: boolean,
  log: Logger,
): Promise<void> {
  if (p.policies.kind === 'filesystem') return;
  const rebuilt = await rebuildCheckpointDirs(
    checkpoints,
    p.cfg.trainer.save_limit,
    async (v) => ({
      actor: await versions.dir('policy', v),
      critic: withCritic ? await versions.find('critic', v) : null,
      optimizers: {
        actor: await versions.dir('optimizer', v),
        critic: withCritic ? await versions.find('critic-optimizer', v) : null,
      },
    }),
    () => versions.dir('policy', 0),
  );
  for (const { step, path } of rebuilt)
    log.info({ step, path }, `checkpoint global_step_${step} rebuilt from the run's database at ${path}`);
}
