/**
 * The Kafka event bus (kafkajs 2.2). One consumer group per stage; batches come from kafkajs'
 * `eachBatch` (one partition each), are cut to the consumer's size limits, and for each batch:
 * handler → outputs and dead letters produced with acks=all and awaited → offset committed →
 * offset resolved. No Kafka transactions (the librdkafka mock only pretends to support them), so
 * delivery is at-least-once: a crash between produce and commit redelivers the batch, and
 * consumers deduplicate by id.
 *
 * Defaults: acks=-1 (`acks` option), murmur2 keyed partitioning (kafkajs' DefaultPartitioner, the Java client's,
 * and `partitioner.ts` agree), idempotent producer off (kafkajs marks it experimental; enable
 * with `idempotent: true`), group timing sessionTimeout 6000 / heartbeat 500 / fetch max wait
 * 250 ms (infra/kafka-mock notes: a member rejoining an emptied group waits ~sessionTimeout − 1 s).
 *
 * Topics: `ensureTopics` uses the admin API; on a broker without it (the librdkafka mock answers
 * "does not support the requested API version") it logs that and falls back to auto-creation by a
 * metadata request, then checks the partition count either way.
 *
 * `read()` (replay without a group) sends Fetch requests itself through kafkajs' internal cluster
 * object, since kafkajs has no public API for reading without joining a group.
 */
import {
  Kafka,
  Partitioners,
  logLevel as KafkaLogLevel,
  type Admin,
  type Consumer as KjsConsumer,
  type EachBatchPayload,
  type KafkaConfig,
  type KafkaMessage,
  type Producer,
  type LogEntry,
} from 'kafkajs';
import type { Logger } from 'pino';
import { ConfigError, RlError, errorMessage, isRetriable } from '../errors.ts';
import { silentLogger } from '../log.ts';
import { validateTopicName, validateTopicSpecs } from './topics.ts';
import {
  DeliveryContext,
  backoffMs,
  chunkMessages,
  deliver,
  encodeDeadLetters,
  resolveConsumerOptions,
  runHandler,
  sleep,
  validateOutMessage,
  type AttemptResult,
  type ResolvedConsumerOptions,
} from './delivery.ts';
import type {
  BatchHandler,
  BusMessage,
  Consumer,
  ConsumerOptions,
  DeadLetterInfo,
  EventBus,
  OutMessage,
  TopicPartition,
  TopicPartitionOffset,
  TopicSpec,
} from './port.ts';

export interface KafkaBusOptions {
  brokers: string[];
  clientId?: string;
  logger?: Logger;
  /** Idempotent producer (needs a broker with a controller; kafkajs calls it experimental). Default false. */
  idempotent?: boolean;
  /**
   * Producer acknowledgements: -1 (all in-sync replicas, the default), 1 (leader only) or 0 (none).
   * The pipeline's durability argument (outputs acknowledged before offsets commit) holds for -1;
   * 1 and 0 trade it for latency.
   */
  acks?: -1 | 0 | 1;
  /** Consumer group session timeout, ms (default 6000, the broker's minimum). */
  sessionTimeoutMs?: number;
  /** Consumer heartbeat interval, ms (default 500). */
  heartbeatIntervalMs?: number;
  /** How long the group waits for members to rejoin in a rebalance, ms (default 60 000). */
  rebalanceTimeoutMs?: number;
  /** Most value bytes per produce request; larger produce() calls are split in order (default 900 000, under Kafka's default message.max.bytes). */
  maxProduceBytes?: number;
  /** Passed through to kafkajs (ssl, sasl, connectionTimeout, requestTimeout, retry, ...). */
  kafka?: Omit<KafkaConfig, 'brokers' | 'clientId' | 'logCreator'>;
}

const REJOIN_TYPES = new Set([
  'REBALANCE_IN_PROGRESS',
  'ILLEGAL_GENERATION',
  'UNKNOWN_MEMBER_ID',
  'NOT_COORDINATOR_FOR_GROUP',
  'NOT_COORDINATOR',
]);

