/**
 * A run's checkpoints as the update stage keeps them: each one a directory
 * (`<run_dir>/checkpoints/global_step_N`, lib/pipeline/checkpoints.ts) and a row in the store's
 * checkpoints table (the trainer state), read and written through the store port.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Config } from '../config/index.ts';
import { TransientError } from '../errors.ts';
import { weightsFileOf } from '../model/checkpoint.ts';
import { lrAt, warmupStepsOf, type LrScheduleConfig } from '../optim/lr-schedule.ts';
import { sha256File } from '../policy-store/hash.ts';
import { keptCheckpointSteps } from '../policy-store/index.ts';
import type { StoredCheckpoint, Store, Tx } from '../store/port.ts';
import {
  checkpointDir,
  datasetPosition,
  listCheckpointSteps,
  readCheckpointPath,
  removeCheckpointDir,
  verifyCheckpointFiles,
  TRAINER_STATE_FILE,
  TRAINER_STATE_FORMAT,
  writeCheckpointDir,
  type TrainerState,
} from './checkpoints.ts';
import { crashPoint } from './crash-points.ts';
import type { ControllerPlan } from './plan.ts';
import { loadStageState, type Executor } from './stage-state.ts';

/** Where a run's checkpoints live: its directory and its store. */
export interface RunCheckpoints {
  runId: string;
  runDir: string;
  store: Store;
}

/** Whether every file a checkpoint's trainer_state.json records still has its sha256 (true where it records none). */
async function filesIntact(dir: string): Promise<boolean> {
  try {
    const { state } = readCheckpointPath(dir);
    if (state) await verifyCheckpointFiles(dir, state);
    return true;
  } catch {
    return false;
  }
}

/**
 * How to go on from the newest checkpoint whose weights still have their recorded sha256 (said
 * when a stored version is damaged or missing). `tx`: the batch transaction, if any.
 */
export async function resumeHint(c: RunCheckpoints, tx?: Tx): Promise<string> {
  const rows = await c.store.listCheckpoints(c.runId, { tx }).then(
    (r) => r.reverse(),
    () => [],
  );
  for (const ck of rows) {
    const actor = join(ck.path, 'actor', weightsFileOf(join(ck.path, 'actor')));
    if (existsSync(actor) && (await sha256File(actor)) === ck.sha256 && (await filesIntact(ck.path))) {
      return `The last good checkpoint is ${ck.path} (step ${ck.step}, sha256 ${ck.sha256}): start a new run from it with trainer.load_checkpoint_path=${ck.path} and a new pipeline.run_id (or another trainer.run_dir)`;
    }
  }
  return 'No intact checkpoint of this run was found; restore the file from a backup, or start the run over (a new pipeline.run_id or another trainer.run_dir)';
}

/** The steps of the checkpoints kept under trainer.save_limit (their policy versions are kept too). */
export async function keptCheckpoints(c: RunCheckpoints, saveLimit: number, tx?: Tx): Promise<number[]> {
  const steps = (await c.store.listCheckpoints(c.runId, { tx })).map((r) => r.step);
  return keptCheckpointSteps(steps, saveLimit);
}

/** The stored directories a checkpoint is linked from: the version's weights and the step's optimizer states. */
export interface CheckpointSources {
  actor: string;
  critic: string | null;
  optimizers: { actor: string; critic: string | null };
  /** The sha256 of linked files recorded when they were written ("actor/model.safetensors" → sha256): not read back. */
  known?: Readonly<Record<string, string>>;
}

/**
 * Writes checkpoint `state.step`: the directory (temporary name, fsync, rename), then its row
 * (in `tx`, with the batch's other writes), then removes the directories beyond `saveLimit`.
 * Returns the directory.
 */
export async function saveRunCheckpoint(
  c: RunCheckpoints,
  state: TrainerState,
  dirs: CheckpointSources & { reference: string },
  saveLimit: number,
  tx?: Tx,
): Promise<string> {
  const dir = await writeCheckpointDir(
    c.runDir,
    state,
    dirs.actor,
    dirs.reference,
    dirs.critic,
    dirs.optimizers,
    dirs.known ?? {},
  );
  await c.store.recordCheckpoint(
    {
      runId: c.runId,
      step: state.step,
      path: dir,
      sha256: state.sha256,
      policyVersion: state.policy_version,
      consumedOffsets: state.consumed_offsets,
      datasetPosition: { ...state.dataset_position },
      rngState: state.rng_state,
      klCtlState: state.kl_ctl_state,
      lrState: state.lr_state,
    },
    { tx },
  );
  crashPoint('checkpoint:recorded');
  const steps = await listCheckpointSteps(c.runDir);
  const kept = new Set(keptCheckpointSteps(steps, saveLimit));
  for (const s of steps) if (!kept.has(s)) await removeCheckpointDir(c.runDir, s);
  return dir;
}

