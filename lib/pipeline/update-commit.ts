/**
 * The update stage's commit of a trained step, its I/O: the learner's version stored (policy,
 * critic, EMA), its `policy` record built, and when due its checkpoint written (directory, then
 * row); after a batch, the stored versions no longer needed removed. Which steps are
 * checkpointed and which versions are files: lib/pipeline/version-files.ts; the consumed offsets
 * and the versions still in use are decided in services/update/logic.ts.
 */
import type { Config, VersionFiles } from '../config/index.ts';
import type { PolicyVersion } from '../contracts/index.ts';
import type { Logger } from '../log.ts';
import type { LrScheduleConfig } from '../optim/lr-schedule.ts';
import { collectGarbage } from '../util/gc.ts';
import { crashPoint } from './crash-points.ts';
import { oldestSampledVersion } from '../policy-store/retention.ts';
import type { ArtifactKind } from '../policy-store/index.ts';
import type { PolicyLearner } from './learner.ts';
import { totalSteps, type ControllerPlan } from './plan.ts';
import { shouldCheckpoint, writesVersionFile } from './version-files.ts';
import {
  keptCheckpoints,
  klCoefAt,
  saveRunCheckpoint,
  trainerStateAt,
  type RunCheckpoints,
} from './run-checkpoints.ts';
import type { RunVersions } from './run-versions.ts';
import type { StageContext } from './runtime.ts';
import { txOf, type Executor } from './stage-state.ts';
import type { UpdateState } from './update-start.ts';

/** What the update stage commits its versions with. */
export interface UpdateCommitter {
  cfg: Config;
  runId: string;
  plan: ControllerPlan;
  learner: PolicyLearner;
  versions: RunVersions;
  checkpoints: RunCheckpoints;
  /** policy.version_files as applied (lib/pipeline/version-files.ts versionFilesOf). */
  versionFiles: VersionFiles;
  /** The actor's learning-rate schedule (trainer_state.json's lr_state). */
  schedule: LrScheduleConfig;
  totalOptimizerSteps: number;
  log: Logger;
}

/** What a step's `policy` record says of the step besides its version. */
export type StepRecord = Pick<PolicyVersion, 'groups' | 'samples' | 'tokens' | 'consumed'>;

/**
 * The update stage's state once step `step` is committed (its version `sha`, a checkpoint or not):
 * the version is the step, the step's first input offsets are no longer needed, and the sha256 of
 * each version after the last checkpoint is kept (a resume re-trains those steps and takes their
 * versions' sha256 back from here; a checkpoint starts the list again).
 */
export function noteCommitted(st: UpdateState, step: number, checkpoint: boolean, sha: string): void {
  st.version = step;
  delete st.stepStarts?.[String(step)];
  st.versionSha = checkpoint ? {} : { ...st.versionSha, [String(step)]: sha };
}

/**
 * Stores the version the learner holds after training step `step` (weights only; with `file`
 * false a full policy's version is kept in memory only: RunVersions.put) and
 * returns its `policy` record; with `checkpoint`, writes the step's optimizer states and its
 * checkpoint too (temporary name, fsync, rename — then the row; a half-written one is never
 * listed), recording `checkpoint.rereadFrom`: the offsets from which the update stage's input holds
 * every group of the steps after this one. All through the batch's executor.
 */
export async function commitVersion(
  c: UpdateCommitter,
  state: UpdateState,
  step: number,
  record: StepRecord,
  o: { file: boolean; checkpoint: { rereadFrom: Record<string, number> } | null },
  ctx: Pick<StageContext, 'db' | 'tx'>,
): Promise<PolicyVersion> {
  const { cfg, versions } = c;
  const { checkpoint } = o;
  await c.learner.store(step, ctx.db, !o.file && !checkpoint);
  const rec = await versions.record(step, Date.now(), record, ctx.db);
  if (checkpoint) {
    crashPoint('checkpoint:start');
    await c.learner.storeOptimizers(step, ctx.db);
    const ts = trainerStateAt({
      cfg,
      runId: c.runId,
      plan: c.plan,
      step,
      sha256: rec.sha256,
      positions: checkpoint.rereadFrom,
      klCoef: await klCoefAt(cfg, ctx.db, c.runId, step),
      schedule: c.schedule,
      optimizerSteps: state.optimizerSteps,
      totalOptimizerSteps: c.totalOptimizerSteps,
    });
    const critic = cfg.critic.enable === true;
    const dirs = {
      actor: versions.writeDir('policy', step),
      reference: await versions.dir('policy', 0, ctx.db),
      critic: critic ? versions.writeDir('critic', step) : null,
      optimizers: {
        actor: versions.writeDir('optimizer', step),
        critic: critic ? versions.writeDir('critic-optimizer', step) : null,
      },
      known: await recordedSha256(versions, step, critic, ctx.db),
    };
    await saveRunCheckpoint(c.checkpoints, ts, dirs, cfg.trainer.save_limit, ctx.tx);
  }
  return rec;
}

