/**
 * TypeScript types of the topic records, one per `schemas/<topic>.v1.avsc`. Field names are the
 * Avro field names (snake_case) so a decoded record is used as is. `lib/contracts/type-assertions.ts`
 * proves at compile time that each type is mutually assignable with the type generated from the
 * `.avsc` (`lib/contracts/generated.ts`, kept fresh by `scripts/check-schema-types.ts`).
 *
 * Packed arrays: token ids are `Int32Array`, per-token floats `Float32Array` (Avro `bytes`,
 * little-endian). Decoded typed arrays own their memory.
 */
import type { Kind } from './ids.ts';

export type { Kind } from './ids.ts';

/** The identity every record carries. */
export interface RecordHeader {
  /** Run this record belongs to. */
  run_id: string;
  /** Deterministic id (lib/contracts/ids.ts); duplicates are recognised by it. */
  id: string;
  /** Training step (1-based); for kind = val the validation round (= the policy version evaluated). */
  step: number;
  /** Policy version (see each record for which one). */
  policy_version: number;
}

// ------------------------------------------------------------------------------------------
// prompts.v1 — controller → rollout

/** Sampling settings for every group of a prompt batch. */
export interface SamplingParams {
  /** Temperature (0 = greedy). */
  temperature: number;
  /** Nucleus threshold (1 = off). */
  top_p: number;
  /** Top-k (-1 = off). */
  top_k: number;
  /** Longest response in tokens. */
  max_new_tokens: number;
}

/** What the pipeline knows about a prompt (carried from the controller to the update). */
export interface PromptFields {
  /** Slot of the prompt within its step (refills continue after rollout_batch_size). */
  prompt_index: number;
  /** Row index in the dataset split. */
  dataset_index: number;
  /** Prompt token ids (after the chat template). */
  prompt_ids: Int32Array;
  /** Prompt text as tokenized. */
  prompt_text: string;
  /** Images of a multimodal prompt (encoded files); empty for text. */
  images: Buffer[];
  /** Dataset or task name. */
  data_source: string;
  /** Reference answer passed to the reward. */
  ground_truth: string;
  /** Extra per-row data for the reward: a JSON object as text ("{}" when none). */
  extra_info: string;
}

/** Identity and size of one prompt image (prompts.v2). */
export interface ImageRef {
  /** Lower-case hex sha256 of the image's PNG bytes: its key in prompt_images and trajectories.image_hashes. */
  hash: string;
  /** Pixels, after resizing to the patch grid. */
  width: number;
  height: number;
}

/** One prompt to sample `n` responses for. */
export interface PromptGroup extends PromptFields {
  /** Deterministic group id (groupId / valGroupId). */
  id: string;
  /** hashId(id): message key and seed source. */
  group_uid: string;
  /** Responses to sample (the group size). */
  n: number;
  /** One per image, in the order of `images` (prompts.v2; v1 records read with []). */
  image_refs: ImageRef[];
}

/** Topic `prompts`: prompt groups of one step (usually one group). policy_version = the version to sample with (at least). */
export interface PromptBatch extends RecordHeader {
  kind: Kind;
  /** Dataset epoch (0-based; 0 for val). */
  epoch: number;
  /** 0 = the step's first draw, t ≥ 1 = the t-th refill. */
  attempt: number;
  sampling: SamplingParams;
  /** At least one group, all of this step. */
  groups: PromptGroup[];
}

// ------------------------------------------------------------------------------------------
// trajectories.v4 — rollout → reward

/** The group-level fields of trajectories, scored and updates records. policy_version = the behaviour policy. */
export interface GroupHeader extends RecordHeader, PromptFields {
  /** hashId(id): message key and seed source. */
  group_uid: string;
  kind: Kind;
  /** Dataset epoch (0-based; 0 for val). */
  epoch: number;
  /** 0 = the step's first draw, t ≥ 1 = the t-th refill. */
  attempt: number;
}

export type FinishReason = 'stop' | 'length' | 'abort';

/** One sampled response. */
export interface TrajectorySample {
  /** Deterministic sample id: <group id>/n<sample_index>. */
  id: string;
  /** 0..n-1 within the group. */
  sample_index: number;
  /** The group's prompt_index. */
  prompt_index: number;
  /** Generated token ids (without the prompt). */
  response_ids: Int32Array;
  response_text: string;
  /** Log-prob of each response token under the behaviour policy; same length as response_ids. */
  behaviour_logprobs: Float32Array;
  /** One byte per response token: 1 = policy token, 0 = tool/environment token. Empty = all 1. */
  response_mask: Buffer;
  finish_reason: FinishReason;
  /** Multi-turn episodes (trajectories.v3): the episode's messages and outcome; null for single-turn samples. */
  episode: Episode | null;
  /** Image policies (trajectories.v4): the generated image and its denoising trajectory; null for language policies. */
  generated: GeneratedImage | null;
}

