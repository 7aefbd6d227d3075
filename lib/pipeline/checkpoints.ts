/**
 * Checkpoint directories of a run (the update stage writes them; `trainer.load_checkpoint_path`
 * reads them):
 *
 *   <run_dir>/checkpoints/global_step_N/
 *     actor/       model.safetensors, optimizer.safetensors (AdamW moments + step), config.json
 *     reference/   model.safetensors, config.json — the run's initial policy (v0: the KL reference)
 *     critic/      model.safetensors, optimizer.safetensors, config.json — the value model at this
 *                  step (only when critic.enable; links to <run_dir>/critic/vNNNNNN)
 *     trainer_state.json   step, policy version, sha256, dataset position, consumed offsets,
 *                          RNG, KL-controller and LR-schedule state (the checkpoints table row)
 *
 * The files of actor/ and reference/ are hard links to the policy version directories
 * (<run_dir>/policy/vNNNNNN, written atomically by the update stage), copied when the
 * filesystem refuses links, so a checkpoint stays whole when versions are pruned or the
 * directory is copied elsewhere. A checkpoint is built under a temporary name
 * (`.global_step_N.tmp-…`), every file and directory fsynced, then renamed into place, and only
 * then recorded in the store: a write interrupted half-way leaves a dot-name that is never listed
 * as a checkpoint and is removed at the next start (`removeTempCheckpoints`).
 */
import { promises as fs, existsSync, readFileSync, statSync } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { basename, dirname, join, resolve } from 'node:path';
import { ConfigError, withStoragePath } from '../errors.ts';
import type { JsonObject } from '../store/port.ts';
import { stepsPerEpoch, type ControllerPlan } from './plan.ts';
import { crashPoint } from './crash-points.ts';
import { MODEL_SIDE_FILES, OPTIMIZER_FILE } from '../model/checkpoint.ts';
import { sha256File } from '../policy-store/hash.ts';
import { ARTIFACT_KINDS } from '../policy-store/port.ts';

export const TRAINER_STATE_FILE = 'trainer_state.json';
export const TRAINER_STATE_FORMAT = 'rlstream.trainer_state.v1';
// a policy directory is a complete Hugging Face model directory: its generation config and tokenizer files go along
// (a LoRA run's policy directory is a PEFT adapter: adapter_config.json + adapter_model.safetensors)
const MODEL_FILES = [
  'model.safetensors',
  'optimizer.safetensors',
  'adapter_config.json',
  'adapter_model.safetensors',
  // an image policy's LoRA adapter and an image SFT's EMA weights (lib/image/lora.ts, app/sft-image.ts)
  'adapter.safetensors',
  'ema.safetensors',
  ...MODEL_SIDE_FILES,
];

/** Where the dataset stands after `step` (the next step's epoch and first prompt). */
export interface DatasetPosition {
  /** Steps completed. */
  step: number;
  /** 0-based epoch of the next step (resuming after an epoch's last step starts the next epoch). */
  epoch: number;
  /** Prompts of that epoch already used (position of the next step's first prompt in the epoch's order). */
  index: number;
  train_size: number;
  rollout_batch_size: number;
  steps_per_epoch: number;
  shuffle: boolean;
  /** data.seed; epoch e is shuffled by the permutation seeded with "<seed>:epoch:<e>". */
  seed: number;
  shuffle_seed: string | null;
}

export function datasetPosition(
  plan: Pick<ControllerPlan, 'trainSize' | 'rolloutBatchSize' | 'shuffle' | 'seed'>,
  step: number,
): DatasetPosition {
  const spe = Math.max(1, stepsPerEpoch(plan));
  const epoch = Math.floor(step / spe);
  return {
    step,
    epoch,
    index: (step % spe) * plan.rolloutBatchSize,
    train_size: plan.trainSize,
    rollout_batch_size: plan.rolloutBatchSize,
    steps_per_epoch: stepsPerEpoch(plan),
    shuffle: plan.shuffle,
    seed: plan.seed,
    shuffle_seed: plan.shuffle ? `${plan.seed}:epoch:${epoch}` : null,
  };
}

/** "step 40, epoch 2, prompt 128 of 500" */
export function describePosition(p: DatasetPosition): string {
  return `step ${p.step}, epoch ${p.epoch}, prompt ${p.index} of ${p.train_size}`;
}

