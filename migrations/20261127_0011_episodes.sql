-- Multi-turn episodes (rollout.multi_turn.enable), written by the rollout stage with the batch
-- that generated them (idempotent: a re-run after a crash inserts nothing twice). The token ids
-- and the policy/environment mask are in the episode's trajectory row (trajectories.id =
-- episodes.trajectory_id, once the advantage stage has written it); these tables hold what SQL
-- asks about: the turns, tools, latencies, errors and rewards. Frozen once landed.
create table episodes (
  run_id          text not null references runs(run_id) on delete cascade,
  trajectory_id   text not null,
  step            integer not null,
  kind            text not null check (kind in ('train', 'val')),
  policy_version  integer not null,
  assistant_turns integer not null check (assistant_turns >= 0),
  reward          double precision not null,       -- Σ_t gamma^t r_t (meaningless when failure is set)
  done            boolean not null,                -- the environment said done
  failure         text,                            -- why the episode failed (timeout, crash, bad reply, unreachable)
  timed_out       boolean not null default false,
  tool_calls      integer not null default 0,
  tool_errors     integer not null default 0,
  response_tokens integer not null check (response_tokens >= 0),
  created_at      timestamptz not null default now(),
  primary key (run_id, trajectory_id)
);
create index episodes_run_step on episodes (run_id, step);

create table episode_turns (
  run_id        text not null,
  trajectory_id text not null,
  turn_index    integer not null check (turn_index >= 0), -- order of the message within the episode
  role          text not null,                           -- assistant | user | tool | system (a failure)
  token_start   integer not null check (token_start >= 0), -- span in the trajectory's response_tokens
  token_end     integer not null check (token_end >= token_start),
  text          text not null,
  tool_name     text,
  arguments     text,
  result_chars  integer not null default 0,              -- length of an environment/tool message
  latency_ms    double precision not null default 0,
  error         text,
  reward        double precision not null default 0,
  primary key (run_id, trajectory_id, turn_index),
  foreign key (run_id, trajectory_id) references episodes(run_id, trajectory_id) on delete cascade
);

-- One row per episode: turns, tool calls and errors, and how it ended.
create view v_episodes as
select
  e.run_id, e.step, e.kind, e.trajectory_id, e.policy_version,
  e.assistant_turns,
  count(t.*) filter (where t.role <> 'assistant') as env_messages,
  e.tool_calls, e.tool_errors,
  case when e.failure is not null then 'failed' when e.done then 'done' else 'cut' end as outcome,
  e.failure, e.reward, e.response_tokens,
  coalesce(sum(t.latency_ms) filter (where t.role <> 'assistant'), 0) as env_latency_ms
from episodes e
left join episode_turns t on t.run_id = e.run_id and t.trajectory_id = e.trajectory_id
group by e.run_id, e.trajectory_id;

-- Tool usage per training step and tool: calls, errors, mean latency.
create view v_tool_usage_by_step as
select
  t.run_id, e.step, t.tool_name,
  count(*) as calls,
  count(*) filter (where t.error is not null) as errors,
  avg(t.latency_ms) as latency_ms_mean
from episode_turns t
join episodes e on e.run_id = t.run_id and e.trajectory_id = t.trajectory_id
where t.role = 'tool' and e.kind = 'train'
group by t.run_id, e.step, t.tool_name;

-- Reward by number of assistant turns (episodes that did not fail).
create view v_reward_by_turns as
select
  run_id, kind, assistant_turns,
  count(*) as episodes,
  avg(reward) as reward_mean,
  avg(case when done then 1.0 else 0.0 end) as done_fraction
from episodes
where failure is null
group by run_id, kind, assistant_turns;
