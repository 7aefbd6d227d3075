/**
 * What both bus adapters share when they deliver a batch to a handler: option defaults, splitting
 * fetched messages into batches, the batch context, and the retry / split / dead-letter policy.
 *
 * An adapter supplies one primitive, `attempt(messages, handler, deadLetters)`: run the handler
 * (if any) over the messages with a fresh context, then make its outputs and dead letters durable
 * and commit the offset after the last message — atomically (embedded) or in that order (Kafka).
 * `deliver()` decides what to attempt:
 *   - handler throws a retriable error → back off (jittered, capped exponential), same batch again;
 *   - handler throws a non-retriable error → the batch is split and each message attempted alone;
 *     a single message that fails is dead-lettered with the error's message as reason;
 *   - the adapter's own retriable failure (database, broker) → back off and attempt again;
 *   - the handler's or the adapter's storage failure (ENOSPC, EROFS, EIO on the stage's own files,
 *     `storageFault`), or a stored file of the stage that is damaged (`stageFault`), is the
 *     stage's, not the message's: never dead-lettered; the consumer stops with it (one line naming
 *     the path), nothing is committed, and a restart continues there once it is fixed;
 *   - anything else is fatal: the consumer stops with the error, nothing is committed.
 */
import type { Logger } from 'pino';
import { RlError, errorMessage, isRetriable, stageFault } from '../errors.ts';
import type {
  BatchContext,
  BatchHandler,
  BusMessage,
  ConsumerOptions,
  DeadLetterInfo,
  DeadLetterOptions,
  OutMessage,
} from './port.ts';
import type { Tx } from '../db/database.ts';
import { isConnectionError } from '../db/errors.ts';

export interface ResolvedConsumerOptions {
  group: string;
  topics: string[];
  fromBeginning: boolean;
  maxBatchMessages: number;
  maxBatchBytes: number;
  maxWaitMs: number;
  deadLetter?: DeadLetterOptions;
  retry: { maxAttempts: number; initialMs: number; maxMs: number };
}

export function resolveConsumerOptions(opts: ConsumerOptions): ResolvedConsumerOptions {
  if (!opts.group)
    throw new RlError('consumer: `group` is required (one consumer group per stage)', { code: 'ERR_CONFIG' });
  if (!opts.topics?.length)
    throw new RlError(`consumer ${opts.group}: \`topics\` must name at least one topic`, { code: 'ERR_CONFIG' });
  const positive = (name: string, v: number | undefined, dflt: number): number => {
    const x = v ?? dflt;
    if (!(x > 0)) throw new RlError(`consumer ${opts.group}: ${name} must be > 0, got ${v}`, { code: 'ERR_CONFIG' });
    return x;
  };
  return {
    group: opts.group,
    topics: [...new Set(opts.topics)],
    fromBeginning: opts.fromBeginning ?? true,
    maxBatchMessages: Math.floor(positive('maxBatchMessages', opts.maxBatchMessages, 500)),
    maxBatchBytes: positive('maxBatchBytes', opts.maxBatchBytes, 8 * 1024 * 1024),
    maxWaitMs: positive('maxWaitMs', opts.maxWaitMs, 250),
    deadLetter: opts.deadLetter,
    retry: {
      maxAttempts: positive('retry.maxAttempts', opts.retry?.maxAttempts, Infinity),
      initialMs: positive('retry.initialMs', opts.retry?.initialMs, 100),
      maxMs: positive('retry.maxMs', opts.retry?.maxMs, 10_000),
    },
  };
}

