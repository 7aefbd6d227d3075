/**
 * Kysely row types for the tables of migrations/20261121_0001_core.sql, so the shared query code
 * is checked column by column. jsonb columns take JSON text on insert (see jsonParam) and come
 * back parsed; int8 comes back as a number (lib/db/database.ts sets the parser).
 */
import type { ColumnType, Generated } from 'kysely';
import type { Json, JsonObject, MetricAgg } from './port.ts';

type JsonColumn<T = Json> = ColumnType<T, string | null, string | null>;
/** Set by the server: never inserted by the app, updated with now(). */
type ServerTime = ColumnType<Date, never, Date>;

export interface RunsTable {
  run_id: string;
  project: string;
  experiment: string;
  config: ColumnType<JsonObject, string, string>;
  status: string;
  parent_run_id: string | null;
  summary: JsonColumn<JsonObject | null>;
  created_at: Generated<Date>;
  updated_at: ServerTime;
}

export interface TrajectoriesTable {
  run_id: string;
  id: string;
  step: number;
  epoch: number;
  kind: 'train' | 'val';
  group_uid: string;
  prompt_index: number;
  sample_index: number;
  policy_version: number;
  prompt_tokens: number[];
  response_tokens: number[];
  prompt_text: string;
  response_text: string;
  ground_truth: string | null;
  behaviour_logprobs: number[];
  ref_logprobs: number[] | null;
  old_logprobs: number[] | null;
  advantages: number[] | null;
  advantage: number | null;
  returns: number[] | null;
  reward: number | null;
  reward_details: JsonColumn<JsonObject | null>;
  reward_failure: string | null;
  response_length: number;
  finish_reason: string | null;
  filtered: boolean;
  filter_reason: string | null;
  staleness: number;
  image_hashes: ColumnType<string[], string[] | undefined, never>;
  vppo_perturbed_logprobs: number[] | null;
  vppo_token_mask: boolean[] | null;
  vppo_scaling_factor: number | null;
  vppo_entropies: number[] | null;
  generated_image_hash: string | null;
  created_at: Generated<Date>;
}

export interface PromptImagesTable {
  run_id: string;
  hash: string;
  width: number;
  height: number;
  png: Buffer;
  created_at: Generated<Date>;
}

/** The view combining every writer's partial (migrations/20261122_0005_metric_parts.sql); read only. */
export interface StepMetricsTable {
  run_id: string;
  step: number;
  name: string;
  value: number;
  stage: string | null;
  created_at: Date;
  parts: number;
}

/** One writer's (stage, replica) partial of a metric at a step. */
export interface StepMetricPartsTable {
  run_id: string;
  step: number;
  name: string;
  stage: Generated<string>;
  replica: Generated<string>;
  value: number;
  agg: Generated<MetricAgg>;
  weight: Generated<number>;
  created_at: Generated<Date>;
  updated_at: Generated<Date>;
}

export interface CheckpointsTable {
  run_id: string;
  step: number;
  path: string;
  sha256: string;
  policy_version: number;
  consumed_offsets: ColumnType<JsonObject, string, string>;
  dataset_position: JsonColumn;
  rng_state: JsonColumn;
  kl_ctl_state: JsonColumn;
  lr_state: JsonColumn;
  created_at: ServerTime;
}

export interface ValGenerationsTable {
  run_id: string;
  step: number;
  idx: number;
  prompt: string;
  response: string;
  ground_truth: string | null;
  reward: number | null;
  reward_failure: string | null;
  created_at: Generated<Date>;
}

export interface EpisodesTable {
  run_id: string;
  trajectory_id: string;
  step: number;
  kind: string;
  policy_version: number;
  assistant_turns: number;
  reward: number;
  done: boolean;
  failure: string | null;
  timed_out: boolean;
  tool_calls: number;
  tool_errors: number;
  response_tokens: number;
  created_at: Generated<Date>;
}

export interface EpisodeTurnsTable {
  run_id: string;
  trajectory_id: string;
  turn_index: number;
  role: string;
  token_start: number;
  token_end: number;
  text: string;
  tool_name: string | null;
  arguments: string | null;
  result_chars: number;
  latency_ms: number;
  error: string | null;
  reward: number;
}

export interface DeadLettersTable {
  stage: string;
  topic: string;
  partition: number;
  msg_offset: number;
  run_id: string | null;
  reason: string;
  error_code: string | null;
  payload: Buffer | null;
  created_at: Generated<Date>;
}

export interface StoreTables {
  runs: RunsTable;
  trajectories: TrajectoriesTable;
  step_metrics: StepMetricsTable;
  step_metric_parts: StepMetricPartsTable;
  checkpoints: CheckpointsTable;
  val_generations: ValGenerationsTable;
  episodes: EpisodesTable;
  episode_turns: EpisodeTurnsTable;
  dead_letters: DeadLettersTable;
  prompt_images: PromptImagesTable;
}
