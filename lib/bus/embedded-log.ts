/**
 * The embedded event bus: a durable, Kafka-like log in the run's database (tables in
 * migrations/20261121_0002_event_log.sql). Over PGlite it is the single-process default and
 * survives `kill -9` (every append and commit is a committed transaction); over a real PostgreSQL
 * several processes on one machine share the log and split consumer groups without Kafka.
 *
 * Consumption: each batch runs in ONE transaction that
 *   1. locks the group's offset row for the partition (SELECT … FOR UPDATE) and checks it still
 *      starts at the batch's first offset and that this member still owns the partition
 *      (otherwise the batch is dropped as stale: another member has it);
 *   2. runs the handler, which may write its own rows through `ctx.tx`;
 *   3. appends the handler's outputs and dead letters;
 *   4. advances the offset.
 * So a batch's effects and its commit are all-or-nothing, and two members never process one
 * partition at once (the second blocks on the row lock, then sees the new offset).
 *
 * Group membership: each running consumer keeps a row in bus_members fresh (heartbeat); members
 * silent for `sessionTimeoutMs` are dropped, and partitions are assigned deterministically from
 * the live members (`assignPartitions`). A stopped consumer deletes its row, so the others take
 * over at once; a killed process's partitions move after the session timeout.
 *
 * New messages are noticed at once when this process appended to a consumed topic (a wake-up, or
 * a dirty flag when the consumer was mid-poll), and by polling with an idle backoff (from
 * `minPollMs` doubling to the consumer's `maxWaitMs`) for appends by other processes (PostgreSQL);
 * over PGlite no other process can append, so the idle poll waits `maxWaitMs` from the start.
 *
 * Over PGlite the bus also keeps end offsets, group positions, members and each partition's
 * recent tail in memory (lib/bus/embedded-local.ts), advanced after each commit: a hop then
 * writes its rows and reads nothing it already knows. Members need no heartbeat rows there.
 *
 * PGlite has one connection: inside a handler use `ctx.send` and `ctx.tx`, never the bus or the
 * database directly (that would wait for the batch's own transaction forever; the bus refuses it).
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import type { Logger } from 'pino';
import type { Database, Tx } from '../db/database.ts';
import { retriableDbError } from '../db/errors.ts';
import { ConfigError, RlError, errorMessage, isRetriable } from '../errors.ts';
import { silentLogger } from '../log.ts';
import { localLogOf, type Appended, type LocalLog } from './embedded-local.ts';
import { partitionFor } from './partitioner.ts';
import { validateTopicName, validateTopicSpecs } from './topics.ts';
import {
  Aborted,
  DeliveryContext,
  HandlerFailure,
  backoffMs,
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
import { crashPoint } from '../pipeline/crash-points.ts';

export interface EmbeddedBusOptions {
  database: Database;
  logger?: Logger;
  /** A member whose heartbeat is older than this loses its partitions (default 10 000 ms). */
  sessionTimeoutMs?: number;
  /** How often a running consumer refreshes its membership and assignment (default 1000 ms). */
  heartbeatIntervalMs?: number;
  /** First idle poll interval; doubles up to the consumer's maxWaitMs (default 5 ms). */
  minPollMs?: number;
  /** Also close the database on close() (default false: whoever opened it closes it). */
  closeDatabase?: boolean;
}

interface Member {
  member_id: string;
  topics: string[];
}

/**
 * Deterministic assignment: topic-partitions sorted by (topic, partition), each given round-robin
 * to the next member (sorted by id) subscribed to its topic. Every member computes the same map.
 */
export function assignPartitions(
  members: Member[],
  partitionsOf: ReadonlyMap<string, number>,
): Map<string, TopicPartition[]> {
  const sorted = [...members].sort((a, b) => (a.member_id < b.member_id ? -1 : a.member_id > b.member_id ? 1 : 0));
  const out = new Map<string, TopicPartition[]>(sorted.map((m) => [m.member_id, []]));
  const topics = [...new Set(sorted.flatMap((m) => m.topics))].sort();
  let i = 0;
  for (const topic of topics) {
    const n = partitionsOf.get(topic) ?? 0;
    const subs = sorted.filter((m) => m.topics.includes(topic));
    for (let p = 0; p < n; p++, i++) out.get(subs[i % subs.length].member_id)!.push({ topic, partition: p });
  }
  return out;
}

