-- Pipeline stage state: each stateful stage (controller, advantage, update) keeps a small JSON
-- state per run, and the groups it has received but not yet processed ("pending": a step waiting
-- for the rest of its groups). Both are written in the same transaction as the batch that
-- changed them (embedded log), or before the batch's offsets are committed (Kafka), so a crash
-- loses nothing: in-flight work is in the database, never only in memory. Frozen once landed.

create table stage_state (
  run_id     text not null,
  stage      text not null,
  state      jsonb not null,
  updated_at timestamptz not null default now(),
  primary key (run_id, stage)
);

create table stage_pending (
  run_id     text not null,
  stage      text not null,
  bucket     text not null,          -- e.g. step:12 — what the item waits with
  id         text not null,          -- deterministic id of the item (duplicates are ignored)
  payload    bytea not null,         -- the item as its topic's Avro message value
  headers    jsonb not null default '{}'::jsonb,
  created_at timestamptz not null default now(),
  primary key (run_id, stage, bucket, id)
);