/** A group error after which kafkajs must rejoin (the partition may have moved). */
function needsRejoin(e: unknown): boolean {
  for (let x = e as { type?: string; originalError?: unknown; cause?: unknown } | undefined, i = 0; x && i < 5; i++) {
    if (typeof x.type === 'string' && REJOIN_TYPES.has(x.type)) return true;
    x = (x.originalError ?? x.cause) as typeof x;
  }
  return false;
}

/** Most consecutive rejoins after group glitches before the consumer fails. */
const MAX_GROUP_REJOINS = 8;
/** Coordinator answers during a join/sync that a fresh join gets past (besides kafkajs' own retriable ones). */
const GLITCH_TYPES = new Set([
  'INVALID_REQUEST',
  ...REJOIN_TYPES,
  'COORDINATOR_NOT_AVAILABLE',
  'COORDINATOR_LOAD_IN_PROGRESS',
  'MEMBER_ID_REQUIRED',
  'GROUP_COORDINATOR_NOT_AVAILABLE',
]);

/** A non-retriable kafkajs crash that is a group-membership glitch rather than a real fault (auth, config). */
function groupGlitch(e: unknown): boolean {
  for (let x = e as { type?: string; originalError?: unknown; cause?: unknown } | undefined, i = 0; x && i < 5; i++) {
    if (typeof x.type === 'string' && GLITCH_TYPES.has(x.type)) return true;
    x = (x.originalError ?? x.cause) as typeof x;
  }
  return false;
}

function unsupportedApi(e: unknown): boolean {
  const err = e as { name?: string; type?: string; message?: string };
  return (
    err?.name === 'KafkaJSServerDoesNotSupportApiKey' ||
    err?.type === 'UNSUPPORTED_VERSION' ||
    /does not support/i.test(err?.message ?? '')
  );
}

function toHeaders(h: KafkaMessage['headers']): Record<string, string> {
  const out: Record<string, string> = {};
  if (h)
    for (const [k, v] of Object.entries(h)) {
      if (v === undefined) continue;
      out[k] = Array.isArray(v) ? v.map((x) => x.toString()).join(',') : v.toString();
    }
  return out;
}

function toBusMessage(topic: string, partition: number, m: KafkaMessage): BusMessage {
  return {
    topic,
    partition,
    offset: Number(m.offset),
    key: m.key ? m.key.toString('utf8') : null,
    value: m.value ?? Buffer.alloc(0),
    headers: toHeaders(m.headers),
    timestamp: Number(m.timestamp),
  };
}

function pinoLogCreator(log: Logger) {
  return () =>
    ({ namespace, level, log: entry }: LogEntry) => {
      const { message, timestamp: _ts, logger: _l, ...extra } = entry as LogEntry['log'] & { logger?: string };
      const fields = { kafkajs: namespace, ...extra };
      if (level === KafkaLogLevel.ERROR) log.error(fields, message);
      else if (level === KafkaLogLevel.WARN) log.warn(fields, message);
      else if (level === KafkaLogLevel.INFO) log.info(fields, message);
      else log.debug(fields, message);
    };
}

interface InternalBroker {
  fetch(req: {
    maxWaitTime: number;
    minBytes: number;
    maxBytes: number;
    isolationLevel: number;
    topics: Array<{ topic: string; partitions: Array<{ partition: number; fetchOffset: string; maxBytes: number }> }>;
  }): Promise<{
    responses: Array<{
      topicName: string;
      partitions: Array<{
        partition: number;
        highWatermark: string;
        messages: Array<KafkaMessage & { isControlRecord?: boolean }>;
      }>;
    }>;
  }>;
}
interface InternalCluster {
  connect(): Promise<void>;
  disconnect(): Promise<void>;
  addTargetTopic(topic: string): Promise<void>;
  refreshMetadata(): Promise<void>;
  findLeaderForPartitions(topic: string, partitions: number[]): Record<string, number[]>;
  findBroker(b: { nodeId: string }): Promise<InternalBroker>;
}