interface MessageRow {
  topic: string;
  partition: number;
  msg_offset: number;
  key: string | null;
  value: Buffer;
  headers: Record<string, string> | null;
  ts_ms: number;
}

const toBusMessage = (r: MessageRow): BusMessage => ({
  topic: r.topic,
  partition: r.partition,
  offset: Number(r.msg_offset),
  key: r.key,
  value: r.value,
  headers: r.headers ?? {},
  timestamp: Number(r.ts_ms),
});

const INSERT_MAX_ROWS = 500;
const INSERT_MAX_BYTES = 16 * 1024 * 1024;

export class EmbeddedBus implements EventBus {
  readonly kind = 'embedded' as const;
  readonly database: Database;
  readonly log: Logger;
  readonly sessionTimeoutMs: number;
  readonly heartbeatIntervalMs: number;
  readonly minPollMs: number;
  private readonly closeDatabase: boolean;
  /** PGlite: the log's state mirrored in memory (see embedded-local.ts); undefined over PostgreSQL. */
  readonly local?: LocalLog;
  private readonly partitionCounts = new Map<string, number>();
  private readonly waiters = new Set<{ topics: ReadonlySet<string>; wake: () => void }>();
  private readonly consumers = new Set<EmbeddedConsumer>();
  /** Set while a handler runs in a batch transaction of this bus. */
  readonly inHandler = new AsyncLocalStorage<string>();
  private closed = false;

  constructor(opts: EmbeddedBusOptions) {
    this.database = opts.database;
    this.log = (opts.logger ?? silentLogger()).child({ component: 'bus', bus: 'embedded' });
    this.sessionTimeoutMs = opts.sessionTimeoutMs ?? 10_000;
    this.heartbeatIntervalMs = opts.heartbeatIntervalMs ?? 1_000;
    this.minPollMs = opts.minPollMs ?? 5;
    this.closeDatabase = opts.closeDatabase ?? false;
    if (this.database.kind === 'pglite') this.local = localLogOf(this.database);
    if (this.heartbeatIntervalMs * 2 > this.sessionTimeoutMs) {
      throw new ConfigError(
        `embedded bus: heartbeatIntervalMs (${this.heartbeatIntervalMs}) must be at most half of sessionTimeoutMs (${this.sessionTimeoutMs})`,
      );
    }
  }

  get db(): Kysely<any> {
    return this.database.db;
  }

  /** True when no other process can append to this log (PGlite: one process holds the run directory). */
  get localOnly(): boolean {
    return this.database.kind === 'pglite';
  }

  /**
   * Refuses direct database use from inside a handler on PGlite, which would deadlock on its single
   * connection; `viaTx`: the call runs in the batch's own transaction (ctx.tx), which is allowed.
   */
  guard(op: string, viaTx = false): void {
    if (this.closed) throw new RlError(`embedded bus: ${op} after close()`, { code: 'ERR_BUS_CLOSED' });
    const group = this.inHandler.getStore();
    if (!viaTx && group !== undefined && this.database.kind === 'pglite') {
      throw new RlError(
        `embedded bus: ${op} called inside a batch handler of group ${group}; PGlite has one connection, held by the batch's transaction — use ctx.send(...) for outputs and ctx.tx for reads and writes`,
        { code: 'ERR_BUS_USAGE' },
      );
    }
  }

  async ensureTopics(specs: TopicSpec[]): Promise<void> {
    this.guard('ensureTopics');
    validateTopicSpecs(specs);
    await this.db.transaction().execute(async (tx) => {
      for (const s of specs) {
        await sql`insert into bus_topics (name, partitions) values (${s.name}, ${s.partitions}) on conflict (name) do nothing`.execute(
          tx,
        );
        const have = Number(
          (await sql<{ partitions: number }>`select partitions from bus_topics where name = ${s.name}`.execute(tx))
            .rows[0].partitions,
        );
        if (have !== s.partitions) {
          throw new ConfigError(
            `topic ${s.name} already exists with ${have} partitions, not ${s.partitions}; keyed routing depends on the count — use the existing count or a new topic`,
          );
        }
        await sql`insert into bus_partitions (topic, partition) select ${s.name}, g from generate_series(0, ${s.partitions - 1}::int) g on conflict do nothing`.execute(
          tx,
        );
      }
    });
    for (const s of specs) this.partitionCounts.set(s.name, s.partitions);
  }

