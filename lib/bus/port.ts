/**
 * The event bus port: topics split into partitions, keyed produce, consumer groups with committed
 * offsets, seek, and batch consumption with retry and dead-lettering. Two adapters implement it
 * with the same semantics and are checked by one contract suite (test/support/bus-contract.ts):
 *
 *  - `embedded-log.ts`: a durable log in the run's database (PGlite, or a shared PostgreSQL so
 *    several processes on one machine can share a log without Kafka). A batch's outputs, its
 *    dead letters, the store writes the handler made through `ctx.tx` and the group's new offset
 *    commit in ONE transaction: exactly-once inside the database.
 *  - `kafka-log.ts`: kafkajs. Outputs are produced with acks=all and awaited, then the offsets
 *    are committed: at-least-once (no Kafka transactions); consumers deduplicate by id.
 *
 * Semantics shared by both:
 *  - A batch holds messages of ONE partition, in offset order.
 *  - Keyed partitioning is murmur2(key) mod partitions (`partitioner.ts`, Kafka's default), so a
 *    topic replayed from one adapter into the other lands in the same partitions.
 *  - Handler errors are read through `isRetriable` (lib/errors.ts): a retriable error redelivers
 *    the same batch after a jittered, capped exponential backoff (nothing committed); a
 *    non-retriable one splits the batch and re-runs the handler on each message alone; a single
 *    message that still fails is dead-lettered with the error's message as reason, and the
 *    consumer keeps going. Every offset ends up processed or dead-lettered; nothing is lost.
 */
import type { Tx } from '../db/database.ts';

export interface OutMessage {
  topic: string;
  /** Partitioning key: all messages with one key land in one partition, in produce order. */
  key: string;
  value: Buffer;
  headers?: Record<string, string>;
  /** Explicit partition (overrides the key's partition). */
  partition?: number;
}

export interface BusMessage {
  topic: string;
  partition: number;
  offset: number;
  key: string | null;
  value: Buffer;
  headers: Record<string, string>;
  /** Append time, unix epoch ms. */
  timestamp: number;
}

export interface TopicSpec {
  name: string;
  partitions: number;
}

export interface DeadLetterInfo {
  message: BusMessage;
  group: string;
  reason: string;
  error?: unknown;
  /** Handler runs that included this message before it was dead-lettered (0: the handler chose to). */
  attempts: number;
}

export interface DeadLetterOptions {
  topic: string;
  /** Builds the dead-letter record (the caller supplies the Avro encoding). Its `topic` is replaced by `topic` above. */
  encode(info: DeadLetterInfo): OutMessage;
  /**
   * Records a dead letter the delivery policy made (a message the handler failed on) where users
   * look for it (the store's `dead_letters`), in the batch's transaction when the bus has one.
   * Dead letters a handler makes itself (`ctx.deadLetter`) are recorded by that handler.
   */
  record?(info: DeadLetterInfo, tx?: import('../db/database.ts').Tx): Promise<void>;
}

export interface RetryOptions {
  /** Handler runs of one batch with retriable errors before the consumer gives up and `run()` rejects (nothing committed). Default: unlimited. */
  maxAttempts?: number;
  /** First backoff, ms (default 100). */
  initialMs?: number;
  /** Backoff cap, ms (default 10 000). */
  maxMs?: number;
}

export interface ConsumerOptions {
  /** Consumer group: one per stage. Members of a group split the partitions between them. */
  group: string;
  topics: string[];
  /** Where a group with no committed offset starts: the beginning (default) or the current end. */
  fromBeginning?: boolean;
  /** Most messages per batch (default 500). */
  maxBatchMessages?: number;
  /** Most value bytes per batch (default 8 MiB); a single larger message is delivered alone. */
  maxBatchBytes?: number;
  /** Longest wait for new messages before polling again, ms (Kafka: fetch max wait; default 250). */
  maxWaitMs?: number;
  /** Where messages that cannot be processed go. Without it, such a message stops the consumer (`run()` rejects, nothing committed). */
  deadLetter?: DeadLetterOptions;
  retry?: RetryOptions;
}

export interface BatchContext {
  /** Buffer outputs; they are made durable BEFORE the input offsets are committed (embedded: same DB transaction). */
  send(messages: OutMessage[]): void;
  /** Dead-letter one message of this batch with a reason; its offset is committed with the batch. */
  deadLetter(message: BusMessage, reason: string, error?: unknown): void;
  /** Embedded adapter: the Kysely transaction the batch commits in, so stores can write in it. Kafka: undefined. */
  readonly tx?: Tx;
  /** Aborted when the consumer stops: the batch will not be committed, so stop work early. */
  readonly signal: AbortSignal;
}

export type BatchHandler = (batch: BusMessage[], ctx: BatchContext) => Promise<void>;

export interface TopicPartition {
  topic: string;
  partition: number;
}
export interface TopicPartitionOffset extends TopicPartition {
  offset: number;
}

export interface Consumer {
  /** Consumes until `stop()`; resolves then. Rejects on a fatal error (the consumer has stopped, nothing uncommitted was lost). */
  run(handler: BatchHandler): Promise<void>;
  /** Stops consuming. An in-flight batch is abandoned uncommitted (it will be redelivered). */
  stop(): Promise<void>;
  /**
   * Moves the group's position for one partition: the next batch from it starts at `offset`,
   * and the position is committed, so a restarted member resumes there too. Kafka: the
   * partition must be assigned to this consumer (see `assignment()`).
   */
  seek(topic: string, partition: number, offset: number): Promise<void>;
  /** The group's committed offsets (next offset to consume) for this consumer's topics. */
  committed(): Promise<TopicPartitionOffset[]>;
  /** Partitions currently assigned to this member of the group. */
  assignment(): TopicPartition[];
}

export interface EventBus {
  readonly kind: 'embedded' | 'kafka';
  /** Creates missing topics; an existing topic with another partition count is an error. */
  ensureTopics(specs: TopicSpec[]): Promise<void>;
  /** Appends; resolves when durable (Kafka: acks=all; embedded: committed rows). Order is kept per partition. */
  produce(messages: OutMessage[]): Promise<void>;
  consumer(opts: ConsumerOptions): Consumer;
  /** Next offset per partition (index = partition). */
  endOffsets(topic: string): Promise<number[]>;
  /**
   * Replay/inspection without a group: up to `max` messages of one partition from `fromOffset`.
   * `tx`: a batch's transaction to read in (embedded: the log is in that database; Kafka: unused).
   */
  read(topic: string, partition: number, fromOffset: number, max: number, tx?: Tx): Promise<BusMessage[]>;
  /** Stops every consumer of this bus and releases connections. */
  close(): Promise<void>;
}