/** What trainer_state.json holds (and the checkpoints table row). */
export interface TrainerState {
  format: typeof TRAINER_STATE_FORMAT;
  run_id: string;
  step: number;
  policy_version: number;
  /** sha256 of actor/model.safetensors. */
  sha256: string;
  dataset_position: DatasetPosition;
  /** The update stage's consumer positions in its input topic: "<topic>/<partition>" → next offset. */
  consumed_offsets: Record<string, number>;
  rng_state: JsonObject;
  kl_ctl_state: JsonObject;
  lr_state: JsonObject;
  /**
   * sha256 of every file of the checkpoint (actor/, reference/, critic/; path relative to the
   * checkpoint directory), checked before a run starts from it. Absent in older checkpoints,
   * which record only `sha256` (actor/model.safetensors).
   */
  files_sha256?: Record<string, string>;
  /**
   * sha256 of this state itself (every other field, keys sorted, as JSON): an edited or damaged
   * trainer_state.json is refused like a damaged weights file. Absent in older checkpoints.
   */
  state_sha256?: string;
}

/** JSON with object keys sorted at every level: the bytes `state_sha256` is taken over. */
function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v !== null && typeof v === 'object')
    return `{${Object.keys(v)
      .filter((k) => (v as Record<string, unknown>)[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  return JSON.stringify(v);
}

/** The sha256 a trainer state records of itself (over every field but `state_sha256`). */
export function trainerStateSha256(state: TrainerState): string {
  const { state_sha256: _, ...rest } = state;
  return createHash('sha256').update(canonicalJson(rest)).digest('hex');
}

export function checkpointsRoot(runDir: string): string {
  return join(runDir, 'checkpoints');
}
export function checkpointDir(runDir: string, step: number): string {
  return join(checkpointsRoot(runDir), `global_step_${step}`);
}

async function syncPath(p: string): Promise<void> {
  const fh = await fs.open(p, 'r');
  try {
    await fh.sync();
  } catch {
    /* directory fsync unsupported here */
  } finally {
    await fh.close();
  }
}

async function linkFiles(fromDir: string, toDir: string, files: string[]): Promise<void> {
  await fs.mkdir(toDir, { recursive: true });
  for (const f of files) {
    const src = join(fromDir, f);
    if (!existsSync(src)) continue;
    try {
      await fs.link(src, join(toDir, f));
    } catch (e) {
      if (!['EXDEV', 'EPERM', 'ENOTSUP', 'EMLINK'].includes((e as NodeJS.ErrnoException).code ?? '')) throw e;
      await fs.copyFile(src, join(toDir, f));
      await syncPath(join(toDir, f));
    }
  }
  await syncPath(toDir);
}

/**
 * Builds checkpoints/global_step_<step> from the policy directories `actorDir` (the weights, and
 * the AdamW state when it holds it) and `referenceDir` (the initial policy), and `optimizers`: the
 * directories whose optimizer.safetensors joins actor/ (and critic/) when the version directories
 * hold weights only. Temporary name, fsync, rename. Returns its path. `known`: the sha256 of linked
 * files as recorded when they were written ("actor/model.safetensors" → sha256), which
 * trainer_state.json's files_sha256 takes instead of reading those files back; the others are read.
 */
export async function writeCheckpointDir(
  runDir: string,
  state: TrainerState,
  actorDir: string,
  referenceDir: string,
  criticDir: string | null = null,
  optimizers: { actor: string; critic: string | null } | null = null,
  known: Readonly<Record<string, string>> = {},
): Promise<string> {
  const root = checkpointsRoot(runDir);
  await fs.mkdir(root, { recursive: true });
  const dir = checkpointDir(runDir, state.step);
  const tmp = join(root, `.global_step_${state.step}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  await fs.mkdir(tmp);
  try {
    await linkFiles(actorDir, join(tmp, 'actor'), MODEL_FILES);
    if (optimizers) await linkFiles(optimizers.actor, join(tmp, 'actor'), [OPTIMIZER_FILE]);
    crashPoint('checkpoint:half-written');
    await linkFiles(
      referenceDir,
      join(tmp, 'reference'),
      MODEL_FILES.filter((f) => f !== 'optimizer.safetensors'),
    );
    if (criticDir) await linkFiles(criticDir, join(tmp, 'critic'), MODEL_FILES);
    if (criticDir && optimizers?.critic) await linkFiles(optimizers.critic, join(tmp, 'critic'), [OPTIMIZER_FILE]);
    const files_sha256: Record<string, string> = {};
    for (const sub of ['actor', 'reference', 'critic']) {
      if (!existsSync(join(tmp, sub))) continue;
      for (const f of (await fs.readdir(join(tmp, sub))).sort())
        files_sha256[`${sub}/${f}`] = known[`${sub}/${f}`] ?? (await sha256File(join(tmp, sub, f)));
    }
    try {
      const fh = await fs.open(join(tmp, TRAINER_STATE_FILE), 'w');
      try {
        const full: TrainerState = { ...state, files_sha256 };
        delete full.state_sha256;
        await fh.writeFile(JSON.stringify({ ...full, state_sha256: trainerStateSha256(full) }, null, 2) + '\n');
        await fh.sync();
      } finally {
        await fh.close();
      }
    } catch (e) {
      throw withStoragePath(e, join(tmp, TRAINER_STATE_FILE));
    }
    await syncPath(tmp);
    let old: string | null = null;
    if (existsSync(dir)) {
      old = `${tmp}.old`;
      await fs.rename(dir, old);
    }
    await fs.rename(tmp, dir);
    await syncPath(root);
    if (old) await fs.rm(old, { recursive: true, force: true });
  } catch (e) {
    await fs.rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw e;
  }
  crashPoint('checkpoint:renamed');
  return dir;
}