  /** Partition count of a topic (cached; topics never shrink). Throws a ConfigError for an unknown topic. */
  async partitionsOf(q: Kysely<any>, topic: string): Promise<number> {
    const cached = this.partitionCounts.get(topic);
    if (cached !== undefined) return cached;
    validateTopicName(topic);
    const r = await sql<{ partitions: number }>`select partitions from bus_topics where name = ${topic}`.execute(q);
    if (!r.rows.length)
      throw new ConfigError(
        `topic ${topic} does not exist in the embedded log; create it first with ensureTopics([{ name: '${topic}', partitions: N }])`,
      );
    const n = Number(r.rows[0].partitions);
    this.partitionCounts.set(topic, n);
    return n;
  }

  /**
   * Appends messages in the caller's transaction: per partition (locked in sorted order, so
   * concurrent appenders never deadlock), advance the counter and insert the rows. Returns the
   * topics written and, for the in-memory mirror, what was appended where (apply it once the
   * transaction has committed: `committed()`).
   */
  async append(tx: Kysely<any>, messages: OutMessage[]): Promise<{ topics: string[]; appended: Appended[] }> {
    if (!messages.length) return { topics: [], appended: [] };
    const nowMs = Date.now();
    const ts = new Date(nowMs);
    const appended: Appended[] = [];
    const groups = new Map<string, { topic: string; partition: number; msgs: OutMessage[] }>();
    for (const m of messages) {
      validateOutMessage(m);
      const n = await this.partitionsOf(tx, m.topic);
      const partition = m.partition ?? partitionFor(m.key, n);
      if (partition >= n)
        throw new ConfigError(
          `message to ${m.topic} names partition ${partition}, but the topic has ${n} partitions (0..${n - 1})`,
        );
      const k = `${m.topic}\u0000${partition}`;
      let g = groups.get(k);
      if (!g) groups.set(k, (g = { topic: m.topic, partition, msgs: [] }));
      g.msgs.push(m);
    }
    const ordered = [...groups.values()].sort((a, b) =>
      a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition,
    );
    for (const g of ordered) {
      const r = await sql<{
        next_offset: number;
      }>`update bus_partitions set next_offset = next_offset + ${g.msgs.length} where topic = ${g.topic} and partition = ${g.partition} returning next_offset`.execute(
        tx,
      );
      if (!r.rows.length)
        throw new RlError(`embedded log: partition ${g.topic}[${g.partition}] has no row in bus_partitions`, {
          code: 'ERR_BUS_CORRUPT',
        });
      let offset = Number(r.rows[0].next_offset) - g.msgs.length;
      if (this.local) {
        appended.push({
          topic: g.topic,
          partition: g.partition,
          base: offset,
          msgs: g.msgs.map((m, i) => ({
            topic: g.topic,
            partition: g.partition,
            offset: offset + i,
            key: m.key,
            value: Buffer.from(m.value),
            headers: { ...(m.headers ?? {}) },
            timestamp: nowMs,
          })),
        });
      }
      for (let i = 0; i < g.msgs.length;) {
        const rows: Array<Record<string, unknown>> = [];
        let bytes = 0;
        while (
          i < g.msgs.length &&
          rows.length < INSERT_MAX_ROWS &&
          (rows.length === 0 || bytes + g.msgs[i].value.length <= INSERT_MAX_BYTES)
        ) {
          const m = g.msgs[i++];
          bytes += m.value.length;
          rows.push({
            topic: g.topic,
            partition: g.partition,
            msg_offset: offset++,
            key: m.key,
            value: m.value,
            headers: JSON.stringify(m.headers ?? {}),
            ts,
          });
        }
        await tx.insertInto('bus_messages').values(rows).execute();
      }
    }
    return { topics: [...new Set(ordered.map((g) => g.topic))], appended };
  }