/**
 * An image policy's sample (trajectories.v4, scored.v4, updates.v3). response_ids index its
 * stochastic (SDE) steps and behaviour_logprobs hold each one's log-probability.
 */
export interface GeneratedImage {
  /** The generated image, PNG: what the reward scores as the sample's image. */
  png: Buffer;
  /** Lower-case hex sha256 of png (the prompt_images key). */
  hash: string;
  /** Time grid 1 = t_0 > … > t_K = 0 (K + 1 values). */
  timesteps: Float32Array;
  /** σ_t of each of the K steps; 0 for a deterministic step. */
  sigmas: Float32Array;
  /** x_{t_0}, …, x_{t_K}, flat [K + 1, C, S, S]. */
  latents: Float32Array;
}

/** One message of a multi-turn episode (trajectories.v3); start/end index response_ids. */
export interface EpisodeTurn {
  role: string;
  start: number;
  end: number;
  text: string;
  tool_name: string | null;
  arguments: string | null;
  latency_ms: number;
  error: string | null;
  reward: number;
}

/** A multi-turn episode (trajectories.v3). */
export interface Episode {
  turns: EpisodeTurn[];
  assistant_turns: number;
  /** Σ_t gamma^t r_t over the assistant turns. */
  reward: number;
  done: boolean;
  /** Why the episode failed (the sample then gets no reward, never 0); null when it did not. */
  failure: string | null;
  timed_out: boolean;
  tool_calls: number;
  tool_errors: number;
  metrics: Record<string, number>;
}

/** Topic `trajectories`: a prompt group with its n samples. */
export interface TrajectoryGroup extends GroupHeader {
  samples: TrajectorySample[];
  /**
   * remax (trajectories.v2): the greedy (temperature 0) response of the same policy version,
   * sample_index = n; its reward is the group's baseline and it is never trained on. null otherwise.
   */
  baseline: TrajectorySample | null;
}

// ------------------------------------------------------------------------------------------
// scored.v4 — reward → advantage (and → controller on topic `validation`)

/** Why a sample could not be scored. */
export interface ScoreFailure {
  /** Error code, e.g. ERR_REWARD_FN, ERR_TIMEOUT. */
  code: string;
  message: string;
  retriable: boolean;
  attempts: number;
}

/** The reward of one sample: exactly one of `reward` and `failure` is non-null. */
export interface SampleScore {
  /** Scalar reward; null when scoring failed. A failure is never a zero reward. */
  reward: number | null;
  /** Components reported by the reward (accuracy, format, ...). */
  reward_details: Record<string, number>;
  failure: ScoreFailure | null;
}

export interface ScoredSample extends Omit<TrajectorySample, 'episode'>, SampleScore {
  /** Non-numeric components (scored.v3; e.g. the extracted answer), each ≤ 4096 characters; {} in older records. */
  reward_text: Record<string, string>;
}

/** Topics `scored` (kind = train) and `validation` (kind = val). */
export interface ScoredGroup extends GroupHeader {
  /** Reward that scored the group (fn:<name>, http:<name>, onnx:<name>). */
  reward_fn: string;
  samples: ScoredSample[];
  /** remax (scored.v2): the scored greedy response (see TrajectoryGroup.baseline); null otherwise. */
  baseline: ScoredSample | null;
}

// ------------------------------------------------------------------------------------------
// updates.v3 — advantage → update (v2 adds the sample field vppo, v3 generated)

/** Per-token training inputs of a sample (all the length of response_ids unless stated). */
export interface TokenTargets {
  advantages: Float32Array;
  /** Value targets. */
  returns: Float32Array;
  /** Reference-policy log-probs; empty when no reference is used. */
  ref_logprobs: Float32Array;
  /** Critic values; empty without a critic. */
  values: Float32Array;
  /** Weight of each token in the policy loss (0 = masked out). */
  loss_weights: Float32Array;
}

/** VPPO's token mask and trajectory scaling of one sample (updates.v2; lib/rl/vppo-stage.ts). */
export interface VppoTokens {
  /** Log-prob of each response token with the prompt image perturbed. */
  perturbed_logprobs: Float32Array;
  /** One byte per response token: 1 = its gradient is kept. */
  token_mask: Buffer;
  /** α: multiplied into the advantages by the update (finite, ≥ 0). */
  scaling_factor: number;
}

/** An update sample carries the numeric reward details only (updates.v1 has no reward_text: the advantage stage stored it). */
export interface UpdateSample extends Omit<ScoredSample, 'reward_text'>, TokenTargets {
  /** VPPO's data for the sample (updates.v2); null when algorithm.vppo.enable is off (and in v1 records). */
  vppo: VppoTokens | null;
}

/** Topic `updates`: a scored group ready for the policy update, or filtered out (kept for accounting). */
export interface UpdateGroup extends GroupHeader {
  reward_fn: string;
  /** algorithm.adv_estimator (grpo, gae, rloo, ...). */
  estimator: string;
  /** true: dropped by online filtering — never train on it. */
  filtered: boolean;
  /** Why it was filtered; null when filtered = false. */
  filter_reason: string | null;
  /** Mean / std of the rewards of the scored samples; null when none was scored. */
  reward_mean: number | null;
  reward_std: number | null;
  samples: UpdateSample[];
}