/** Cuts one partition's messages (in offset order) into batches of at most `maxMessages` and `maxBytes` of values (a larger message goes alone). */
export function chunkMessages(messages: BusMessage[], maxMessages: number, maxBytes: number): BusMessage[][] {
  const out: BusMessage[][] = [];
  let cur: BusMessage[] = [];
  let bytes = 0;
  for (const m of messages) {
    if (cur.length > 0 && (cur.length >= maxMessages || bytes + m.value.length > maxBytes)) {
      out.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(m);
    bytes += m.value.length;
  }
  if (cur.length) out.push(cur);
  return out;
}

/** Jittered exponential backoff: uniform in [d/2, d], d = min(maxMs, initialMs · 2^attempt). */
export function backoffMs(attempt: number, initialMs: number, maxMs: number): number {
  const d = Math.min(maxMs, initialMs * 2 ** Math.min(attempt, 30));
  return d / 2 + Math.random() * (d / 2);
}

/** Resolves after `ms`, or early (false) when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const onAbort = () => {
      clearTimeout(t);
      resolve(false);
    };
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve(true);
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

const sameMessage = (a: BusMessage, b: BusMessage) =>
  a.topic === b.topic && a.partition === b.partition && a.offset === b.offset;

export class DeliveryContext implements BatchContext {
  readonly outputs: OutMessage[] = [];
  readonly deadLetters: DeadLetterInfo[] = [];
  constructor(
    private readonly batch: BusMessage[],
    private readonly group: string,
    private readonly hasDeadLetter: boolean,
    readonly signal: AbortSignal,
    readonly tx?: Tx,
  ) {}

  send(messages: OutMessage[]): void {
    for (const m of messages) validateOutMessage(m);
    this.outputs.push(...messages);
  }

  deadLetter(message: BusMessage, reason: string, error?: unknown): void {
    if (!this.batch.some((m) => sameMessage(m, message))) {
      throw new RlError(
        `ctx.deadLetter: ${message.topic}[${message.partition}]@${message.offset} is not in this batch`,
        { code: 'ERR_BUS_USAGE' },
      );
    }
    if (!this.hasDeadLetter) {
      throw new RlError(
        `consumer group ${this.group} has no dead-letter topic configured; cannot dead-letter ${message.topic}[${message.partition}]@${message.offset} (${reason})`,
        { code: 'ERR_NO_DEAD_LETTER' },
      );
    }
    if (!this.deadLetters.some((d) => sameMessage(d.message, message)))
      this.deadLetters.push({ message, group: this.group, reason, error, attempts: 0 });
  }
}

export function validateOutMessage(m: OutMessage): void {
  if (!m || typeof m.topic !== 'string' || !m.topic)
    throw new RlError('out message needs a topic', { code: 'ERR_BUS_USAGE' });
  if (typeof m.key !== 'string')
    throw new RlError(`out message to ${m.topic} needs a string key (the partitioning key), got ${typeof m.key}`, {
      code: 'ERR_BUS_USAGE',
    });
  if (!Buffer.isBuffer(m.value))
    throw new RlError(`out message to ${m.topic} (key ${m.key}) needs a Buffer value`, { code: 'ERR_BUS_USAGE' });
  if (m.partition !== undefined && !(Number.isInteger(m.partition) && m.partition >= 0))
    throw new RlError(`out message to ${m.topic}: partition must be a non-negative integer, got ${m.partition}`, {
      code: 'ERR_BUS_USAGE',
    });
  if (m.headers)
    for (const [k, v] of Object.entries(m.headers)) {
      if (typeof v !== 'string')
        throw new RlError(`out message to ${m.topic}: header ${k} must be a string`, { code: 'ERR_BUS_USAGE' });
    }
}

/** Encodes dead letters with the consumer's encoder, routed to its dead-letter topic. */
export function encodeDeadLetters(
  infos: DeadLetterInfo[],
  dl: DeadLetterOptions | undefined,
  group: string,
): OutMessage[] {
  if (!infos.length) return [];
  if (!dl)
    throw new RlError(`consumer group ${group} has no dead-letter topic configured`, { code: 'ERR_NO_DEAD_LETTER' });
  return infos.map((info) => {
    const out = dl.encode(info);
    const msg = { ...out, topic: dl.topic };
    validateOutMessage(msg);
    return msg;
  });
}

/** The handler threw: carries its error so the policy can read `retriable`. */
export class HandlerFailure extends Error {
  constructor(readonly error: unknown) {
    super(errorMessage(error));
    this.name = 'HandlerFailure';
  }
}

/** The consumer stopped while the handler ran: nothing was committed. */
export class Aborted extends Error {
  constructor() {
    super('consumer stopped');
    this.name = 'Aborted';
  }
}

/**
 * Runs the handler; its error becomes a HandlerFailure. If `signal` aborts first, throws Aborted
 * at once (the handler's late result is ignored and the batch is not committed).
 */
export async function runHandler(
  handler: BatchHandler,
  batch: BusMessage[],
  ctx: DeliveryContext,
  signal: AbortSignal,
): Promise<void> {
  if (signal.aborted) throw new Aborted();
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(new Aborted());
    signal.addEventListener('abort', onAbort, { once: true });
  });
  const work = (async () => {
    try {
      await handler(batch, ctx);
    } catch (e) {
      throw new HandlerFailure(e);
    }
  })();
  work.catch(() => undefined); // a handler abandoned on stop may still fail later
  try {
    await Promise.race([work, aborted]);
  } finally {
    signal.removeEventListener('abort', onAbort!);
    aborted.catch(() => undefined);
  }
}

export type AttemptResult = 'committed' | 'stale';

export interface DeliveryDeps {
  opts: ResolvedConsumerOptions;
  log: Logger;
  signal: AbortSignal;
  /** Aborted when the partition should be given up between attempts (Kafka: a rebalance is pending): backoff ends, the batch stays uncommitted. */
  yieldSignal?: AbortSignal;
  /** One attempt: handler (null: dead-letter only) + durable outputs + commit. */
  attempt(batch: BusMessage[], handler: BatchHandler | null, deadLetters: DeadLetterInfo[]): Promise<AttemptResult>;
}

/** Result of delivering one batch: all offsets committed, the partition is no longer ours, or the consumer stopped. */
export type DeliveryResult = 'committed' | 'stale' | 'aborted';