/** A checkpoints row as the trainer state it records (trainer_state.json). */
function trainerStateOfRow(runId: string, row: StoredCheckpoint): TrainerState {
  return {
    format: TRAINER_STATE_FORMAT,
    run_id: runId,
    step: row.step,
    policy_version: row.policyVersion,
    sha256: row.sha256,
    dataset_position: row.datasetPosition as unknown as TrainerState['dataset_position'],
    consumed_offsets: row.consumedOffsets as Record<string, number>,
    rng_state: row.rngState as TrainerState['rng_state'],
    kl_ctl_state: row.klCtlState as TrainerState['kl_ctl_state'],
    lr_state: row.lrState as TrainerState['lr_state'],
  };
}

/**
 * policy_store = postgres or s3: the checkpoints kept under save_limit whose directories this node
 * lacks (a restart on another node, an emptyDir) are rebuilt from the run's database — the
 * versions (kept while a checkpoint needs them) and the checkpoint rows (the trainer state) —
 * so checkpoints/global_step_N is there to resume from with trainer.load_checkpoint_path.
 * `dirs(version)`: the stored policy (and critic, if any) directories of a version.
 */
export async function rebuildCheckpointDirs(
  c: RunCheckpoints,
  saveLimit: number,
  dirs: (version: number) => Promise<CheckpointSources>,
  reference: () => Promise<string>,
): Promise<Array<{ step: number; path: string }>> {
  const rows = await c.store.listCheckpoints(c.runId);
  const kept = new Set(
    keptCheckpointSteps(
      rows.map((r) => r.step),
      saveLimit,
    ),
  );
  const rebuilt: Array<{ step: number; path: string }> = [];
  for (const row of rows) {
    if (!kept.has(row.step) || existsSync(join(checkpointDir(c.runDir, row.step), TRAINER_STATE_FILE))) continue;
    const d = await dirs(row.policyVersion);
    const dir = await writeCheckpointDir(
      c.runDir,
      trainerStateOfRow(c.runId, row),
      d.actor,
      await reference(),
      d.critic,
      d.optimizers,
    );
    if (dir !== row.path) await c.store.recordCheckpoint({ ...row, path: dir });
    rebuilt.push({ step: row.step, path: dir });
  }
  return rebuilt;
}

/**
 * The KL controller's coefficient after `step`: algorithm.kl_coef, or with the adaptive
 * controller in the reward the value the advantage stage saved for that step (not saved yet:
 * a retriable error; on Kafka the advantage stage saves it just after producing the step's groups).
 */
export async function klCoefAt(cfg: Config, db: Executor, runId: string, step: number): Promise<number> {
  const a = cfg.algorithm;
  if (!(a.use_kl_in_reward && a.kl_type === 'adaptive')) return a.kl_coef;
  const adv = await loadStageState<{ klByStep?: Record<string, number> }>(db, runId, 'advantage');
  const v = adv?.klByStep?.[String(step)];
  if (v === undefined)
    throw new TransientError(
      `checkpoint of step ${step}: the advantage stage has not saved its KL controller state for step ${step} yet`,
    );
  return v;
}

/** What the checkpoint of `step` records (trainer_state.json and the checkpoints row). */
export function trainerStateAt(a: {
  cfg: Config;
  runId: string;
  plan: ControllerPlan;
  step: number;
  /** sha256 of the policy version's weights. */
  sha256: string;
  /** Where the update stage's input holds every group of the steps after this one ("<topic>/<partition>" → offset). */
  positions: Record<string, number>;
  klCoef: number;
  schedule: LrScheduleConfig;
  optimizerSteps: number;
  totalOptimizerSteps: number;
}): TrainerState {
  const { cfg, schedule } = a;
  const alg = cfg.algorithm;
  return {
    format: TRAINER_STATE_FORMAT,
    run_id: a.runId,
    step: a.step,
    policy_version: a.step,
    sha256: a.sha256,
    dataset_position: datasetPosition(a.plan, a.step),
    consumed_offsets: { ...a.positions },
    rng_state: {
      scheme: 'keyed-by-id',
      seed: cfg.data.seed,
      init_seed: cfg.actor.model.init_seed,
      note: 'sampling noise is drawn from PRNG(data.seed, sample id) and shuffles from (data.seed, epoch): no generator state to carry',
    },
    kl_ctl_state: {
      use_kl_in_reward: alg.use_kl_in_reward,
      type: alg.kl_type,
      value: a.klCoef,
      initial: alg.kl_coef,
      target_kl: alg.kl_target,
      horizon: alg.kl_horizon,
      use_kl_loss: alg.use_kl_loss,
      kl_loss_coef: alg.kl_coef,
    },
    lr_state: {
      scheduler: schedule.scheduler,
      base_lr: schedule.lr,
      lr: lrAt(schedule, Math.max(1, a.optimizerSteps), a.totalOptimizerSteps),
      optimizer_steps: a.optimizerSteps,
      total_optimizer_steps: a.totalOptimizerSteps,
      warmup_steps: warmupStepsOf(schedule, a.totalOptimizerSteps),
      min_lr_ratio: cfg.actor.optim.min_lr_ratio,
    },
  };
}