/**
 * The sha256 the policy store recorded for the files a checkpoint of `step` links, as
 * trainer_state.json names them ("actor/model.safetensors", "reference/config.json", …): the
 * checkpoint takes them instead of reading 2–4 model-sized files back (they are the bytes hashed
 * as they were written; a reader checks every file against them).
 */
async function recordedSha256(
  versions: RunVersions,
  step: number,
  critic: boolean,
  db: Executor,
): Promise<Record<string, string>> {
  const known: Record<string, string> = {};
  const add = async (sub: string, kind: ArtifactKind, version: number) => {
    for (const f of await versions.recordedFiles(kind, version, db)) known[`${sub}/${f.name}`] = f.sha256;
  };
  await add('actor', 'policy', step);
  await add('actor', 'optimizer', step);
  await add('reference', 'policy', 0);
  if (critic) {
    await add('critic', 'critic', step);
    await add('critic', 'critic-optimizer', step);
  }
  return known;
}

/**
 * Commits trained step `step`: a checkpoint when due (shouldCheckpoint), its version written as a
 * file or kept in memory only (policy.version_files: writesVersionFile), the version stored
 * (commitVersion) and the update state moved to it (noteCommitted). `rereadFrom`: the offsets from
 * which the update stage's input holds every group of the steps after this one (recorded with a
 * checkpoint). Returns the step's `policy` record.
 */
export async function commitStep(
  c: UpdateCommitter,
  state: UpdateState,
  step: number,
  record: StepRecord,
  rereadFrom: Record<string, number>,
  ctx: Pick<StageContext, 'db' | 'tx'>,
): Promise<PolicyVersion> {
  const checkpoint = shouldCheckpoint(step, totalSteps(c.plan), c.cfg.trainer.save_freq);
  const file = writesVersionFile(step, c.versionFiles, c.cfg, c.plan);
  const rec = await commitVersion(
    c,
    state,
    step,
    record,
    { file, checkpoint: checkpoint ? { rereadFrom } : null },
    ctx,
  );
  noteCommitted(state, step, checkpoint, rec.sha256);
  return rec;
}

/**
 * The versions a prune keeps besides retention's own rule: those in `inUse` (validation rounds may
 * still sample with them) and, for a run started from a checkpoint, its start (it resumes from
 * there until its own first checkpoint; its EMA version).
 */
export function versionsKept(st: Pick<UpdateState, 'startedAt'>, inUse: readonly number[]): number[] {
  return st.startedAt ? [...inUse, st.startedAt.step] : [...inUse];
}

/**
 * Before step `step` trains, lets go of the versions handed to this process's readers that no
 * rollout can sample with any more, and frees them (lib/util/gc.ts): the advantage stage publishes a
 * step only once every prompt batch of it (refills included) is scored, so the batches still to
 * sample are of later steps, whose versions are ≥ oldestSampledVersion(step, max_staleness); the
 * versions of validation rounds in `inUse` stay. At max_staleness 0 the version the step's samples
 * came from is then not held while the step trains (the trainer's own weights are that version
 * until its first update), one copy of the weights less at the training peak. A version is handed
 * over again where a reader can still need it after a failed batch (update-resume.ts).
 */
export function releaseSampledVersions(c: UpdateCommitter, step: number, inUse: readonly number[]): void {
  if (c.versions.retainInMemory(oldestSampledVersion(step, c.cfg.pipeline.max_staleness), inUse) > 0) collectGarbage();
}

/**
 * Removes the stored versions no longer needed (lib/policy-store/retention.ts): not the
 * reference, the newest two, those within pipeline.max_staleness, a kept checkpoint's, those
 * versionsKept keeps, nor the trainer.keep_policy_versions newest others. Critic and EMA versions
 * go with their policy version.
 */
export async function pruneVersions(
  c: UpdateCommitter,
  st: Pick<UpdateState, 'version' | 'startedAt'>,
  inUse: readonly number[],
  db: Executor,
): Promise<void> {
  const { cfg } = c;
  const newest = st.version;
  // through the batch's executor (PGlite: its transaction holds the one connection; it sees this batch's checkpoint row)
  const checkpointSteps = await keptCheckpoints(c.checkpoints, cfg.trainer.save_limit, txOf(db));
  const pruned = await c.versions.prune(
    {
      newest,
      maxStaleness: cfg.pipeline.max_staleness,
      checkpointSteps,
      keepExtra: cfg.trainer.keep_policy_versions,
      inUse: versionsKept(st, inUse),
    },
    db,
  );
  // the versions kept in memory only that no rollout can still sample with
  c.versions.retainInMemory(oldestSampledVersion(newest, cfg.pipeline.max_staleness), inUse);
  if (pruned.length)
    c.log.debug(
      { pruned },
      `pruned policy versions ${pruned.join(', ')} (no longer needed; trainer.keep_policy_versions keeps more)`,
    );
}