export class KafkaBus implements EventBus {
  readonly kind = 'kafka' as const;
  readonly kafka: Kafka;
  readonly log: Logger;
  readonly opts: Required<
    Pick<
      KafkaBusOptions,
      'idempotent' | 'acks' | 'sessionTimeoutMs' | 'heartbeatIntervalMs' | 'rebalanceTimeoutMs' | 'maxProduceBytes'
    >
  >;
  private producer?: Promise<Producer>;
  private admin?: Promise<Admin>;
  private cluster?: Promise<InternalCluster>;
  private readonly consumers = new Set<KafkaConsumer>();
  private closed = false;

  constructor(o: KafkaBusOptions) {
    if (!o.brokers?.length) throw new ConfigError('kafka bus: `brokers` must list at least one host:port');
    if (o.acks !== undefined && ![-1, 0, 1].includes(o.acks))
      throw new ConfigError(`kafka bus: acks must be -1 (all), 0 or 1, got ${String(o.acks)}`);
    if (o.idempotent && o.acks !== undefined && o.acks !== -1)
      throw new ConfigError(`kafka bus: an idempotent producer needs acks = -1 (all), got ${o.acks}`);
    this.log = (o.logger ?? silentLogger()).child({ component: 'bus', bus: 'kafka' });
    this.opts = {
      idempotent: o.idempotent ?? false,
      acks: o.acks ?? -1,
      sessionTimeoutMs: o.sessionTimeoutMs ?? 6000,
      heartbeatIntervalMs: o.heartbeatIntervalMs ?? 500,
      rebalanceTimeoutMs: o.rebalanceTimeoutMs ?? 60_000,
      maxProduceBytes: o.maxProduceBytes ?? 900_000,
    };
    this.kafka = new Kafka({
      connectionTimeout: 3000,
      ...o.kafka,
      brokers: o.brokers,
      clientId: o.clientId ?? 'rlstream',
      logLevel: o.kafka?.logLevel ?? KafkaLogLevel.WARN,
      logCreator: pinoLogCreator(this.log.child({ component: 'kafkajs' })),
    });
  }

  private check(op: string): void {
    if (this.closed) throw new RlError(`kafka bus: ${op} after close()`, { code: 'ERR_BUS_CLOSED' });
  }

  private getProducer(): Promise<Producer> {
    this.producer ??= (async () => {
      const p = this.kafka.producer({
        createPartitioner: Partitioners.DefaultPartitioner,
        idempotent: this.opts.idempotent,
        maxInFlightRequests: this.opts.idempotent ? 1 : undefined,
        allowAutoTopicCreation: true,
      });
      await p.connect();
      return p;
    })().catch((e) => {
      this.producer = undefined;
      throw e;
    });
    return this.producer;
  }

  private getAdmin(): Promise<Admin> {
    this.admin ??= (async () => {
      const a = this.kafka.admin();
      await a.connect();
      return a;
    })().catch((e) => {
      this.admin = undefined;
      throw e;
    });
    return this.admin;
  }

  private getCluster(): Promise<InternalCluster> {
    this.cluster ??= (async () => {
      const sym = Object.getOwnPropertySymbols(this.kafka).find((s) => s.description === 'private:Kafka:createCluster');
      if (!sym)
        throw new RlError(
          'kafka bus: read() uses kafkajs 2.2 internals (private:Kafka:createCluster) that this kafkajs version does not have',
          { code: 'ERR_KAFKAJS_INTERNALS' },
        );
      const create = (this.kafka as unknown as Record<symbol, (o: object) => InternalCluster>)[sym];
      const cluster = create({ allowAutoTopicCreation: false });
      await cluster.connect();
      return cluster;
    })().catch((e) => {
      this.cluster = undefined;
      throw e;
    });
    return this.cluster;
  }

  async ensureTopics(specs: TopicSpec[]): Promise<void> {
    this.check('ensureTopics');
    validateTopicSpecs(specs);
    if (!specs.length) return;
    const admin = await this.getAdmin();
    try {
      await admin.createTopics({
        topics: specs.map((s) => ({ topic: s.name, numPartitions: s.partitions })),
        waitForLeaders: true,
      });
    } catch (e) {
      if (!unsupportedApi(e)) throw e;
      this.log.info(
        { topics: specs.map((s) => s.name) },
        `broker has no CreateTopics API (${errorMessage(e)}); relying on topic auto-creation`,
      );
    }
    const md = await admin.fetchTopicMetadata({ topics: specs.map((s) => s.name) });
    for (const s of specs) {
      const have = md.topics.find((t) => t.name === s.name)?.partitions.length ?? 0;
      if (have !== s.partitions) {
        throw new ConfigError(
          `topic ${s.name} has ${have} partitions on the broker, not ${s.partitions}; keyed routing depends on the count. ` +
            "Create it with the right count (kafka-topics --create, or the mock broker's topic:partitions argument) or use a new topic name",
        );
      }
    }
  }

