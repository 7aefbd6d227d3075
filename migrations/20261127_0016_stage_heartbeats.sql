-- Stage heartbeats: each process of a run over PostgreSQL (a served stage, or `rlstream train`
-- holding all five stages) keeps one row per stage and replica here, renewed every
-- pipeline.heartbeat_seconds with the database's clock. A row is that stage's lease: it is live
-- while state = 'running' and heartbeat_at is less than lease_ms old. `rlstream runs` shows a run
-- still marked running whose every row has lost its lease as "stale" (its processes were killed),
-- and one whose every row says 'stopped' as "stopped" (every stage stopped on SIGTERM).
--   state: running (renewing its lease), stopped (SIGTERM, a graceful stop), done (the stage left
--   after its run finished or failed), crashed (the process ended with an error, in `error`).
-- A row has no foreign key to runs: a stage may start before the controller registers the run.
-- Frozen once landed.
create table stage_heartbeats (
  run_id       text not null,
  stage        text not null,
  replica      integer not null default 0,
  holder       text not null,                 -- host:pid of the process holding the lease
  state        text not null default 'running' check (state in ('running', 'stopped', 'done', 'crashed')),
  started_at   timestamptz not null default now(),
  heartbeat_at timestamptz not null default now(),
  lease_ms     integer not null check (lease_ms > 0),
  error        text,
  primary key (run_id, stage, replica)
);
