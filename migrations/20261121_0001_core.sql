-- rlstream core run tables: runs, trajectories, step metrics, checkpoints, validation generations
-- and dead letters. Every row carries run_id. Frozen once landed: change the schema with a new,
-- later-dated migration. Plain SQL, no app code.

-- One row per run. config is the resolved run config with secrets already redacted by the caller.
create table runs (
  run_id        text primary key,
  project       text not null,
  experiment    text not null,
  config        jsonb not null default '{}'::jsonb,
  status        text not null default 'running'
                check (status in ('running', 'completed', 'failed', 'stopped')),
  parent_run_id text,                       -- the run this one replays or forks (may live elsewhere)
  summary       jsonb,
  created_at    timestamptz not null default now(),
  updated_at    timestamptz not null default now()
);
create index runs_project_experiment_idx on runs (project, experiment, created_at);

-- One row per sampled response, written once when complete (after reward and advantage).
-- The id is the deterministic sample id; re-delivery of the same sample is a no-op.
-- Per-token arrays are real[] / integer[] so SQL can analyse them (unnest, cardinality, ...).
create table trajectories (
  run_id             text not null references runs (run_id) on delete cascade,
  id                 text not null,
  step               integer not null check (step >= 0),
  epoch              integer not null check (epoch >= 0),
  kind               text not null check (kind in ('train', 'val')),
  group_uid          text not null,          -- responses to the same prompt share it (GRPO group)
  prompt_index       integer not null,
  sample_index       integer not null,
  policy_version     integer not null check (policy_version >= 0),
  prompt_tokens      integer[] not null,
  response_tokens    integer[] not null,
  prompt_text        text not null,
  response_text      text not null,
  ground_truth       text,
  behaviour_logprobs real[] not null,        -- log pi_behaviour(token) per response token
  ref_logprobs       real[],                 -- log pi_ref(token) per response token (when KL is used)
  old_logprobs       real[],                 -- recomputed log pi_old(token) (when recomputed)
  advantages         real[],                 -- per response token
  advantage          double precision,       -- sequence-level summary of advantages
  returns            real[],                 -- per response token (value-based estimators)
  reward             double precision check (reward is null or reward <> 'NaN'::double precision),
  reward_details     jsonb,
  reward_failure     text,                   -- why scoring failed; then reward is NULL, never 0
  response_length    integer not null check (response_length >= 0),
  finish_reason      text,
  filtered           boolean not null default false,
  filter_reason      text,
  staleness          integer not null default 0 check (staleness >= 0),
  created_at         timestamptz not null default now(),
  primary key (run_id, id),
  constraint trajectories_reward_or_failure check ((reward is null) = (reward_failure is not null)),
  constraint trajectories_filter_reason check (filtered = (filter_reason is not null)),
  -- per-token arrays line up with response_tokens, so SQL can unnest them side by side
  constraint trajectories_per_token_lengths check (
    response_length = cardinality(response_tokens)
    and cardinality(behaviour_logprobs) = response_length
    and (ref_logprobs is null or cardinality(ref_logprobs) = response_length)
    and (old_logprobs is null or cardinality(old_logprobs) = response_length)
    and (advantages is null or cardinality(advantages) = response_length)
    and (returns is null or cardinality(returns) = response_length))
);
create index trajectories_run_step_idx on trajectories (run_id, step);

-- Rows are ~5 KB (mostly per-token arrays), so they are TOASTed. lz4 costs far less CPU than the
-- default pglz on ingest for about the same size; PGlite is built without lz4 and keeps pglz.
do $$
begin
  alter table trajectories
    alter column prompt_tokens set compression lz4,
    alter column response_tokens set compression lz4,
    alter column prompt_text set compression lz4,
    alter column response_text set compression lz4,
    alter column behaviour_logprobs set compression lz4,
    alter column ref_logprobs set compression lz4,
    alter column old_logprobs set compression lz4,
    alter column advantages set compression lz4,
    alter column returns set compression lz4;
exception when feature_not_supported then
  null;
end $$;

-- Scalar metrics per optimisation step (stable names such as 'actor/pg_loss', 'reward/mean').
create table step_metrics (
  run_id     text not null references runs (run_id) on delete cascade,
  step       integer not null,
  name       text not null,
  value      double precision not null,
  stage      text,
  created_at timestamptz not null default now(),
  primary key (run_id, step, name)
);
create index step_metrics_run_name_idx on step_metrics (run_id, name, step);

-- Checkpoints: everything needed to resume bit-for-bit at the step boundary.
create table checkpoints (
  run_id           text not null references runs (run_id) on delete cascade,
  step             integer not null check (step >= 0),
  path             text not null,
  sha256           text not null check (sha256 ~ '^[0-9a-f]{64}$'),
  policy_version   integer not null check (policy_version >= 0),
  consumed_offsets jsonb not null default '{}'::jsonb,  -- topic/partition -> next offset
  dataset_position jsonb,
  rng_state        jsonb,
  kl_ctl_state     jsonb,
  lr_state         jsonb,
  created_at       timestamptz not null default now(),
  primary key (run_id, step)
);

-- Validation generations, for inspection next to the val/* metrics.
create table val_generations (
  run_id         text not null references runs (run_id) on delete cascade,
  step           integer not null,
  idx            integer not null,
  prompt         text not null,
  response       text not null,
  ground_truth   text,
  reward         double precision check (reward is null or reward <> 'NaN'::double precision),
  reward_failure text,
  created_at     timestamptz not null default now(),
  primary key (run_id, step, idx),
  constraint val_generations_reward_or_failure check ((reward is null) = (reward_failure is not null))
);

-- Messages a stage could not process (not retriable). run_id is NULL when the message could not
-- be attributed to a run (undecodable). One row per consumed message and stage.
create table dead_letters (
  stage          text not null,
  topic          text not null,
  partition      integer not null,
  msg_offset     bigint not null,
  run_id         text,
  reason         text not null,
  error_code     text,
  payload        bytea,
  created_at     timestamptz not null default now(),
  primary key (stage, topic, partition, msg_offset)
);
create index dead_letters_run_idx on dead_letters (run_id, created_at);