  async produce(messages: OutMessage[]): Promise<void> {
    this.check('produce');
    if (!messages.length) return;
    for (const m of messages) validateOutMessage(m);
    const producer = await this.getProducer();
    // Split large calls into requests below the broker's size limit; sequential sends keep order.
    let chunk: OutMessage[] = [];
    let bytes = 0;
    const flush = async () => {
      if (!chunk.length) return;
      const byTopic = new Map<string, OutMessage[]>();
      for (const m of chunk) (byTopic.get(m.topic) ?? byTopic.set(m.topic, []).get(m.topic)!).push(m);
      await producer.sendBatch({
        acks: this.opts.acks,
        topicMessages: [...byTopic].map(([topic, ms]) => ({
          topic,
          messages: ms.map((m) => ({ key: m.key, value: m.value, headers: m.headers, partition: m.partition })),
        })),
      });
      chunk = [];
      bytes = 0;
    };
    for (const m of messages) {
      const size = m.value.length + Buffer.byteLength(m.key) + 64;
      if (chunk.length && bytes + size > this.opts.maxProduceBytes) await flush();
      chunk.push(m);
      bytes += size;
    }
    await flush();
  }

  consumer(opts: ConsumerOptions): Consumer {
    this.check('consumer');
    const resolved = resolveConsumerOptions(opts);
    for (const t of resolved.topics) validateTopicName(t);
    if (resolved.deadLetter) validateTopicName(resolved.deadLetter.topic);
    const c = new KafkaConsumer(this, resolved);
    this.consumers.add(c);
    return c;
  }

  forget(c: KafkaConsumer): void {
    this.consumers.delete(c);
  }

  async endOffsets(topic: string): Promise<number[]> {
    this.check('endOffsets');
    validateTopicName(topic);
    const admin = await this.getAdmin();
    const offs = await admin.fetchTopicOffsets(topic);
    const out = new Array<number>(offs.length).fill(0);
    for (const o of offs) out[o.partition] = Number(o.high);
    return out;
  }

