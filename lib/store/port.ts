/**
 * The store port: runs, trajectories, step metrics, checkpoints, validation generations and dead
 * letters, in the tables of migrations/20261121_0001_core.sql. Two adapters implement it over one
 * Kysely handle: PGlite in a run directory (lib/store/pglite-store.ts) and a real PostgreSQL
 * (lib/store/postgres-store.ts); test/support/store-contract.ts is the one contract both pass.
 *
 * Rules every adapter keeps:
 *  - Every write takes an optional transaction (`opts.tx`, a Kysely transaction on the same
 *    database handle) so a stage can commit its store writes, its outputs and its consumed offsets
 *    atomically. Without `tx` the adapter uses its own transaction. Inside a transaction always
 *    pass `tx`: on PGlite the single connection is held by that transaction, so a write without
 *    it waits for the transaction to end.
 *  - Every write is idempotent by primary key: re-delivery after a crash writes the same rows again
 *    and produces no duplicates and no error.
 *  - Trajectories are write-once: the advantage stage writes each row once, when it is complete
 *    (tokens, log-probs, reward, advantages). There is no update path; a second write of the same
 *    (run_id, id) is counted as a duplicate and ignored (first write wins).
 *  - A failed reward is stored as reward NULL plus `rewardFailure`, never as a made-up 0.
 */
import type { Tx } from '../db/database.ts';
import type { Episode } from '../contracts/types.ts';

export type { Tx };

export type RunStatus = 'running' | 'completed' | 'failed' | 'stopped';
export const RUN_STATUSES: readonly RunStatus[] = ['running', 'completed', 'failed', 'stopped'];

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
export type JsonObject = { [k: string]: Json };

/** Per-token numbers: plain arrays or typed arrays straight from ONNX outputs. */
export type NumberArray = ArrayLike<number>;

export interface WriteOptions {
  /** Run the write inside this transaction (same database handle). */
  tx?: Tx;
}

export interface ReadOptions {
  /** Read inside this transaction (same database handle): it sees the transaction's own writes. */
  tx?: Tx;
}

export interface NewRun {
  runId: string;
  project: string;
  experiment: string;
  /** Resolved run config, secrets already redacted by the caller. */
  config: JsonObject;
  /** Default 'running'. */
  status?: RunStatus;
  /** The run this one replays or forks. */
  parentRunId?: string | null;
}

export interface RunRow {
  runId: string;
  project: string;
  experiment: string;
  config: JsonObject;
  status: RunStatus;
  parentRunId: string | null;
  summary: JsonObject | null;
  createdAt: Date;
  updatedAt: Date;
}

export interface RunFilter {
  project?: string;
  experiment?: string;
  status?: RunStatus;
}

/** One complete sampled response, as the advantage stage writes it. */
export interface TrajectoryRow {
  /** Deterministic sample id; (runId, id) is the primary key. */
  id: string;
  runId: string;
  step: number;
  epoch: number;
  kind: 'train' | 'val';
  /** Responses to the same prompt share it (the GRPO group). */
  groupUid: string;
  promptIndex: number;
  sampleIndex: number;
  policyVersion: number;
  /** int32 token ids. */
  promptTokens: NumberArray;
  responseTokens: NumberArray;
  promptText: string;
  responseText: string;
  groundTruth: string | null;
  /** Per response token (same length as responseTokens); stored as real (float32). NaN/±Infinity round-trip. */
  behaviourLogprobs: NumberArray;
  refLogprobs: NumberArray | null;
  oldLogprobs?: NumberArray | null;
  /** Per response token. */
  advantages: NumberArray | null;
  /** Sequence-level summary of `advantages` (e.g. the value broadcast by an outcome estimator). */
  advantage: number | null;
  returns?: NumberArray | null;
  /** Finite, or null when scoring failed — then `rewardFailure` says why. */
  reward: number | null;
  rewardDetails: JsonObject | null;
  rewardFailure: string | null;
  finishReason: string | null;
  filtered: boolean;
  /** Required when filtered, null otherwise. */
  filterReason: string | null;
  staleness: number;
  /** Hashes of the prompt's images (prompt_images.hash, in prompt order); absent or [] for a text prompt. */
  imageHashes?: readonly string[];
  /** VPPO (algorithm.vppo.enable): per response token, the log-prob with the prompt image perturbed; absent/null without VPPO. */
  vppoPerturbedLogprobs?: NumberArray | null;
  /** VPPO: per response token, whether its gradient was kept (booleans, or 0/1 numbers). */
  vppoTokenMask?: readonly boolean[] | Uint8Array | null;
  /** VPPO: α, the factor multiplied into the trajectory's advantages (finite, ≥ 0). */
  vppoScalingFactor?: number | null;
  /** VPPO with enable_entropy_filtering: per response token, the real-image entropy the entropy mask ranked. */
  vppoEntropies?: NumberArray | null;
  /** Image policies: the hash of the image the sample generated (prompt_images.hash); absent/null otherwise. */
  generatedImageHash?: string | null;
}