  /** After the transaction that appended `appended` committed: advance the mirror. */
  committed(appended: readonly Appended[]): void {
    this.local?.committed(appended);
  }

  async produce(messages: OutMessage[]): Promise<void> {
    this.guard('produce');
    if (!messages.length) return;
    const { topics, appended } = await this.db.transaction().execute((tx) => this.append(tx, messages));
    this.committed(appended);
    this.notify(topics);
  }

  /** PGlite: reads a topic's end offsets into the mirror the first time it is needed. */
  async loadTopic(topic: string): Promise<void> {
    if (!this.local || this.local.hasTopic(topic)) return;
    const r = await sql<{
      partition: number;
      next_offset: number;
    }>`select partition, next_offset from bus_partitions where topic = ${topic}`.execute(this.db);
    this.local.loadTopic(topic, r.rows);
  }

  /** Wakes this process's consumers of these topics (and marks them dirty, should one be mid-poll). */
  notify(topics: string[]): void {
    if (!topics.length) return;
    for (const c of this.consumers) c.markDirty(topics);
    for (const w of this.waiters) if (topics.some((t) => w.topics.has(t))) w.wake();
  }

  /** Waits up to `ms` for an append to one of `topics` in this process, a wake-up, or abort. */
  waitFor(topics: ReadonlySet<string>, ms: number, signal: AbortSignal, extra?: { wake?: () => void }): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        this.waiters.delete(w);
        signal.removeEventListener('abort', done);
        if (extra) extra.wake = undefined;
        resolve();
      };
      const w = { topics, wake: done };
      const timer = setTimeout(done, ms);
      this.waiters.add(w);
      signal.addEventListener('abort', done, { once: true });
      if (extra) extra.wake = done;
    });
  }

  consumer(opts: ConsumerOptions): Consumer {
    if (this.closed) throw new RlError('embedded bus: consumer() after close()', { code: 'ERR_BUS_CLOSED' });
    const c = new EmbeddedConsumer(this, resolveConsumerOptions(opts));
    for (const t of c.opts.topics) validateTopicName(t);
    if (c.opts.deadLetter) validateTopicName(c.opts.deadLetter.topic);
    this.consumers.add(c);
    return c;
  }

  forget(c: EmbeddedConsumer): void {
    this.consumers.delete(c);
  }

  /** PGlite: a member joined or left — every consumer of the group here recomputes its partitions. */
  async refreshGroup(group: string): Promise<void> {
    for (const c of [...this.consumers]) if (c.opts.group === group) await c.refreshAssignment();
  }

  async endOffsets(topic: string): Promise<number[]> {
    this.guard('endOffsets');
    const n = await this.partitionsOf(this.db, topic);
    if (this.local) {
      await this.loadTopic(topic);
      return Array.from({ length: n }, (_, p) => this.local!.end(topic, p));
    }
    const r = await sql<{
      partition: number;
      next_offset: number;
    }>`select partition, next_offset from bus_partitions where topic = ${topic} order by partition`.execute(this.db);
    const out = new Array<number>(n).fill(0);
    for (const row of r.rows) out[row.partition] = Number(row.next_offset);
    return out;
  }

  async read(topic: string, partition: number, fromOffset: number, max: number, tx?: Tx): Promise<BusMessage[]> {
    this.guard('read', tx !== undefined);
    const q = tx ?? this.db;
    const n = await this.partitionsOf(q, topic);
    if (!Number.isInteger(partition) || partition < 0 || partition >= n)
      throw new ConfigError(`read: topic ${topic} has partitions 0..${n - 1}, not ${partition}`);
    if (max <= 0) return [];
    const tail = this.local?.fromTail(topic, partition, Math.max(0, fromOffset), Math.floor(max));
    if (tail) return tail;
    const r = await sql<MessageRow>`
      select topic, partition, msg_offset, key, value, headers, (extract(epoch from ts) * 1000)::int8 as ts_ms
      from bus_messages where topic = ${topic} and partition = ${partition} and msg_offset >= ${Math.max(0, fromOffset)}
      order by msg_offset limit ${Math.floor(max)}`.execute(q);
    return r.rows.map(toBusMessage);
  }

  /**
   * One partition's next batch from `from`: at most `maxMessages`, and at most `maxBytes` of
   * values unless the first message alone is larger. Sizes are read without loading values.
   */
  async fetchBatch(
    topic: string,
    partition: number,
    from: number,
    maxMessages: number,
    maxBytes: number,
  ): Promise<BusMessage[]> {
    const tail = this.local?.fromTail(topic, partition, from, maxMessages, maxBytes);
    if (tail) return tail;
    const r = await sql<MessageRow>`
      select topic, partition, msg_offset, key, value, headers, (extract(epoch from ts) * 1000)::int8 as ts_ms from (
        select m.*, sum(octet_length(m.value)) over (order by m.msg_offset rows unbounded preceding) as cum
        from bus_messages m where m.topic = ${topic} and m.partition = ${partition} and m.msg_offset >= ${from}
        order by m.msg_offset limit ${maxMessages}
      ) s where s.cum <= ${maxBytes} or s.msg_offset = ${from}
      order by msg_offset`.execute(this.db);
    return r.rows.map(toBusMessage);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await Promise.all([...this.consumers].map((c) => c.stop()));
    this.closed = true;
    if (this.closeDatabase) await this.database.close();
  }
}

