/**
 * The pipeline runtime shared by the five stages: opens the run's bus, store and codecs from the
 * config (embedded: one PGlite under run_dir holding both the event log and the tables;
 * distributed: Kafka + PostgreSQL, or the embedded log over a shared PostgreSQL), and runs a
 * stage's batch handler over decoded records. A stage's handler sees typed records, emits typed
 * records, and writes durable state through the batch's transaction when the bus offers one.
 */
import { resolve, join } from 'node:path';
import type { Logger } from 'pino';
import { openDatabase, type Database, type Tx } from '../db/database.ts';
import { createEmbeddedBus } from '../bus/embedded-log.ts';
import { kafkaSecurity } from '../bus/kafka-security.ts';
import { createKafkaBus } from '../bus/kafka-log.ts';
import type { BatchContext, BusMessage, Consumer, EventBus, OutMessage } from '../bus/port.ts';
import { createStore } from '../store/index.ts';
import type { Store } from '../store/port.ts';
import {
  TOPICS,
  LOGICAL_TOPICS,
  topicName,
  parseTopicName,
  topicCodecs,
  readyAll,
  deadLetterId,
  type LogicalTopic,
  type TopicValue,
  type TopicCodecs,
} from '../contracts/index.ts';
import { resolveRunDir, resolveRunId, type Config } from '../config/index.ts';
import { ConfigError, PoisonMessageError, errorMessage, isRetriable } from '../errors.ts';
import { silentLogger, forStage } from '../log.ts';
import type { Executor } from './stage-state.ts';
import { retriableDbError } from '../db/errors.ts';
import { waitForMigrations } from '../db/migrate.ts';
import { crashPoint, type CrashPointName } from './crash-points.ts';
import { makeDirs } from '../util/make-dirs.ts';
import { NO_TELEMETRY, type Telemetry } from './telemetry.ts';
import { createPolicyStore, type PolicyStore } from '../policy-store/index.ts';

export interface Pipeline {
  readonly cfg: Config;
  readonly runId: string;
  readonly runDir: string;
  readonly bus: EventBus;
  readonly store: Store;
  readonly db: Database;
  readonly codecs: TopicCodecs;
  /** Policy, critic and EMA versions (pipeline.policy_store). */
  readonly policies: PolicyStore;
  readonly log: Logger;
  /** Live observers of the stages' batches, errors and metrics (serve's /metrics); NO_TELEMETRY by default. */
  readonly telemetry?: Telemetry;
  topic(t: LogicalTopic): string;
  /** Encodes a record as an outgoing message of its topic (key from the topic's key function). */
  message<K extends LogicalTopic>(t: K, value: TopicValue<K>): OutMessage;
  close(): Promise<void>;
}

export interface OpenOptions {
  log?: Logger;
  clientId?: string;
  /** Embedded: take over a run directory lock held on another host (`--break-lock`). */
  breakLock?: boolean;
  telemetry?: Telemetry;
  /**
   * Over PostgreSQL (pipeline.store = postgres): wait until `rlstream migrate` has applied every
   * migration instead of applying them (a served stage); `onWait` is told once what is missing.
   * Default: apply them (under the advisory lock).
   */
  waitForMigrations?: { signal?: AbortSignal; onWait?: (pending: string[]) => void };
}