/** A trajectory as read back: arrays as plain number[], plus the derived and server-set columns. */
export interface StoredTrajectory extends Omit<
  TrajectoryRow,
  | 'promptTokens'
  | 'responseTokens'
  | 'behaviourLogprobs'
  | 'refLogprobs'
  | 'oldLogprobs'
  | 'advantages'
  | 'returns'
  | 'vppoPerturbedLogprobs'
  | 'vppoTokenMask'
  | 'vppoScalingFactor'
  | 'vppoEntropies'
> {
  promptTokens: number[];
  responseTokens: number[];
  behaviourLogprobs: number[];
  refLogprobs: number[] | null;
  oldLogprobs: number[] | null;
  advantages: number[] | null;
  returns: number[] | null;
  /** cardinality(response_tokens), set by the store. */
  responseLength: number;
  imageHashes: string[];
  vppoPerturbedLogprobs: number[] | null;
  vppoTokenMask: boolean[] | null;
  vppoScalingFactor: number | null;
  vppoEntropies: number[] | null;
  generatedImageHash: string | null;
  createdAt: Date;
}

export interface TrajectoryFilter {
  step?: number;
  kind?: 'train' | 'val';
  filtered?: boolean;
  /** Only these ids (getTrajectories only). */
  ids?: readonly string[];
}

export interface InsertResult {
  inserted: number;
  /** Rows whose (runId, id) was already stored (or repeated in the same call): ignored. */
  duplicates: number;
}

/**
 * How the partials of one metric written by several writers (replicas of a stage) combine when
 * read (migrations/20261122_0005_metric_parts.sql): counters `sum`, times `max`, rates `mean`
 * weighted by `weight`, single-writer values `last`.
 */
export type MetricAgg = 'sum' | 'max' | 'min' | 'mean' | 'last';
export const METRIC_AGGS: readonly MetricAgg[] = ['sum', 'max', 'min', 'mean', 'last'];

export interface MetricRow {
  runId: string;
  step: number;
  /** Stable name such as 'actor/pg_loss' or 'reward/mean'. */
  name: string;
  /** NaN and ±Infinity are stored as such (a NaN loss is information). */
  value: number;
  stage?: string | null;
  /** The writer's replica within its stage ('' or absent: the only one). Partials are kept per (stage, replica). */
  replica?: string;
  /** How this partial combines with other writers' partials of the same metric (default 'last'). */
  agg?: MetricAgg;
  /** Weight of this partial in an agg = 'mean' combination (default 1, must be ≥ 0). */
  weight?: number;
  /**
   * Add `value` to this writer's stored partial instead of replacing it (a counter's increment
   * since the last write), so the stored total survives a restart of the writer.
   */
  increment?: boolean;
}

export interface StoredMetric {
  runId: string;
  step: number;
  name: string;
  /** The combination of every writer's partial (see MetricAgg). */
  value: number;
  /** The writers' stages, comma-separated when several wrote the metric; null when none was given. */
  stage: string | null;
  /** How many (stage, replica) partials were combined. */
  parts: number;
  createdAt: Date;
}

export interface CheckpointRow {
  runId: string;
  step: number;
  path: string;
  /** Lower-case hex SHA-256 of the checkpoint file. */
  sha256: string;
  policyVersion: number;
  /** Next offset to consume per topic/partition, e.g. { "rollouts/0": 1234 }. */
  consumedOffsets: JsonObject;
  datasetPosition?: Json;
  rngState?: Json;
  klCtlState?: Json;
  lrState?: Json;
}

export interface StoredCheckpoint extends Required<CheckpointRow> {
  createdAt: Date;
}

export interface ValGenerationRow {
  runId: string;
  step: number;
  idx: number;
  prompt: string;
  response: string;
  groundTruth: string | null;
  /** Finite, or null with `rewardFailure`. */
  reward: number | null;
  rewardFailure: string | null;
}

/** A multi-turn episode with its turns (trajectories.v3 `episode`), stored by the rollout stage. */
export interface EpisodeRow {
  runId: string;
  /** The trajectory sample id. */
  trajectoryId: string;
  step: number;
  kind: 'train' | 'val';
  policyVersion: number;
  responseTokens: number;
  episode: Episode;
}