class EmbeddedConsumer implements Consumer {
  readonly memberId = randomUUID();
  private readonly abort = new AbortController();
  private state: 'new' | 'running' | 'stopped' = 'new';
  private done?: Promise<void>;
  private assigned: TopicPartition[] = [];
  private readonly topicSet: ReadonlySet<string>;
  private readonly waker: { wake?: () => void } = {};
  private readonly log: Logger;
  /** Set when this process appended to a consumed topic since the current poll began. */
  private dirty = false;

  constructor(
    private readonly bus: EmbeddedBus,
    readonly opts: ResolvedConsumerOptions,
  ) {
    this.topicSet = new Set(opts.topics);
    this.log = bus.log.child({ group: opts.group, member: this.memberId.slice(0, 8) });
  }

  assignment(): TopicPartition[] {
    return this.assigned.map((a) => ({ ...a }));
  }

  markDirty(topics: string[]): void {
    if (topics.some((t) => this.topicSet.has(t))) this.dirty = true;
  }

  async run(handler: BatchHandler): Promise<void> {
    if (this.state !== 'new')
      throw new RlError(
        `consumer of group ${this.opts.group} was already ${this.state === 'running' ? 'started' : 'stopped'}; create a new one`,
        { code: 'ERR_BUS_USAGE' },
      );
    this.bus.guard('consumer.run');
    this.state = 'running';
    let release!: () => void;
    this.done = new Promise((r) => {
      release = r;
    });
    const heartbeats = { stop: false, loop: Promise.resolve() };
    try {
      const joined = await this.retryingLostConnection('join', async () => {
        for (const t of this.opts.topics) {
          await this.bus.partitionsOf(this.bus.db, t);
          await this.bus.loadTopic(t);
        }
        if (this.opts.deadLetter) await this.bus.partitionsOf(this.bus.db, this.opts.deadLetter.topic);
        await this.join();
      });
      if (!joined) return;
      // PGlite: members live in memory (no other process can join), so there is nothing to refresh
      if (!this.bus.local) heartbeats.loop = this.heartbeatLoop();
      await this.pollLoop(handler);
    } finally {
      this.abort.abort();
      await heartbeats.loop.catch(() => undefined);
      await this.leave().catch((e) =>
        this.log.warn({ err: e }, 'could not remove the group member row (it expires after the session timeout)'),
      );
      this.state = 'stopped';
      this.bus.forget(this);
      release();
    }
  }

  async stop(): Promise<void> {
    if (this.state === 'new') {
      this.state = 'stopped';
      this.bus.forget(this);
      return;
    }
    this.abort.abort();
    await this.done;
  }