  async committedOffsets(group: string, topics: string[]): Promise<TopicPartitionOffset[]> {
    const admin = await this.getAdmin();
    const res = await admin.fetchOffsets({ groupId: group, topics });
    return res
      .flatMap((t) => t.partitions.map((p) => ({ topic: t.topic, partition: p.partition, offset: Number(p.offset) })))
      .filter((x) => x.offset >= 0)
      .sort((a, b) => (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
  }

  async read(topic: string, partition: number, fromOffset: number, max: number): Promise<BusMessage[]> {
    this.check('read');
    validateTopicName(topic);
    if (max <= 0) return [];
    const cluster = await this.getCluster();
    await cluster.addTargetTopic(topic);
    const out: BusMessage[] = [];
    let offset = Math.max(0, fromOffset);
    while (out.length < max) {
      let leaders = cluster.findLeaderForPartitions(topic, [partition]);
      if (!Object.keys(leaders).length) {
        await cluster.refreshMetadata();
        leaders = cluster.findLeaderForPartitions(topic, [partition]);
        if (!Object.keys(leaders).length) throw new ConfigError(`read: topic ${topic} has no partition ${partition}`);
      }
      const broker = await cluster.findBroker({ nodeId: Object.keys(leaders)[0] });
      let res;
      try {
        res = await broker.fetch({
          maxWaitTime: 0,
          minBytes: 1,
          maxBytes: 64 * 1024 * 1024,
          isolationLevel: 1,
          topics: [{ topic, partitions: [{ partition, fetchOffset: String(offset), maxBytes: 16 * 1024 * 1024 }] }],
        });
      } catch (e) {
        if ((e as { type?: string }).type === 'OFFSET_OUT_OF_RANGE') break;
        throw e;
      }
      const pd = res.responses.find((r) => r.topicName === topic)?.partitions.find((p) => p.partition === partition);
      if (!pd) break;
      const msgs = pd.messages.filter((m) => !m.isControlRecord && Number(m.offset) >= offset);
      for (const m of msgs.slice(0, max - out.length)) out.push(toBusMessage(topic, partition, m));
      if (!msgs.length) break;
      offset = Number(msgs[msgs.length - 1].offset) + 1;
      if (offset >= Number(pd.highWatermark)) break;
    }
    return out;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await Promise.all([...this.consumers].map((c) => c.stop()));
    this.closed = true;
    const settle = async <T>(p: Promise<T> | undefined, f: (x: T) => Promise<void>) => {
      if (!p) return;
      try {
        await f(await p);
      } catch {
        /* never connected */
      }
    };
    await Promise.all([
      settle(this.producer, (p) => p.disconnect()),
      settle(this.admin, (a) => a.disconnect()),
      settle(this.cluster, (c) => c.disconnect()),
    ]);
  }

  /** Retries a broker call on retriable errors with backoff until it succeeds, `stopWhen` holds, or the signal aborts. */
  async withRetry<T>(
    what: string,
    fn: () => Promise<T>,
    signal: AbortSignal,
    retry: ResolvedConsumerOptions['retry'],
    stopWhen: (e: unknown) => boolean = () => false,
  ): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await fn();
      } catch (e) {
        if (stopWhen(e) || !isRetriable(e) || signal.aborted) throw e;
        const ms = backoffMs(attempt, retry.initialMs, retry.maxMs);
        this.log.warn({ err: e, retry_in_ms: Math.round(ms) }, `${what} failed, retrying: ${errorMessage(e)}`);
        if (!(await sleep(ms, signal))) throw e;
      }
    }
  }
}

class KafkaConsumer implements Consumer {
  private readonly abort = new AbortController();
  private state: 'new' | 'running' | 'stopped' = 'new';
  private kc?: KjsConsumer;
  private assigned: TopicPartition[] = [];
  private inflight?: Promise<void>;
  private finish?: (err?: unknown) => void;
  private done?: Promise<void>;
  private stopping?: Promise<void>;
  /** Consecutive rejoins after a group glitch without a successful join in between. */
  private rejoins = 0;
  private readonly log: Logger;

  constructor(
    private readonly bus: KafkaBus,
    readonly opts: ResolvedConsumerOptions,
  ) {
    this.log = bus.log.child({ group: opts.group });
  }

  assignment(): TopicPartition[] {
    return this.assigned.map((a) => ({ ...a }));
  }

  async run(handler: BatchHandler): Promise<void> {
    if (this.state !== 'new')
      throw new RlError(
        `consumer of group ${this.opts.group} was already ${this.state === 'running' ? 'started' : 'stopped'}; create a new one`,
        { code: 'ERR_BUS_USAGE' },
      );
    this.state = 'running';
    this.done = new Promise<void>((resolve, reject) => {
      this.finish = (err) => (err === undefined ? resolve() : reject(err));
    });
    await this.start(handler);
    return this.done;
  }

