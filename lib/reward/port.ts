/**
 * The reward backend port: how the reward stage turns trajectories into rewards (`reward.type`).
 * One adapter per file: function-backend.ts (built-in or user functions in a worker thread),
 * http-backend.ts (HTTP reward servers), onnx-backend.ts (an ONNX sequence scorer in process);
 * backends.ts picks one by `reward.type`. Every adapter passes the contract suite in
 * test/support/reward-backend-contract.ts.
 */
import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';
import type { RewardOutcome, RewardRequestItem } from './types.ts';

export type { RewardOutcome } from './types.ts';

/** One sample to score: its texts (functions, HTTP servers) and its own token ids (reward models). */
export interface RewardItem extends RewardRequestItem {
  /** Prompt token ids (after the chat template), as the run's tokenizer produced them. */
  prompt_ids: ArrayLike<number>;
  /** Generated token ids (without the prompt). */
  response_ids: ArrayLike<number>;
  /** The row's data_source and extra_info (JSON object text), for reward functions (verl's arguments). */
  data_source?: string;
  extra_info?: string;
}

export interface RewardBackend {
  /** Names the source in scored groups (`reward_fn`) and in failures, e.g. `fn:number_game`, `http:remote`. */
  name: string;
  /**
   * One outcome per item, in the items' order, with the item's id. A sample that cannot be scored
   * is an outcome `{ok: false, reason, retriable}` — never a thrown error, never a zero reward.
   */
  score(items: RewardItem[]): Promise<RewardOutcome[]>;
  /** Cumulative client gauges and counters (remote servers: `reward_server/<host:port>/…`). */
  metrics?(): Record<string, number>;
  close(): Promise<void>;
}

/** What a backend is built from: the run's config, its logger, this reward replica and the environment. */
export interface RewardBackendContext {
  cfg: Config;
  log: Logger;
  /** This reward replica's index (remote servers: it prefers server `replicaIndex mod N`). */
  replicaIndex: number;
  /** Read for `DISABLE_RL_REWARD_MODEL` and the servers' `auth_token_env`. */
  env: NodeJS.ProcessEnv;
}

export type RewardBackendFactory = (ctx: RewardBackendContext) => Promise<RewardBackend>;