  private async join(): Promise<void> {
    const { group, topics } = this.opts;
    const local = this.bus.local;
    await this.bus.db.transaction().execute(async (tx) => {
      // idempotent: a join retried after a lost connection may find its row committed
      if (!local)
        await sql`insert into bus_members (group_id, member_id, topics) values (${group}, ${this.memberId}, ${topics}::text[])
        on conflict (group_id, member_id) do update set heartbeat_at = now(), topics = excluded.topics`.execute(tx);
      if (!this.opts.fromBeginning) {
        // A new group starts at the end as of joining (Kafka's fromBeginning: false).
        await sql`insert into bus_offsets (group_id, topic, partition, next_offset)
          select ${group}, topic, partition, next_offset from bus_partitions where topic = any(${topics}::text[])
          on conflict do nothing`.execute(tx);
      }
    });
    if (local) {
      const r = await sql<{
        topic: string;
        partition: number;
        next_offset: number;
      }>`select topic, partition, next_offset from bus_offsets
        where group_id = ${group} and topic = any(${topics}::text[])`.execute(this.bus.db);
      for (const row of r.rows) local.setPosition(group, row.topic, row.partition, Number(row.next_offset));
      local.join(group, this.memberId, topics);
      await this.bus.refreshGroup(group);
      return;
    }
    await this.refreshAssignment();
  }

  private async leave(): Promise<void> {
    const local = this.bus.local;
    if (local) {
      local.leave(this.opts.group, this.memberId);
      this.bus.forget(this);
      await this.bus.refreshGroup(this.opts.group);
      return;
    }
    await sql`delete from bus_members where group_id = ${this.opts.group} and member_id = ${this.memberId}`.execute(
      this.bus.db,
    );
  }

  private async heartbeatLoop(): Promise<void> {
    const signal = this.abort.signal;
    while (!signal.aborted) {
      if (!(await sleep(this.bus.heartbeatIntervalMs, signal))) return;
      try {
        await this.heartbeat();
      } catch (e) {
        if (!signal.aborted) this.log.warn({ err: e }, `group heartbeat failed: ${(e as Error).message}`);
      }
    }
  }

  private async heartbeat(): Promise<void> {
    const { group, topics } = this.opts;
    await sql`insert into bus_members (group_id, member_id, topics) values (${group}, ${this.memberId}, ${topics}::text[])
      on conflict (group_id, member_id) do update set heartbeat_at = now(), topics = excluded.topics`.execute(
      this.bus.db,
    );
    await sql`delete from bus_members where group_id = ${group} and heartbeat_at < now() - ${this.bus.sessionTimeoutMs} * interval '1 millisecond'`.execute(
      this.bus.db,
    );
    await this.refreshAssignment();
  }

  private async liveMembers(q: Kysely<any>): Promise<Member[]> {
    if (this.bus.local) return this.bus.local.membersOf(this.opts.group);
    const r = await sql<Member>`select member_id, topics from bus_members
      where group_id = ${this.opts.group} and heartbeat_at >= now() - ${this.bus.sessionTimeoutMs} * interval '1 millisecond'`.execute(
      q,
    );
    return r.rows;
  }

  private async assignmentFrom(q: Kysely<any>): Promise<TopicPartition[]> {
    const members = await this.liveMembers(q);
    const counts = new Map<string, number>();
    for (const t of new Set(members.flatMap((m) => m.topics))) {
      try {
        counts.set(t, await this.bus.partitionsOf(q, t));
      } catch {
        /* a member subscribed to a topic that does not exist: it gets nothing of it */
      }
    }
    return assignPartitions(members, counts).get(this.memberId) ?? [];
  }

  async refreshAssignment(): Promise<void> {
    const next = await this.assignmentFrom(this.bus.db);
    const key = (l: TopicPartition[]) => l.map((a) => `${a.topic}/${a.partition}`).join(',');
    if (key(next) !== key(this.assigned)) {
      this.log.debug({ assignment: key(next) }, 'partition assignment changed');
      this.assigned = next;
      this.waker.wake?.();
    }
  }

  /**
   * `fn` until it succeeds, retrying a lost connection (a database restart, a terminated backend)
   * with the consumer's backoff; anything else is thrown (it stops the consumer). Its value, or
   * null when stopped meanwhile. Joining and every poll go through here.
   */
  private async retryingLostConnection<T>(what: string, fn: () => Promise<T>): Promise<{ value: T } | null> {
    const signal = this.abort.signal;
    for (let failures = 0; !signal.aborted;) {
      try {
        return { value: await fn() };
      } catch (e) {
        const err = retriableDbError(e, `consumer group ${this.opts.group}: ${what}`);
        if (signal.aborted) return null;
        if (!isRetriable(err)) throw err;
        const ms = backoffMs(failures++, this.opts.retry.initialMs, this.opts.retry.maxMs);
        this.log.warn(
          { err: e, retry_in_ms: Math.round(ms) },
          `embedded log ${what} failed, retrying: ${errorMessage(e)}`,
        );
        await sleep(ms, signal);
      }
    }
    return null;
  }