/** Opens the bus, store and codecs of the run described by `cfg`. */
export async function openPipeline(cfg: Config, opts: OpenOptions = {}): Promise<Pipeline> {
  const runId = resolveRunId(cfg);
  const runDir = resolve(resolveRunDir(cfg));
  makeDirs(runDir, 'the run directory (trainer.run_dir)');
  const log = opts.log ?? silentLogger(runId, 'pipeline');
  const p = cfg.pipeline;
  if (p.bus === 'kafka' && p.brokers.length === 0)
    throw new ConfigError('pipeline.bus = kafka needs pipeline.brokers (e.g. [localhost:9092])');
  if (p.store === 'postgres' && !p.database_url)
    throw new ConfigError('pipeline.store = postgres needs pipeline.database_url');
  const waitMigrations = p.store === 'postgres' ? opts.waitForMigrations : undefined;
  const db =
    p.store === 'postgres'
      ? await openDatabase({ kind: 'postgres', url: p.database_url! }, { migrate: !waitMigrations })
      : await openDatabase({ kind: 'pglite', dir: join(runDir, 'db'), breakLock: opts.breakLock });
  if (waitMigrations) {
    try {
      await waitForMigrations(db.db, {
        signal: waitMigrations.signal,
        onWait: (s) => waitMigrations.onWait?.(s.pending),
      });
    } catch (e) {
      await db.close();
      throw e;
    }
  }
  let bus: EventBus;
  try {
    bus =
      p.bus === 'kafka'
        ? createKafkaBus({
            brokers: p.brokers,
            clientId: opts.clientId ?? `rlstream-${runId}`,
            logger: forStage(log, 'bus'),
            idempotent: p.kafka.idempotent,
            acks: p.kafka.acks === 'all' ? -1 : p.kafka.acks,
            sessionTimeoutMs: p.kafka.session_timeout_ms,
            heartbeatIntervalMs: p.kafka.heartbeat_interval_ms,
            kafka: kafkaSecurity(p.kafka),
          })
        : createEmbeddedBus({ database: db, logger: forStage(log, 'bus') });
  } catch (e) {
    await db.close();
    throw e;
  }
  const store = createStore(db);
  const codecs = topicCodecs(
    { schema_wire_format: p.schema_wire_format, schema_registry_url: p.schema_registry_url },
    p.topic_prefix,
    runId,
  );
  const names = Object.fromEntries(LOGICAL_TOPICS.map((t) => [t, topicName(p.topic_prefix, runId, t)])) as Record<
    LogicalTopic,
    string
  >;
  try {
    await readyAll(codecs);
    await bus.ensureTopics(
      LOGICAL_TOPICS.map((t) => ({ name: names[t], partitions: Math.max(1, partitionsFor(cfg, t)) })),
    );
  } catch (e) {
    await bus.close().catch(() => undefined);
    await db.close();
    throw e;
  }
  return {
    cfg,
    runId,
    runDir,
    bus,
    store,
    db,
    codecs,
    log,
    telemetry: opts.telemetry ?? NO_TELEMETRY,
    policies: createPolicyStore(p.policy_store, {
      runDir,
      runId,
      db: db.db,
      cacheDir: p.policy_cache_dir ? resolve(p.policy_cache_dir) : null,
      s3: p.s3,
    }),
    topic: (t) => names[t],
    message(t, value) {
      const enc = codecs[t].encode(value as never);
      return {
        topic: names[t],
        key: (TOPICS[t].key as (v: unknown) => string)(value),
        value: enc.value,
        headers: enc.headers,
      };
    },
    async close() {
      await bus.close().catch(() => undefined);
      await db.close().catch(() => undefined);
    },
  };
}

/** Partitions of a topic: single-writer/ordered topics keep 1; data topics use pipeline.partitions. */
export function partitionsFor(cfg: Config, t: LogicalTopic): number {
  if (t === 'policy' || t === 'control' || t === 'metrics' || t === 'deadletter') return 1;
  return cfg.pipeline.partitions;
}

export interface Decoded<K extends LogicalTopic = LogicalTopic> {
  topic: K;
  value: TopicValue<K>;
  message: BusMessage;
}

export interface StageContext {
  readonly tx?: Tx;
  /** The database executor for stage state: the batch transaction when there is one. */
  readonly db: Executor;
  readonly signal: AbortSignal;
  /**
   * How long this stage sat idle before this batch: ms from the end of its previous batch (0 for
   * the first batch of the process). Stages log it as `timing/<stage>/wait_s` of the batch's first
   * step, next to their compute phases.
   */
  readonly waitedMs: number;
  emit<K extends LogicalTopic>(t: K, value: TopicValue<K>): void;
  /**
   * Makes the outputs emitted so far durable now when the bus has no batch transaction (Kafka):
   * call it before writing state that says they were sent. Embedded: a no-op (they commit with the batch).
   */
  flush(): Promise<void>;
}

export type StageHandler = (records: Decoded[], ctx: StageContext) => Promise<void>;

export interface StageRun {
  consumer: Consumer;
  done: Promise<void>;
  /** The stage's input topics (full names), for lag. */
  topics?: string[];
}

/**
 * Runs a stage: consumes its input topics in its consumer group, decodes each message (an
 * undecodable one, or one of another run, is dead-lettered with its reason and recorded in the
 * store; the stage goes on) and hands the records to `handler`.
 */