export interface StoredValGeneration extends ValGenerationRow {
  createdAt: Date;
}

/** One distinct image of a run (a prompt's normalised PNG, or one an image policy generated), stored once. */
export interface PromptImageRow {
  runId: string;
  /** Lower-case hex sha256 of `png`. */
  hash: string;
  width: number;
  height: number;
  png: Uint8Array;
}

export interface StoredPromptImage extends Omit<PromptImageRow, 'png'> {
  png: Buffer;
  createdAt: Date;
}

export interface DeadLetterRow {
  stage: string;
  topic: string;
  partition: number;
  offset: number;
  /** Null when the message could not be attributed to a run (undecodable). */
  runId: string | null;
  reason: string;
  errorCode?: string | null;
  payload: Uint8Array | null;
}

export interface StoredDeadLetter extends Omit<DeadLetterRow, 'payload' | 'errorCode'> {
  errorCode: string | null;
  payload: Buffer | null;
  createdAt: Date;
}

export interface DeadLetterFilter {
  runId?: string;
  stage?: string;
  topic?: string;
}

export interface Store {
  readonly kind: 'pglite' | 'postgres';
  /** Human-readable location (no password). */
  readonly where: string;

  /** Insert, or on a second call (resume) update project, experiment, config, parent and status. */
  upsertRun(run: NewRun, opts?: WriteOptions): Promise<RunRow>;
  getRun(runId: string): Promise<RunRow | undefined>;
  /** Newest first. */
  listRuns(filter?: RunFilter): Promise<RunRow[]>;
  /** Throws (not retriable) when the run does not exist. `summary` replaces the stored one when given. */
  setRunStatus(runId: string, status: RunStatus, summary?: JsonObject, opts?: WriteOptions): Promise<RunRow>;

  /** Write-once, idempotent by (runId, id). Validates every row before writing any. */
  insertTrajectories(rows: readonly TrajectoryRow[], opts?: WriteOptions): Promise<InsertResult>;
  getTrajectories(runId: string, filter?: TrajectoryFilter): Promise<StoredTrajectory[]>;
  countTrajectories(runId: string, filter?: Omit<TrajectoryFilter, 'ids'>): Promise<number>;

  /**
   * Upserts each writer's partial by (runId, step, name, stage, replica): the last write wins, or
   * with `increment` the value is added to the stored partial. Rows repeated in one call: last
   * wins (increments add up).
   */
  insertMetrics(rows: readonly MetricRow[], opts?: WriteOptions): Promise<void>;
  /** One row per (step, name), the partials combined (see MetricAgg). Ordered by name, then step. */
  getMetrics(runId: string, names?: readonly string[]): Promise<StoredMetric[]>;

  /** Upsert by (runId, step): a re-written checkpoint file replaces the row. */
  recordCheckpoint(row: CheckpointRow, opts?: WriteOptions): Promise<void>;
  latestCheckpoint(runId: string): Promise<StoredCheckpoint | undefined>;
  /** Ascending step. */
  listCheckpoints(runId: string, opts?: ReadOptions): Promise<StoredCheckpoint[]>;

  /** Write-once by (runId, step, idx). */
  recordValGenerations(rows: readonly ValGenerationRow[], opts?: WriteOptions): Promise<void>;
  getValGenerations(runId: string, step?: number): Promise<StoredValGeneration[]>;

  /** Multi-turn episodes and their turns (idempotent by run and trajectory id). */
  insertEpisodes(rows: readonly EpisodeRow[], opts?: WriteOptions): Promise<void>;
  /** A run's episodes (optionally one step's), with their turns in order. */
  getEpisodes(runId: string, step?: number): Promise<EpisodeRow[]>;

  /**
   * Write-once by (runId, hash): an image already stored is left as it is (same hash, same bytes).
   * Validates every row first (hash format, hash = sha256(png), positive size). Returns how many were new.
   */
  insertPromptImages(rows: readonly PromptImageRow[], opts?: WriteOptions): Promise<number>;
  /** The run's images by hash (all of them when `hashes` is absent), ordered by hash. */
  getPromptImages(runId: string, hashes?: readonly string[]): Promise<StoredPromptImage[]>;

  /** Write-once by (stage, topic, partition, offset). A NUL character in `reason` is stored as the text \u0000. */
  recordDeadLetter(row: DeadLetterRow, opts?: WriteOptions): Promise<void>;
  listDeadLetters(filter?: DeadLetterFilter): Promise<StoredDeadLetter[]>;

  /** Closes the database handle when the store opened it (openStore); otherwise only this store. */
  close(): Promise<void>;
}
