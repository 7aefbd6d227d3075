/**
 * The environment port: what a multi-turn episode talks to between the policy's turns.
 *
 * An episode starts from a dataset row (`start`), then alternates: the policy samples an
 * assistant message, the environment answers (`step`) with zero or more messages (role `user`
 * or `tool`), an optional reward for that turn, and whether the episode is done. Adapters: a
 * JS/TS module (module-env.ts) and an HTTP JSON protocol (http-env.ts); one contract suite
 * (test/support/env-contract.ts) runs against both.
 *
 * Failures are `EnvError`s with `retriable` (lib/errors.ts) and a `kind`: `timeout` (no answer
 * within the limit), `bad_reply` (not the shape below), `crash` (the environment threw or
 * answered 5xx), `unreachable` (no connection). The rollout stores them as the episode's failure
 * with the reason; an episode failure is never a reward of 0.
 */
import { z } from 'zod';
import { RlError } from '../errors.ts';

/** A chat message as environments exchange it (OpenAI-style; `tool` messages may name their call). */
export type EnvMessage = {
  role: 'user' | 'tool' | 'system';
  content: string;
  name?: string;
  tool_call_id?: string;
};

/** What `start` receives: the dataset row of the episode and its deterministic id. */
export interface EnvRow {
  /** Deterministic episode id (the trajectory sample id): the same row and sample always get the same id. */
  episode_id: string;
  /** Sample index within the prompt group (0..n-1): lets an environment vary per episode deterministically. */
  sample_index: number;
  prompt_text: string;
  ground_truth: string | null;
  data_source: string | null;
  /** The row's extra_info, parsed from JSON ({} when absent). */
  extra_info: Record<string, unknown>;
  /** interaction kwargs from the config. */
  kwargs: Record<string, unknown>;
}

/** The environment's answer to one assistant message. */
export interface EnvStep {
  messages: EnvMessage[];
  /** This turn's reward (0 when absent). */
  reward: number;
  done: boolean;
  /** Numeric details of the turn (summed over the episode into the reward details). */
  metrics: Record<string, number>;
  /** The tool calls this answer holds (tools-env.ts): `message` indexes `messages`. */
  tools?: ToolCallRecord[];
}

/** One tool call of an answer, as recorded in the episode's turns. */
export interface ToolCallRecord {
  /** Index of its `tool` message in the answer's messages. */
  message: number;
  /** The tool called; null for a call that could not be parsed. */
  name: string | null;
  /** The call's arguments as JSON text (a malformed call: its text). */
  arguments: string;
  /** Why the call failed (malformed, unknown tool, the tool's error), or null. */
  error: string | null;
  latency_ms: number;
}

export type EnvFailureKind = 'timeout' | 'bad_reply' | 'crash' | 'unreachable';

export class EnvError extends RlError {
  constructor(
    readonly kind: EnvFailureKind,
    message: string,
    opts: { retriable?: boolean; cause?: unknown } = {},
  ) {
    super(message, {
      retriable: opts.retriable ?? (kind === 'unreachable' || kind === 'timeout'),
      code: `ERR_ENV_${kind.toUpperCase()}`,
      cause: opts.cause,
    });
    this.name = 'EnvError';
  }
}

/** One running episode. */
export interface EnvEpisode {
  /** The environment's answer to the policy's assistant message (content = the sampled text). */
  step(assistant: { role: 'assistant'; content: string }): Promise<EnvStep>;
  /** Releases the episode (best effort; never throws). */
  close(): Promise<void>;
}

export interface Environment {
  /** Names the adapter and target in failures (module:<path>, http:<url>). */
  readonly name: string;
  start(row: EnvRow): Promise<EnvEpisode>;
  close(): Promise<void>;
}

const messageSchema = z
  .object({
    role: z.enum(['user', 'tool', 'system']),
    content: z.string(),
    name: z.string().optional(),
    tool_call_id: z.string().optional(),
  })
  .strip();

/** The JSON shape of a step answer, for both adapters. */
export const stepReplySchema = z
  .object({
    messages: z.array(messageSchema).default([]),
    reward: z.number().finite().nullable().optional(),
    done: z.boolean(),
    metrics: z.record(z.string(), z.number().finite()).optional(),
  })
  .strip();

/** Checks an environment's step answer; a wrong shape is a `bad_reply` EnvError naming what to fix. */
export function parseStepReply(raw: unknown, where: string): EnvStep {
  const r = stepReplySchema.safeParse(raw);
  if (!r.success)
    throw new EnvError(
      'bad_reply',
      `${where}: a step answer is {messages: [{role: "user"|"tool", content: string}], reward?: number, done: boolean}; got ${JSON.stringify(raw)?.slice(0, 200)} (${r.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')})`,
      { retriable: false },
    );
  return {
    messages: r.data.messages,
    reward: r.data.reward ?? 0,
    done: r.data.done,
    metrics: r.data.metrics ?? {},
  };
}

/** `p` or an EnvError('timeout') after `ms` milliseconds. */
export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new EnvError('timeout', `${what}: no answer within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
