-- Policy versions in the run's database (pipeline.policy_store = postgres), so that no stage needs
-- a shared volume: one row per file of a stored artifact (a policy, critic or EMA version: its
-- model.safetensors, optimizer.safetensors, config.json) with its size and sha256, and the file's
-- bytes in ordered bytea chunks (each well under the 1 GB bytea limit, and small enough to
-- stream). A version is readable only once its `policy_artifacts` row is committed, which the
-- writer does after all its chunks, in one transaction, before the version's event is published.
-- The filesystem store records the same `policy_files` manifest (without chunks) so every read
-- can be checked against the recorded sha256. Frozen once landed.
create table policy_artifacts (
  run_id text not null,
  kind text not null,
  version integer not null,
  files integer not null,
  size_bytes bigint not null,
  created_at timestamptz not null default now(),
  primary key (run_id, kind, version)
);

create table policy_files (
  run_id text not null,
  kind text not null,
  version integer not null,
  name text not null,
  size_bytes bigint not null,
  sha256 text not null,
  chunks integer not null,
  primary key (run_id, kind, version, name)
);

create table policy_chunks (
  run_id text not null,
  kind text not null,
  version integer not null,
  name text not null,
  seq integer not null,
  data bytea not null,
  primary key (run_id, kind, version, name, seq)
);
alter table policy_chunks alter column data set storage external;