/** Sleeps between attempts; says why it ended early, if it did. */
async function pause(ms: number, deps: DeliveryDeps): Promise<'ok' | DeliveryResult> {
  const signals = deps.yieldSignal ? AbortSignal.any([deps.signal, deps.yieldSignal]) : deps.signal;
  if (await sleep(ms, signals)) return 'ok';
  return deps.signal.aborted ? 'aborted' : 'stale';
}

const where = (b: BusMessage[]) =>
  `${b[0].topic}[${b[0].partition}]@${b[0].offset}${b.length > 1 ? `..${b[b.length - 1].offset}` : ''}`;

/** Delivers one batch with the retry / split / dead-letter policy (see the file comment). Throws only fatal errors. */
export async function deliver(
  batch: BusMessage[],
  handler: BatchHandler,
  deps: DeliveryDeps,
  priorRuns = 0,
): Promise<DeliveryResult> {
  const { opts, log, signal } = deps;
  let handlerRuns = priorRuns;
  let retriableFailures = 0;
  let infraFailures = 0;
  while (true) {
    if (signal.aborted) return 'aborted';
    try {
      handlerRuns++;
      return await deps.attempt(batch, handler, []);
    } catch (e) {
      if (e instanceof Aborted || signal.aborted) return 'aborted';
      const fault = stageFault(e instanceof HandlerFailure ? e.error : e);
      if (fault) {
        log.error(
          {
            group: opts.group,
            batch: where(batch),
            path: (fault.details as { path?: string } | undefined)?.path,
            err: e instanceof HandlerFailure ? e.error : e,
          },
          `stopping with ${where(batch)} uncommitted: ${fault.message}`,
        );
        throw fault;
      }
      if (e instanceof HandlerFailure) {
        if (isRetriable(e.error)) {
          retriableFailures++;
          if (retriableFailures >= opts.retry.maxAttempts) {
            throw new RlError(
              `consumer group ${opts.group}: batch ${where(batch)} still failing after ${retriableFailures} attempts: ${e.message}`,
              { retriable: true, code: 'ERR_RETRIES_EXHAUSTED', cause: e.error },
            );
          }
          const ms = backoffMs(retriableFailures - 1, opts.retry.initialMs, opts.retry.maxMs);
          log.warn(
            {
              group: opts.group,
              batch: where(batch),
              attempt: retriableFailures,
              retry_in_ms: Math.round(ms),
              err: e.error,
            },
            `retriable handler error, redelivering: ${e.message}`,
          );
          const p = await pause(ms, deps);
          if (p !== 'ok') return p;
          continue;
        }
        if (batch.length > 1) {
          log.warn(
            { group: opts.group, batch: where(batch), err: e.error },
            `handler failed (not retriable) on a batch of ${batch.length}; retrying its messages one by one: ${e.message}`,
          );
          for (const m of batch) {
            const r = await deliver([m], handler, deps, handlerRuns);
            if (r !== 'committed') return r;
          }
          return 'committed';
        }
        const reason = e.message || (e.error as Error)?.name || 'handler failed';
        log.warn(
          { group: opts.group, message: where(batch), reason },
          'dead-lettering a message that cannot be processed',
        );
        if (!opts.deadLetter) {
          throw new RlError(
            `consumer group ${opts.group}: message ${where(batch)} cannot be processed (${reason}) and no dead-letter topic is configured; stopping with its offset uncommitted`,
            { code: 'ERR_NO_DEAD_LETTER', cause: e.error },
          );
        }
        return await deadLetterOnly(batch[0], reason, e.error, handlerRuns, deps);
      }
      if (isRetriable(e) || isConnectionError(e)) {
        const ms = backoffMs(infraFailures++, opts.retry.initialMs, opts.retry.maxMs);
        log.warn(
          { group: opts.group, batch: where(batch), retry_in_ms: Math.round(ms), err: e },
          `bus error, retrying the batch: ${errorMessage(e)}`,
        );
        const p = await pause(ms, deps);
        if (p !== 'ok') return p;
        continue;
      }
      throw e;
    }
  }
}

async function deadLetterOnly(
  message: BusMessage,
  reason: string,
  error: unknown,
  attempts: number,
  deps: DeliveryDeps,
): Promise<DeliveryResult> {
  const { opts, log, signal } = deps;
  let failures = 0;
  while (true) {
    if (signal.aborted) return 'aborted';
    try {
      return await deps.attempt([message], null, [{ message, group: opts.group, reason, error, attempts }]);
    } catch (e) {
      if (e instanceof Aborted || signal.aborted) return 'aborted';
      if (!isRetriable(e) && !isConnectionError(e)) throw e;
      const ms = backoffMs(failures++, opts.retry.initialMs, opts.retry.maxMs);
      log.warn(
        { group: opts.group, message: where([message]), err: e },
        `could not write the dead letter yet: ${errorMessage(e)}`,
      );
      const p = await pause(ms, deps);
      if (p !== 'ok') return p;
    }
  }
}