export function runStage(
  p: Pipeline,
  stage: string,
  inputs: LogicalTopic[],
  handler: StageHandler,
  opts: { maxBatchMessages?: number; group?: string } = {},
): StageRun {
  const consumer = p.bus.consumer({
    group: opts.group ?? `${p.runId}.${stage}`,
    topics: inputs.map((t) => p.topic(t)),
    fromBeginning: true,
    // embedded log: a step's groups in one batch (one transaction, one generate call). Over PGlite
    // every append is made in this process and wakes the consumers at once, so idle polling only
    // backs that up (the bus default); 50 ms polls by four idle stages competed with the busy one
    // for PGlite's single connection
    maxBatchMessages: opts.maxBatchMessages ?? (p.cfg.pipeline.bus === 'kafka' ? 64 : 1024),
    maxWaitMs: p.cfg.pipeline.bus === 'kafka' ? p.cfg.pipeline.kafka.max_wait_ms : p.db.kind === 'pglite' ? 250 : 50,
    deadLetter: {
      topic: p.topic('deadletter'),
      encode: (info) => {
        // the bus dead-letters a message the handler failed on alone (a stage's own deadLetter() below is counted there)
        if (info.attempts > 0) p.telemetry?.deadLetter(stage);
        return p.message(
          'deadletter',
          deadLetterRecord(p, stage, info.message, info.reason, info.error, info.attempts),
        );
      },
      // a message the handler failed on (dead-lettered by the delivery policy) is kept in the store too
      record: (info, tx) =>
        p.store.recordDeadLetter(
          {
            stage,
            topic: info.message.topic,
            partition: info.message.partition,
            offset: info.message.offset,
            runId: p.runId,
            reason: info.reason,
            errorCode: errorCodeOf(info.error),
            payload: info.message.value,
          },
          { tx },
        ),
    },
  });
  let lastDoneMs: number | null = null;
  const done = consumer.run(async (batch: BusMessage[], bctx: BatchContext) => {
    const startMs = performance.now();
    const records: Decoded[] = [];
    for (const m of batch) {
      const logical = parseTopicName(p.cfg.pipeline.topic_prefix, p.runId, m.topic);
      if (!logical) {
        await deadLetter(p, stage, bctx, m, `topic ${m.topic} is not one of run ${p.runId}'s topics`);
        continue;
      }
      try {
        const value = await p.codecs[logical].decode(m.value, m.headers);
        const rid = (value as { run_id?: string }).run_id;
        if (rid !== undefined && rid !== p.runId) {
          await deadLetter(p, stage, bctx, m, `record of unknown run ${rid} (this stage serves run ${p.runId})`);
          continue;
        }
        records.push({ topic: logical, value, message: m } as Decoded);
      } catch (e) {
        if (e instanceof PoisonMessageError) {
          await deadLetter(p, stage, bctx, m, errorMessage(e), e);
          continue;
        }
        throw e;
      }
    }
    if (records.length === 0) return;
    const pending: OutMessage[] = [];
    const ctx: StageContext = {
      tx: bctx.tx,
      db: bctx.tx ?? p.db.db,
      signal: bctx.signal,
      waitedMs: lastDoneMs === null ? 0 : Math.max(0, startMs - lastDoneMs),
      emit(t, value) {
        const m = p.message(t, value);
        if (bctx.tx) bctx.send([m]);
        else pending.push(m);
      },
      async flush() {
        if (pending.length) {
          const out = pending.splice(0);
          await p.bus.produce(out);
        }
      },
    };
    try {
      await handler(records, ctx);
      await ctx.flush();
      p.telemetry?.batch(
        stage,
        records.length,
        records.reduce((n, r) => n + ((r.value as { samples?: unknown[] }).samples?.length ?? 1), 0),
      );
    } catch (e) {
      // a lost database connection (PostgreSQL restarting) is retried with backoff, never dead-lettered
      const err = retriableDbError(e, `${stage} batch`);
      if (!bctx.signal.aborted) p.telemetry?.error(stage, isRetriable(err) ? 'retriable' : 'fatal');
      throw err;
    } finally {
      lastDoneMs = performance.now();
    }
    crashPoint(`${stage}:handled` as CrashPointName);
  });
  return { consumer, done, topics: inputs.map((t) => p.topic(t)) };
}

function errorCodeOf(error: unknown): string {
  const code = (error as { code?: unknown })?.code;
  return typeof code === 'string' ? code : 'ERR_HANDLER';
}

function deadLetterRecord(
  p: Pipeline,
  stage: string,
  m: BusMessage,
  reason: string,
  error: unknown,
  attempts: number,
): TopicValue<'deadletter'> {
  const headers: Record<string, Buffer> = {};
  for (const [k, v] of Object.entries(m.headers)) headers[k] = Buffer.from(v);
  const code = (error as { code?: unknown })?.code;
  return {
    run_id: p.runId,
    id: deadLetterId(p.runId, stage, m.topic, m.partition, m.offset),
    step: null,
    policy_version: null,
    stage,
    source_topic: m.topic,
    source_partition: m.partition,
    source_offset: m.offset,
    key: m.key === null ? null : Buffer.from(m.key),
    headers,
    payload: m.value,
    schema: m.headers['rl-schema'] ?? null,
    reason: reason.slice(0, 4000),
    error_code: typeof code === 'string' ? code : 'ERR_POISON',
    retriable: false,
    attempts,
    time_ms: m.timestamp,
  };
}

async function deadLetter(
  p: Pipeline,
  stage: string,
  bctx: BatchContext,
  m: BusMessage,
  reason: string,
  error?: unknown,
): Promise<void> {
  forStage(p.log, stage).warn(
    { topic: m.topic, partition: m.partition, offset: m.offset, reason },
    'dead-lettering a message',
  );
  p.telemetry?.error(stage, 'poison');
  p.telemetry?.deadLetter(stage);
  bctx.deadLetter(m, reason, error);
  await p.store.recordDeadLetter(
    {
      stage,
      topic: m.topic,
      partition: m.partition,
      offset: m.offset,
      runId: p.runId,
      reason,
      errorCode: (error as { code?: string })?.code ?? 'ERR_POISON',
      payload: m.value,
    },
    { tx: bctx.tx },
  );
}