  private async pollLoop(handler: BatchHandler): Promise<void> {
    const { opts } = this;
    const signal = this.abort.signal;
    let idleMs = this.bus.minPollMs;
    let rotate = 0;
    while (!signal.aborted) {
      this.dirty = false;
      // a lost connection (database restart) is retried; anything else stops the consumer
      const polled = await this.retryingLostConnection('poll', () => this.pollOnce(handler, rotate++));
      if (!polled) return;
      if (polled.value) {
        idleMs = this.bus.minPollMs;
        continue;
      }
      // something was appended here while this poll ran: look again at once
      if (this.dirty) continue;
      await this.bus.waitFor(this.topicSet, idleMs, signal, this.waker);
      // PGlite: only this process can append (the run directory is locked), and every append
      // wakes its consumers, so the idle poll is a safety net, not a latency path — no ramp
      idleMs = this.bus.localOnly ? opts.maxWaitMs : Math.min(idleMs * 2, opts.maxWaitMs);
    }
  }

  /** One pass over the owned partitions with unconsumed messages: a batch from each. Whether any committed. */
  private async pollOnce(handler: BatchHandler, rotate: number): Promise<boolean> {
    const { opts } = this;
    const signal = this.abort.signal;
    const mine = new Set(this.assigned.map((a) => `${a.topic}\u0000${a.partition}`));
    if (!mine.size) return false;
    const local = this.bus.local;
    const rows = local
      ? this.assigned.map((a) => ({
          topic: a.topic,
          partition: a.partition,
          end: local.end(a.topic, a.partition),
          position: local.position(opts.group, a.topic, a.partition),
        }))
      : (
          await sql<{ topic: string; partition: number; end_offset: number; position: number | null }>`
      select p.topic, p.partition, p.next_offset as end_offset, o.next_offset as position
      from bus_partitions p left join bus_offsets o on o.group_id = ${opts.group} and o.topic = p.topic and o.partition = p.partition
      where p.topic = any(${opts.topics}::text[])`.execute(this.bus.db)
        ).rows
          .filter((row) => mine.has(`${row.topic}\u0000${row.partition}`))
          .map((row) => ({
            topic: row.topic,
            partition: row.partition,
            end: Number(row.end_offset),
            position: row.position === null ? 0 : Number(row.position),
          }));
    const work = rows
      .filter((row) => row.end > row.position)
      .sort((a, b) => (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
    let progressed = false;
    for (let i = 0; i < work.length && !signal.aborted; i++) {
      const w = work[(i + rotate) % work.length];
      const batch = await this.bus.fetchBatch(
        w.topic,
        w.partition,
        w.position,
        opts.maxBatchMessages,
        opts.maxBatchBytes,
      );
      if (!batch.length) continue;
      const res = await deliver(batch, handler, {
        opts,
        log: this.log,
        signal,
        attempt: (b, h, dl) => this.attempt(b, h, dl),
      });
      if (res === 'committed') progressed = true;
    }
    return progressed;
  }

  private async attempt(
    batch: BusMessage[],
    handler: BatchHandler | null,
    extraDeadLetters: DeadLetterInfo[],
  ): Promise<AttemptResult> {
    const { group, deadLetter } = this.opts;
    const { topic, partition } = batch[0];
    const first = batch[0].offset;
    const last = batch[batch.length - 1].offset;
    const signal = this.abort.signal;
    let written: string[] = [];
    let appended: Appended[] = [];
    let committedAt: number | undefined;
    const result = await this.bus.db
      .transaction()
      .execute(async (tx): Promise<AttemptResult> => {
        const lockRow = () =>
          sql<{ next_offset: number }>`select next_offset from bus_offsets
        where group_id = ${group} and topic = ${topic} and partition = ${partition} for update`.execute(tx);
        let row = (await lockRow()).rows[0];
        if (!row) {
          await sql`insert into bus_offsets (group_id, topic, partition, next_offset) values (${group}, ${topic}, ${partition}, 0) on conflict do nothing`.execute(
            tx,
          );
          row = (await lockRow()).rows[0];
        }
        committedAt = Number(row.next_offset);
        if (committedAt !== first) return 'stale';
        const owners = await this.assignmentFrom(tx);
        if (!owners.some((a) => a.topic === topic && a.partition === partition)) return 'stale';
        const ctx = new DeliveryContext(batch, group, !!deadLetter, signal, tx);
        if (handler) await this.bus.inHandler.run(group, () => runHandler(handler, batch, ctx, signal));
        const out = [
          ...ctx.outputs,
          ...encodeDeadLetters([...ctx.deadLetters, ...extraDeadLetters], deadLetter, group),
        ];
        for (const d of extraDeadLetters) await deadLetter?.record?.(d, tx);
        ({ topics: written, appended } = await this.bus.append(tx, out));
        await sql`update bus_offsets set next_offset = ${last + 1}, updated_at = now()
        where group_id = ${group} and topic = ${topic} and partition = ${partition}`.execute(tx);
        return 'committed';
      })
      .catch((e) => {
        // A lost connection is retriable, whether the bus's statements or the handler's (through
        // ctx.tx) saw it: the transaction is gone, the batch is redone. Other errors keep their flag.
        const what = `consumer group ${group}: batch ${topic}[${partition}]@${first}`;
        if (e instanceof Aborted) throw e;
        if (e instanceof HandlerFailure) throw new HandlerFailure(retriableDbError(e.error, what));
        throw retriableDbError(e, what);
      });
    if (result === 'stale')
      this.log.debug(
        { topic, partition, first },
        'batch is stale (partition moved or offset changed); dropped uncommitted',
      );
    if (result === 'committed') {
      crashPoint('bus:committed', `${group} ${topic}[${partition}]@${last + 1}`);
      this.bus.local?.setPosition(group, topic, partition, last + 1);
      this.bus.committed(appended);
    } else if (committedAt !== undefined) {
      // the mirror was behind the table (cannot happen with one writer, but never loop on it)
      this.bus.local?.setPosition(group, topic, partition, committedAt, true);
    }
    this.bus.notify(written);
    return result;
  }

  async seek(topic: string, partition: number, offset: number): Promise<void> {
    this.bus.guard('seek');
    if (!this.topicSet.has(topic))
      throw new ConfigError(
        `seek: group ${this.opts.group} does not consume topic ${topic} (it consumes ${this.opts.topics.join(', ')})`,
      );
    const ends = await this.bus.endOffsets(topic);
    if (!Number.isInteger(partition) || partition < 0 || partition >= ends.length)
      throw new ConfigError(`seek: topic ${topic} has partitions 0..${ends.length - 1}, not ${partition}`);
    if (!Number.isInteger(offset) || offset < 0 || offset > ends[partition])
      throw new ConfigError(`seek: offset ${offset} is outside ${topic}[${partition}] (0..${ends[partition]})`);
    await sql`insert into bus_offsets (group_id, topic, partition, next_offset) values (${this.opts.group}, ${topic}, ${partition}, ${offset})
      on conflict (group_id, topic, partition) do update set next_offset = excluded.next_offset, updated_at = now()`.execute(
      this.bus.db,
    );
    this.bus.local?.setPosition(this.opts.group, topic, partition, offset, true);
    this.waker.wake?.();
  }

  async committed(): Promise<TopicPartitionOffset[]> {
    this.bus.guard('committed');
    const r = await sql<{
      topic: string;
      partition: number;
      next_offset: number;
    }>`select topic, partition, next_offset from bus_offsets
      where group_id = ${this.opts.group} and topic = any(${this.opts.topics}::text[]) order by topic, partition`.execute(
      this.bus.db,
    );
    return r.rows.map((x) => ({ topic: x.topic, partition: x.partition, offset: Number(x.next_offset) }));
  }
}

export function createEmbeddedBus(opts: EmbeddedBusOptions): EmbeddedBus {
  return new EmbeddedBus(opts);
}