/** Steps of the complete checkpoints in run_dir (temporary names are not checkpoints). */
export async function listCheckpointSteps(runDir: string): Promise<number[]> {
  let names: string[];
  try {
    names = await fs.readdir(checkpointsRoot(runDir));
  } catch {
    return [];
  }
  return names
    .map((n) => /^global_step_(\d+)$/.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => a - b);
}

export async function removeCheckpointDir(runDir: string, step: number): Promise<void> {
  await fs.rm(checkpointDir(runDir, step), { recursive: true, force: true });
}

/**
 * Removes what interrupted writes left behind: `.global_step_*.tmp-*` in checkpoints/ and
 * `.v*.tmp-*` in the directory of every stored kind (policy/, critic/, ema/, optimizer/,
 * critic-optimizer/). Only the single writer (the update stage) calls this, at its start.
 */
export async function removeTempCheckpoints(runDir: string): Promise<string[]> {
  const removed: string[] = [];
  for (const sub of ['checkpoints', ...ARTIFACT_KINDS]) {
    let names: string[];
    try {
      names = await fs.readdir(join(runDir, sub));
    } catch {
      continue;
    }
    for (const n of names) {
      if (!/^\.(global_step_\d+|v\d+)\.tmp-/.test(n)) continue;
      await fs.rm(join(runDir, sub, n), { recursive: true, force: true });
      removed.push(join(sub, n));
    }
  }
  return removed;
}

export interface LoadedCheckpointPath {
  /** Directory with model.safetensors (+ optimizer.safetensors) to start the policy from. */
  actorDir: string;
  /** The source run's initial policy (KL reference), when the checkpoint carries it. */
  referenceDir: string | null;
  /** trainer_state.json of an rlstream checkpoint; null for a plain model directory. */
  state: TrainerState | null;
  /**
   * The value model (+ its AdamW state) at the checkpoint's step: its critic/ directory, or for a
   * checkpoint written before checkpoints carried one, the source run's
   * <run_dir>/critic/vNNNNNN next to its checkpoints/; null when the checkpoint has no critic.
   */
  criticDir: string | null;
}

/**
 * Reads `trainer.load_checkpoint_path`: an rlstream checkpoint directory (global_step_N with
 * actor/, reference/ and trainer_state.json) or a plain model directory (model.safetensors +
 * config.json, optionally optimizer.safetensors).
 */