// ------------------------------------------------------------------------------------------
// policy.v1 — update → all

/** Where the update stage stood on one input partition. */
export interface ConsumedOffset {
  topic: string;
  partition: number;
  /** Next offset to read. */
  next_offset: number;
}

/** Topic `policy`: a new policy version (v0 = initial weights). step = the step that produced it (0 for v0). */
export interface PolicyVersion extends RecordHeader {
  /** Version the update started from; null for v0. */
  parent_version: number | null;
  checkpoint_path: string;
  /** sha256 of the checkpoint, 64 lowercase hex chars. */
  sha256: string;
  /** onnx, safetensors, ... */
  format: string;
  size_bytes: number;
  /** Unix epoch ms. */
  created_ms: number;
  /** Input offsets this version reflects. */
  consumed: ConsumedOffset[];
  groups: number;
  samples: number;
  tokens: number;
}

// ------------------------------------------------------------------------------------------
// metrics.v1 — any stage → store

/** Topic `metrics`: named metrics of one stage for one step or validation round. */
export interface MetricsRecord extends RecordHeader {
  kind: Kind;
  /** controller, rollout, reward, advantage, update, ... */
  stage: string;
  /** Instance of the stage ("" when there is one). */
  replica: string;
  /** Stable metric name (reward/mean, actor/pg_loss) → value. */
  values: Record<string, number>;
  /** Phase name → duration in ms. */
  timing_ms: Record<string, number>;
  /** Unix epoch ms. */
  time_ms: number;
}

// ------------------------------------------------------------------------------------------
// control.v1 — controller → all (lifecycle), advantage → controller (refills)

export interface RunStarted {
  /** Resolved config, JSON text, secrets redacted. */
  config_json: string;
  config_sha256: string;
  seed: number;
  total_steps: number;
  steps_per_epoch: number;
  /** Run id this run replays or resumes; null for a fresh run. */
  resumed_from: string | null;
}
export interface EpochStarted {
  epoch: number;
  first_step: number;
}
/** Online filtering dropped groups of step (the record's step): ask for `needed` more. */
export interface RefillRequest {
  /** 1-based number of this request for the step. */
  request: number;
  needed: number;
  filtered_group_ids: string[];
  reason: string;
}
export interface ValRoundDone {
  round: number;
  groups: number;
  samples: number;
  failures: number;
}
export interface RunDone {
  final_version: number;
  steps: number;
}
export interface RunFailed {
  stage: string;
  code: string;
  message: string;
}

export type ControlType =
  'run_started' | 'epoch_started' | 'refill_request' | 'val_round_done' | 'run_done' | 'run_failed';

/** Payload record of each control type. */
export interface ControlPayloads {
  run_started: RunStarted;
  epoch_started: EpochStarted;
  refill_request: RefillRequest;
  val_round_done: ValRoundDone;
  run_done: RunDone;
  run_failed: RunFailed;
}

/** The control event of one type: its payload field set, every other payload null. */
export type ControlEventOf<T extends ControlType> = RecordHeader & { type: T; time_ms: number } & {
  [K in ControlType]: K extends T ? ControlPayloads[K] : null;
};

/**
 * Topic `control`: a discriminated union on `type` (narrowing gives the payload). The codec
 * rejects a record whose set payload does not match its type.
 */
export type ControlEvent = { [T in ControlType]: ControlEventOf<T> }[ControlType];

// ------------------------------------------------------------------------------------------
// deadletter.v1 — any → deadletter

/** Topic `deadletter`: a message a stage gave up on, byte for byte, with why. */
export interface DeadLetter {
  run_id: string;
  /** deadLetterId(run, stage, topic, partition, offset). */
  id: string;
  /** Step / version of the original record; null when it could not be decoded. */
  step: number | null;
  policy_version: number | null;
  stage: string;
  source_topic: string;
  source_partition: number;
  source_offset: number;
  key: Buffer | null;
  /** Original headers (rl-schema tells how to decode payload). */
  headers: Record<string, Buffer>;
  /** Original value, unchanged; null for a tombstone. */
  payload: Buffer | null;
  /** Writer schema when known (trajectories.v1, confluent:42). */
  schema: string | null;
  reason: string;
  error_code: string;
  retriable: boolean;
  attempts: number;
  /** Unix epoch ms. */
  time_ms: number;
}

/** Record type of each schema family. */
export interface SchemaValues {
  prompts: PromptBatch;
  trajectories: TrajectoryGroup;
  scored: ScoredGroup;
  updates: UpdateGroup;
  policy: PolicyVersion;
  metrics: MetricsRecord;
  control: ControlEvent;
  deadletter: DeadLetter;
}