  /** Creates, connects and runs a kafkajs consumer for this group (again after a group glitch). */
  private async start(handler: BatchHandler): Promise<void> {
    const { opts, bus } = this;
    const kc = bus.kafka.consumer({
      groupId: opts.group,
      sessionTimeout: bus.opts.sessionTimeoutMs,
      heartbeatInterval: bus.opts.heartbeatIntervalMs,
      rebalanceTimeout: bus.opts.rebalanceTimeoutMs,
      maxWaitTimeInMs: opts.maxWaitMs,
      maxBytesPerPartition: Math.max(1024 * 1024, Math.min(opts.maxBatchBytes, 64 * 1024 * 1024)),
      allowAutoTopicCreation: true,
    });
    this.kc = kc;
    kc.on(kc.events.GROUP_JOIN, (e) => {
      this.rejoins = 0;
      this.assigned = Object.entries(e.payload.memberAssignment)
        .flatMap(([topic, parts]) => parts.map((partition) => ({ topic, partition })))
        .sort((a, b) => (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
      this.log.debug({ assignment: this.assigned }, 'joined the group');
    });
    kc.on(kc.events.REBALANCING, () => {
      this.assigned = [];
    });
    kc.on(kc.events.CRASH, (e) => {
      const err = e.payload.error;
      if (e.payload.restart) {
        this.log.warn({ err }, `kafka consumer crashed, restarting: ${errorMessage(err)}`);
      } else if (
        this.kc === kc &&
        this.state === 'running' &&
        !this.abort.signal.aborted &&
        groupGlitch(err) &&
        this.rejoins < MAX_GROUP_REJOINS
      ) {
        // kafkajs gives up on a coordinator answer it does not expect while joining (the
        // librdkafka mock answers INVALID_REQUEST to a SyncGroup that races another member's
        // join). kafkajs has already left the group; join again with a fresh consumer. Nothing
        // uncommitted is lost: it is redelivered, and processing is idempotent by id.
        const ms = backoffMs(this.rejoins++, 200, 5_000);
        this.assigned = [];
        this.log.warn(
          { err, attempt: this.rejoins, retry_in_ms: Math.round(ms) },
          `kafka consumer of group ${opts.group} left the group (${errorMessage(err)}); joining again`,
        );
        void sleep(ms, this.abort.signal)
          .then(async (slept) => {
            if (!slept || this.kc !== kc || this.state !== 'running') return;
            await this.inflight;
            await this.start(handler);
          })
          .catch((x: unknown) => this.fail(x));
      } else {
        this.fail(
          new RlError(`kafka consumer of group ${opts.group} crashed: ${errorMessage(err)}`, {
            retriable: isRetriable(err),
            code: 'ERR_KAFKA_CONSUMER',
            cause: err,
          }),
        );
      }
    });
    try {
      await kc.connect();
      if (this.abort.signal.aborted) {
        await kc.disconnect();
        return;
      }
      await kc.subscribe({ topics: opts.topics, fromBeginning: opts.fromBeginning });
      await kc.run({
        autoCommit: false,
        eachBatchAutoResolve: false,
        partitionsConsumedConcurrently: 1,
        eachBatch: (p) => {
          const work = this.onBatch(p, handler);
          this.inflight = work.catch(() => undefined);
          return work;
        },
      });
    } catch (e) {
      this.fail(e);
    }
  }

  private async onBatch(p: EachBatchPayload, handler: BatchHandler): Promise<void> {
    const { batch } = p;
    const signal = this.abort.signal;
    if (signal.aborted || !p.isRunning()) return;
    const messages = batch.messages.map((m) => toBusMessage(batch.topic, batch.partition, m));
    if (!messages.length) return;
    // Keep the membership alive while a long handler runs (kafkajs heartbeats only between
    // batches). If the group is rebalancing, stop retrying (a running handler may finish) so
    // kafkajs can rejoin promptly; the uncommitted rest is redelivered to the partition's owner.
    let rejoin: unknown;
    const yieldNow = new AbortController();
    const hb = setInterval(() => {
      p.heartbeat().catch((e) => {
        if (!needsRejoin(e)) return;
        rejoin ??= e;
        yieldNow.abort();
      });
    }, this.bus.opts.heartbeatIntervalMs);
    try {
      for (const chunk of chunkMessages(messages, this.opts.maxBatchMessages, this.opts.maxBatchBytes)) {
        if (signal.aborted || !p.isRunning() || p.isStale() || rejoin) break;
        const r = await deliver(chunk, handler, {
          opts: this.opts,
          log: this.log,
          signal,
          yieldSignal: yieldNow.signal,
          attempt: async (b, h, dl) => {
            try {
              return await this.attempt(b, h, dl, p);
            } catch (e) {
              if (!needsRejoin(e)) throw e;
              rejoin = e;
              return 'stale';
            }
          },
        });
        if (r !== 'committed') break;
      }
    } catch (e) {
      this.fail(e);
      return;
    } finally {
      clearInterval(hb);
    }
    // Let kafkajs rejoin the group: the partition may have moved; the uncommitted rest is redelivered.
    if (rejoin) throw rejoin;
  }

  private async attempt(
    batch: BusMessage[],
    handler: BatchHandler | null,
    extraDeadLetters: DeadLetterInfo[],
    p: EachBatchPayload,
  ): Promise<AttemptResult> {
    const { group, deadLetter, retry } = this.opts;
    const signal = this.abort.signal;
    const ctx = new DeliveryContext(batch, group, !!deadLetter, signal);
    if (handler) await runHandler(handler, batch, ctx, signal);
    // The handler finished: make its outputs durable and commit even if stop() was called
    // meanwhile (only the retries give up once stopping; the batch then stays uncommitted).
    const out = [...ctx.outputs, ...encodeDeadLetters([...ctx.deadLetters, ...extraDeadLetters], deadLetter, group)];
    for (const d of extraDeadLetters)
      await this.bus.withRetry(
        `recording a dead letter of ${group}`,
        () => deadLetter!.record?.(d) ?? Promise.resolve(),
        signal,
        retry,
      );
    if (out.length)
      await this.bus.withRetry(
        `producing ${out.length} outputs of ${group}`,
        () => this.bus.produce(out),
        signal,
        retry,
      );
    if (p.isStale()) return 'stale';
    const { topic, partition } = batch[0];
    const last = batch[batch.length - 1].offset;
    await this.bus.withRetry(
      `committing ${topic}[${partition}]@${last + 1} for ${group}`,
      () => p.commitOffsetsIfNecessary({ topics: [{ topic, partitions: [{ partition, offset: String(last + 1) }] }] }),
      signal,
      retry,
      needsRejoin,
    );
    p.resolveOffset(String(last));
    return 'committed';
  }

  private fail(err: unknown): void {
    if (this.state === 'stopped') return;
    this.log.error({ err }, `consumer of group ${this.opts.group} stops: ${errorMessage(err)}`);
    void this.shutdown().then(() => this.finish?.(err));
  }

  async stop(): Promise<void> {
    if (this.state === 'new') {
      this.state = 'stopped';
      this.bus.forget(this);
      return;
    }
    await this.shutdown();
    this.finish?.();
    await this.done?.catch(() => undefined);
  }

  private shutdown(): Promise<void> {
    this.stopping ??= (async () => {
      this.abort.abort();
      // Let the in-flight batch finish committing (or give up) before leaving the group.
      await this.inflight;
      try {
        await this.kc?.disconnect();
      } catch (e) {
        this.log.warn({ err: e }, 'kafka consumer disconnect failed');
      }
      this.assigned = [];
      this.state = 'stopped';
      this.bus.forget(this);
    })();
    return this.stopping;
  }

  async seek(topic: string, partition: number, offset: number): Promise<void> {
    if (this.state !== 'running' || !this.kc)
      throw new RlError(`seek: the consumer of group ${this.opts.group} is not running; call run() first`, {
        code: 'ERR_BUS_USAGE',
      });
    if (!Number.isInteger(offset) || offset < 0)
      throw new ConfigError(`seek: offset must be a non-negative integer, got ${offset}`);
    if (!this.assigned.some((a) => a.topic === topic && a.partition === partition)) {
      throw new RlError(
        `seek: ${topic}[${partition}] is not assigned to this member of group ${this.opts.group} (assigned: ${this.assigned.map((a) => `${a.topic}[${a.partition}]`).join(', ') || 'none'})`,
        { code: 'ERR_NOT_ASSIGNED', retriable: true },
      );
    }
    this.kc.seek({ topic, partition, offset: String(offset) });
    // The in-flight batch sees the seek (isStale) and does not commit; then commit the new
    // position, so the group resumes from here after a restart (as the embedded log does).
    await this.inflight;
    await this.kc.commitOffsets([{ topic, partition, offset: String(offset) }]);
  }

  async committed(): Promise<TopicPartitionOffset[]> {
    return this.bus.committedOffsets(this.opts.group, this.opts.topics);
  }
}

export function createKafkaBus(opts: KafkaBusOptions): KafkaBus {
  return new KafkaBus(opts);
}
