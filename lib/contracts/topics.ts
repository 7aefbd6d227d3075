/**
 * The topics of the pipeline: logical name, schema family, message key and default partition
 * count. Topics are per run — `<prefix>.<run_id>.<topic>` — so a replay into a new run writes
 * its own topics and never mixes with the source run's.
 *
 *   prompts       controller → rollout     PromptBatch     key: hashId(batch id) (= group_uid for one group)
 *   trajectories  rollout → reward         TrajectoryGroup key: group_uid
 *   scored        reward → advantage       ScoredGroup     key: group_uid (kind = train)
 *   validation    reward → controller      ScoredGroup     key: group_uid (kind = val)
 *   updates       advantage → update       UpdateGroup     key: group_uid
 *   policy        update → all             PolicyVersion   key: id
 *   metrics       any → store              MetricsRecord   key: id
 *   control       controller ⇄ all         ControlEvent    key: id
 *   deadletter    any → operators          DeadLetter      key: id
 *
 * Keys spread a step's groups over partitions so replicas of a stage share the load; ordering
 * across groups is never relied on (stages order by deterministic id).
 */
import { ConfigError } from '../errors.ts';
import { createMessageCodec, type CodecOptions, type MessageCodec } from './codec.ts';
import { assertRunId, hashId } from './ids.ts';
import { HttpSchemaRegistry, type SchemaRegistry } from './registry.ts';
import type { SchemaFamily } from './schemas.ts';
import type { SchemaValues } from './types.ts';

export const LOGICAL_TOPICS = [
  'prompts',
  'trajectories',
  'scored',
  'validation',
  'updates',
  'policy',
  'metrics',
  'control',
  'deadletter',
] as const;
export type LogicalTopic = (typeof LOGICAL_TOPICS)[number];

/** Schema family of each topic. */
export const TOPIC_FAMILY = {
  prompts: 'prompts',
  trajectories: 'trajectories',
  scored: 'scored',
  validation: 'scored',
  updates: 'updates',
  policy: 'policy',
  metrics: 'metrics',
  control: 'control',
  deadletter: 'deadletter',
} as const satisfies Record<LogicalTopic, SchemaFamily>;

/** Record type carried by a topic. */
export type TopicValue<K extends LogicalTopic> = SchemaValues[(typeof TOPIC_FAMILY)[K]];

export interface TopicSpec<K extends LogicalTopic> {
  name: K;
  family: (typeof TOPIC_FAMILY)[K];
  /** Partitions when the topic is created (pipeline.partitions may override). */
  partitions: number;
  /** Message key of a record. */
  key(value: TopicValue<K>): string;
  description: string;
}

const byId = (v: { id: string }) => v.id;
const byGroup = (v: { group_uid: string }) => v.group_uid;

export const TOPICS: { [K in LogicalTopic]: TopicSpec<K> } = {
  prompts: {
    name: 'prompts',
    family: 'prompts',
    partitions: 4,
    key: (v) => hashId(v.id),
    description: 'controller → rollout: prompt groups to sample',
  },
  trajectories: {
    name: 'trajectories',
    family: 'trajectories',
    partitions: 6,
    key: byGroup,
    description: 'rollout → reward: a group with its n samples and behaviour log-probs',
  },
  scored: {
    name: 'scored',
    family: 'scored',
    partitions: 6,
    key: byGroup,
    description: 'reward → advantage: a training group with a reward or failure per sample',
  },
  validation: {
    name: 'validation',
    family: 'scored',
    partitions: 2,
    key: byGroup,
    description: 'reward → controller: a scored validation group',
  },
  updates: {
    name: 'updates',
    family: 'updates',
    partitions: 6,
    key: byGroup,
    description: 'advantage → update: a group with per-token advantages, returns, ref log-probs and loss weights',
  },
  policy: {
    name: 'policy',
    family: 'policy',
    partitions: 1,
    key: byId,
    description: 'update → all: new policy versions and checkpoints',
  },
  metrics: {
    name: 'metrics',
    family: 'metrics',
    partitions: 1,
    key: byId,
    description: 'any → store: metrics of a stage for a step',
  },
  control: {
    name: 'control',
    family: 'control',
    partitions: 1,
    key: byId,
    description: 'run lifecycle and refill requests',
  },
  deadletter: {
    name: 'deadletter',
    family: 'deadletter',
    partitions: 1,
    key: byId,
    description: 'messages a stage gave up on, with why',
  },
};

