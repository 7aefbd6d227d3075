-- Event log of the embedded bus (lib/bus/embedded-log.ts): a Kafka-like log kept in the run's
-- database (PGlite, or a PostgreSQL shared by several processes on one machine).
-- Offsets are dense per partition: bus_partitions.next_offset is advanced in the same transaction
-- that inserts the messages, under its row lock, so offsets have no gaps and become visible in order.

create table bus_topics (
  name        text primary key,
  partitions  integer not null check (partitions between 1 and 100000),
  created_at  timestamptz not null default now()
);

create table bus_partitions (
  topic        text not null references bus_topics (name) on delete cascade,
  partition    integer not null check (partition >= 0),
  next_offset  bigint not null default 0 check (next_offset >= 0),
  primary key (topic, partition)
);

-- No foreign key to bus_partitions: every insert already locks that row to take its offsets.
create table bus_messages (
  topic       text not null,
  partition   integer not null,
  msg_offset  bigint not null,
  key         text,
  value       bytea not null,
  headers     jsonb not null default '{}'::jsonb,
  ts          timestamptz not null default now(),
  primary key (topic, partition, msg_offset)
);

-- Committed position of a consumer group: the next offset it will consume. A batch's commit
-- locks this row (SELECT ... FOR UPDATE) and checks that it still starts at the batch's first
-- offset and that the member still owns the partition; a stale owner's commit rolls back.
create table bus_offsets (
  group_id     text not null,
  topic        text not null,
  partition    integer not null,
  next_offset  bigint not null check (next_offset >= 0),
  updated_at   timestamptz not null default now(),
  primary key (group_id, topic, partition)
);

-- Live members of consumer groups. Partitions are assigned deterministically from the members
-- whose heartbeat is recent (sorted by member_id, round-robin over sorted topic-partitions).
create table bus_members (
  group_id      text not null,
  member_id     text not null,
  topics        text[] not null,
  joined_at     timestamptz not null default now(),
  heartbeat_at  timestamptz not null default now(),
  primary key (group_id, member_id)
);
