/**
 * Builders for the records whose shape is easy to get wrong by hand: control events (one payload
 * set, the others null) and dead letters (the failed message kept byte for byte, with the error's
 * code and retriable flag).
 */
import { errorMessage, isRetriable } from '../errors.ts';
import { SCHEMA_HEADER, headerValue, type MessageHeaders } from './codec.ts';
import { deadLetterId } from './ids.ts';
import type { ControlEventOf, ControlPayloads, ControlType, DeadLetter, RecordHeader } from './types.ts';

const NO_PAYLOADS = {
  run_started: null,
  epoch_started: null,
  refill_request: null,
  val_round_done: null,
  run_done: null,
  run_failed: null,
} as const;

/** A control event of `type` with its payload; every other payload is null. */
export function controlEvent<T extends ControlType>(
  type: T,
  payload: ControlPayloads[T],
  header: RecordHeader & { time_ms: number },
): ControlEventOf<T> {
  return { ...header, ...NO_PAYLOADS, type, [type]: payload } as unknown as ControlEventOf<T>;
}

/** The message a stage could not process, as its consumer saw it. */
export interface FailedMessage {
  /** Full topic name. */
  topic: string;
  partition: number;
  offset: number | bigint | string;
  key: Buffer | string | null;
  headers?: MessageHeaders;
  value: Buffer | null;
}

const MAX_REASON = 8000;

/**
 * The dead letter of a failed message. `error` gives reason, error_code (its `code`, else
 * ERR_UNKNOWN) and retriable (lib/errors.ts isRetriable). `schema` defaults to the rl-schema header;
 * pass the codec's `writerOf(...)` for Confluent messages. The id is deterministic (stage, topic,
 * partition, offset), so dead-lettering the same message twice gives one record.
 */
export function deadLetter(opts: {
  runId: string;
  stage: string;
  message: FailedMessage;
  error: unknown;
  attempts: number;
  timeMs: number;
  schema?: string | null;
  step?: number | null;
  policyVersion?: number | null;
}): DeadLetter {
  const m = opts.message;
  const offset = typeof m.offset === 'bigint' ? Number(m.offset) : Number(m.offset);
  if (!Number.isSafeInteger(offset) || offset < 0)
    throw new RangeError(`dead letter: offset ${String(m.offset)} is not a non-negative integer`);
  const headers: Record<string, Buffer> = {};
  for (const [k, v] of Object.entries(m.headers ?? {})) {
    const first = Array.isArray(v) ? v[0] : v;
    if (first !== undefined) headers[k] = typeof first === 'string' ? Buffer.from(first) : Buffer.from(first);
  }
  const code =
    opts.error && typeof opts.error === 'object' && typeof (opts.error as { code?: unknown }).code === 'string'
      ? (opts.error as { code: string }).code
      : 'ERR_UNKNOWN';
  const reason = errorMessage(opts.error);
  return {
    run_id: opts.runId,
    id: deadLetterId(opts.runId, opts.stage, m.topic, m.partition, offset),
    step: opts.step ?? null,
    policy_version: opts.policyVersion ?? null,
    stage: opts.stage,
    source_topic: m.topic,
    source_partition: m.partition,
    source_offset: offset,
    key: m.key === null ? null : typeof m.key === 'string' ? Buffer.from(m.key) : Buffer.from(m.key),
    headers,
    payload: m.value === null ? null : Buffer.from(m.value),
    schema: opts.schema !== undefined ? opts.schema : (headerValue(m.headers, SCHEMA_HEADER) ?? null),
    reason: reason.length > MAX_REASON ? `${reason.slice(0, MAX_REASON)}… (${reason.length} chars)` : reason,
    error_code: code,
    retriable: isRetriable(opts.error),
    attempts: opts.attempts,
    time_ms: opts.timeMs,
  };
}

/**
 * What the store keeps as a sample's reward_details (jsonb): the numeric components and, from
 * scored.v3 on, the text ones, in one object (their keys never collide: the reward stage split
 * one object into the two maps).
 */
export function storedRewardDetails(
  numbers: Readonly<Record<string, number>>,
  text: Readonly<Record<string, string>> | undefined,
): Record<string, number | string> {
  return text && Object.keys(text).length ? { ...numbers, ...text } : { ...numbers };
}