export function readCheckpointPath(path: string): LoadedCheckpointPath {
  const dir = resolve(path);
  if (!existsSync(dir) || !statSync(dir).isDirectory())
    throw new ConfigError(
      `trainer.load_checkpoint_path: ${dir} is not a directory; give a checkpoint directory such as <run_dir>/checkpoints/global_step_40`,
    );
  const stateFile = join(dir, TRAINER_STATE_FILE);
  if (existsSync(stateFile)) {
    let state: TrainerState;
    try {
      state = JSON.parse(readFileSync(stateFile, 'utf8')) as TrainerState;
    } catch (e) {
      throw new ConfigError(`trainer.load_checkpoint_path: ${stateFile} is not valid JSON (${(e as Error).message})`);
    }
    if (state.format !== TRAINER_STATE_FORMAT || !Number.isInteger(state.step) || !state.dataset_position) {
      throw new ConfigError(
        `trainer.load_checkpoint_path: ${stateFile} is not an rlstream trainer state (format ${JSON.stringify(state.format)}, expected ${TRAINER_STATE_FORMAT})`,
      );
    }
    if (state.state_sha256 !== undefined && trainerStateSha256(state) !== state.state_sha256)
      throw new ConfigError(
        `trainer.load_checkpoint_path: ${stateFile} has sha256 ${trainerStateSha256(state)} over its fields, but ${state.state_sha256} was recorded in it when it was written — the file was edited or is damaged; use an earlier checkpoint (another global_step_N) as trainer.load_checkpoint_path`,
      );
    const actorDir = join(dir, 'actor');
    // a LoRA run's actor/ is a PEFT adapter (adapter_model.safetensors)
    const weightsFile = existsSync(join(actorDir, 'adapter_config.json'))
      ? 'adapter_model.safetensors'
      : 'model.safetensors';
    if (!existsSync(join(actorDir, weightsFile)))
      throw new ConfigError(
        `trainer.load_checkpoint_path: ${actorDir}/${weightsFile} is missing; the checkpoint is incomplete`,
      );
    const referenceDir = existsSync(join(dir, 'reference', 'model.safetensors')) ? join(dir, 'reference') : null;
    const sibling = join(dir, '..', '..', 'critic', `v${String(state.step).padStart(6, '0')}`);
    const criticDir = existsSync(join(dir, 'critic', 'model.safetensors'))
      ? join(dir, 'critic')
      : basename(dirname(dir)) === 'checkpoints' && existsSync(join(sibling, 'model.safetensors'))
        ? resolve(sibling)
        : null;
    return { actorDir, referenceDir, state, criticDir };
  }
  if (existsSync(join(dir, 'model.safetensors')) || existsSync(join(dir, 'model.safetensors.index.json')))
    return { actorDir: dir, referenceDir: null, state: null, criticDir: null };
  throw new ConfigError(
    `trainer.load_checkpoint_path: ${dir} has neither ${TRAINER_STATE_FILE} (an rlstream checkpoint, <run_dir>/checkpoints/global_step_N) nor model.safetensors / model.safetensors.index.json (a model directory)`,
  );
}

/**
 * The step a run started from `trainer.load_checkpoint_path` begins after (0 without one), and
 * a check that the dataset position carries over: same training-set size, batch size, seed and
 * shuffling as when the checkpoint was taken.
 */
export function startStepFromCheckpoint(
  path: string | null,
  plan: Pick<ControllerPlan, 'trainSize' | 'rolloutBatchSize' | 'shuffle' | 'seed'>,
): { step: number; state: TrainerState | null } {
  if (!path) return { step: 0, state: null };
  const { state } = readCheckpointPath(path);
  if (!state) return { step: 0, state: null };
  const was = state.dataset_position;
  const now = datasetPosition(plan, state.step);
  const diff = (['train_size', 'rollout_batch_size', 'shuffle', 'seed'] as const).filter((k) => was[k] !== now[k]);
  if (diff.length) {
    throw new ConfigError(
      `trainer.load_checkpoint_path: the checkpoint at step ${state.step} was taken with ${diff.map((k) => `${k} = ${String(was[k])}`).join(', ')}, but this run has ${diff.map((k) => `${k} = ${String(now[k])}`).join(', ')}; its dataset position (${describePosition(was)}) cannot carry over — use the same data settings (data.task_size.train / data.train_files, data.rollout_batch_size, data.seed, data.shuffle)`,
    );
  }
  return { step: state.step, state };
}

/**
 * Before a run starts from checkpoint `dir`: every file trainer_state.json records a sha256 for
 * (actor/, reference/, critic/; older checkpoints: actor/model.safetensors) still has it. A
 * mismatch names the file and both hashes and says what to do.
 */
export async function verifyCheckpointFiles(dir: string, state: TrainerState): Promise<void> {
  const want = state.files_sha256 ?? (state.sha256 ? { 'actor/model.safetensors': state.sha256 } : {});
  for (const [rel, sha] of Object.entries(want)) {
    const file = join(dir, rel);
    if (!existsSync(file))
      throw new ConfigError(
        `trainer.load_checkpoint_path: ${file} is missing, but ${join(dir, TRAINER_STATE_FILE)} records it (sha256 ${sha}) — the checkpoint is damaged; use an earlier checkpoint (another global_step_N) as trainer.load_checkpoint_path`,
      );
    const found = await sha256File(file);
    if (found !== sha)
      throw new ConfigError(
        `trainer.load_checkpoint_path: ${file} has sha256 ${found}, but ${sha} was recorded in ${join(dir, TRAINER_STATE_FILE)} — the checkpoint is damaged; use an earlier checkpoint (another global_step_N) as trainer.load_checkpoint_path`,
      );
  }
}