const PREFIX_RE = /^[A-Za-z0-9._-]+$/;
/** Kafka's limit on topic names. */
export const MAX_TOPIC_NAME = 249;

/** The Kafka topic of a logical topic in a run: `<prefix>.<runId>.<logical>`. */
export function topicName(prefix: string, runId: string, logical: LogicalTopic): string {
  if (!PREFIX_RE.test(prefix))
    throw new ConfigError(
      `pipeline.topic_prefix ${JSON.stringify(prefix)} may contain only letters, digits, '.', '_' and '-'`,
    );
  assertRunId(runId);
  if (!(LOGICAL_TOPICS as readonly string[]).includes(logical))
    throw new ConfigError(`unknown topic "${logical}"; topics: ${LOGICAL_TOPICS.join(', ')}`);
  const name = `${prefix}.${runId}.${logical}`;
  if (name.length > MAX_TOPIC_NAME)
    throw new ConfigError(
      `topic name ${name.slice(0, 60)}… is ${name.length} characters, over Kafka's ${MAX_TOPIC_NAME}; shorten pipeline.topic_prefix or the run id`,
    );
  return name;
}

/** The logical topic of a full topic name for this prefix and run; null when it is not one of the run's topics. */
export function parseTopicName(prefix: string, runId: string, name: string): LogicalTopic | null {
  const head = `${prefix}.${runId}.`;
  if (!name.startsWith(head)) return null;
  const rest = name.slice(head.length);
  return (LOGICAL_TOPICS as readonly string[]).includes(rest) ? (rest as LogicalTopic) : null;
}

/** The wire settings of the run config (pipeline section). */
export interface WireSettings {
  schema_wire_format: 'plain' | 'confluent';
  schema_registry_url: string | null;
}

export type TopicCodecs = { [K in LogicalTopic]: MessageCodec<TopicValue<K>> };

/**
 * A message codec per topic of a run. Confluent: each topic registers its schema under subject
 * `<topic name>-value` on `ready()` (call `readyAll`). `registry` overrides the HTTP client built
 * from schema_registry_url (e.g. an InMemorySchemaRegistry).
 */
export function topicCodecs(
  wire: WireSettings,
  prefix: string,
  runId: string,
  opts: { registry?: SchemaRegistry; codec?: CodecOptions } = {},
): TopicCodecs {
  let registry: SchemaRegistry | undefined = opts.registry;
  if (wire.schema_wire_format === 'confluent' && !registry) {
    if (!wire.schema_registry_url)
      throw new ConfigError(
        'pipeline.schema_registry_url is required when pipeline.schema_wire_format = confluent (e.g. http://localhost:8081)',
      );
    registry = new HttpSchemaRegistry({ url: wire.schema_registry_url });
  }
  const out: Partial<Record<LogicalTopic, MessageCodec<unknown>>> = {};
  for (const t of LOGICAL_TOPICS) {
    const name = topicName(prefix, runId, t);
    const codecOpts = { ...opts.codec, label: name };
    out[t] = (
      wire.schema_wire_format === 'confluent'
        ? createMessageCodec(
            TOPIC_FAMILY[t],
            { format: 'confluent', registry: registry!, subject: `${name}-value` },
            codecOpts,
          )
        : createMessageCodec(TOPIC_FAMILY[t], { format: 'plain' }, codecOpts)
    ) as MessageCodec<unknown>;
  }
  return out as TopicCodecs;
}

/** Awaits ready() of every codec (Confluent: registers all schemas). */
export async function readyAll(codecs: TopicCodecs): Promise<void> {
  await Promise.all(LOGICAL_TOPICS.map((t) => codecs[t].ready()));
}
