-- Stage metrics from several replicas of one stage (e.g. two rollout processes) no longer
-- overwrite each other. Each writer keeps its own partial row, keyed by (run, step, name, stage,
-- replica), in step_metric_parts (the former step_metrics table, renamed), with how partials of
-- the same metric combine (agg) and, for weighted means, its weight. step_metrics becomes a view
-- that combines them: one row per (run, step, name), as before, so every reader (the analysis
-- views, `rlstream sql`/`report`, the TensorBoard export, the run summary) sees combined values.
--
--   agg = 'sum'   counters and tokens (perf/rollout_tokens, reward/failures, *_total)
--   agg = 'max'   times (timing/<stage>/<phase>_s, perf/step_time_s/<stage>): replicas run in
--                 parallel, so the stage's time on a step is its slowest replica's
--   agg = 'min'   lower bounds
--   agg = 'mean'  rates and fractions: sum(value * weight) / sum(weight) (plain mean if all
--                 weights are 0)
--   agg = 'last'  values of a single writer (the default): the most recently written partial
-- Partials of one metric that disagree about agg fall back to 'last'. A metric with a single
-- partial is that partial's value whatever its agg. stage is '' for rows written without one
-- (the view shows NULL, as the table did). Frozen once landed.

alter table step_metrics rename to step_metric_parts;
alter index step_metrics_run_name_idx rename to step_metric_parts_run_name_idx;
update step_metric_parts set stage = '' where stage is null;
alter table step_metric_parts
  alter column stage set default '',
  alter column stage set not null,
  add column replica    text not null default '',
  add column agg        text not null default 'last' check (agg in ('sum', 'max', 'min', 'mean', 'last')),
  add column weight     double precision not null default 1 check (weight >= 0),
  add column updated_at timestamptz not null default now();
alter table step_metric_parts drop constraint step_metrics_pkey;
alter table step_metric_parts add constraint step_metric_parts_pkey primary key (run_id, step, name, stage, replica);

create view step_metrics as
select
  run_id,
  step,
  name,
  case
    when count(*) = 1 then min(value)
    when min(agg) <> max(agg) or min(agg) = 'last'
      then (array_agg(value order by updated_at desc, stage desc, replica desc))[1]
    when min(agg) = 'sum' then sum(value)
    when min(agg) = 'max' then max(value)
    when min(agg) = 'min' then min(value)
    else coalesce(sum(value * weight) / nullif(sum(weight), 0), avg(value))
  end                                                  as value,
  nullif(string_agg(distinct stage, ',' order by stage), '') as stage,
  min(created_at)                                      as created_at,
  count(*)::integer                                    as parts
from step_metric_parts
group by run_id, step, name;

-- The views that read step_metrics, unchanged, re-created so that they read the combining view
-- instead of the renamed table (a view follows a renamed table).

create or replace view v_step_metrics_wide as
select
  run_id,
  step,
  max(value) filter (where name = 'reward/mean')                as reward_mean,
  max(value) filter (where name = 'reward/std')                 as reward_std,
  max(value) filter (where name = 'reward/min')                 as reward_min,
  max(value) filter (where name = 'reward/max')                 as reward_max,
  max(value) filter (where name = 'val/accuracy')               as val_accuracy,
  max(value) filter (where name = 'val/reward_score')           as val_reward_score,
  max(value) filter (where name = 'actor/pg_loss')              as pg_loss,
  coalesce(max(value) filter (where name = 'actor/approx_kl'),
           max(value) filter (where name = 'actor/ppo_kl'))     as approx_kl,
  max(value) filter (where name = 'actor/clipfrac')             as clipfrac,
  max(value) filter (where name = 'actor/entropy')              as entropy,
  max(value) filter (where name = 'actor/grad_norm')            as grad_norm,
  max(value) filter (where name = 'actor/lr')                   as lr,
  max(value) filter (where name = 'kl/mean')                    as kl_mean,
  max(value) filter (where name = 'kl/coef')                    as kl_coef,
  max(value) filter (where name = 'critic/vf_loss')             as vf_loss,
  max(value) filter (where name = 'response_length/mean')       as response_length_mean,
  max(value) filter (where name = 'perf/tokens_per_second')     as tokens_per_second,
  max(value) filter (where name = 'perf/samples_per_second')    as samples_per_second,
  max(value) filter (where name = 'perf/step_time_s/rollout')   as rollout_s,
  max(value) filter (where name = 'perf/step_time_s/reward')    as reward_s,
  max(value) filter (where name = 'perf/step_time_s/advantage') as advantage_s,
  max(value) filter (where name = 'perf/step_time_s/update')    as update_s
from step_metrics
group by run_id, step;

create or replace view v_step_times as
select run_id, step, stage,
  max(value) filter (where what = 'step_time_s') as step_time_s,
  max(value) filter (where what = 'wait_s')      as wait_s,
  max(value) filter (where what = 'compute_s')   as compute_s
from (
  select run_id, step, substr(name, length('perf/step_time_s/') + 1) as stage, 'step_time_s' as what, value
  from step_metrics
  where name like 'perf/step\_time\_s/%'
  union all
  select run_id, step, split_part(name, '/', 2) as stage, split_part(name, '/', 3) as what, value
  from step_metrics
  where name like 'timing/%/wait\_s' or name like 'timing/%/compute\_s'
) s
group by run_id, step, stage;

create or replace view v_kl_entropy as
select
  m.run_id,
  m.step,
  m.kl_mean,
  m.kl_coef,
  m.approx_kl,
  m.kl_loss,
  m.entropy,
  t.kl_k1_from_logprobs,
  t.kl_tokens
from (
  select run_id, step,
    max(value) filter (where name = 'kl/mean')          as kl_mean,
    max(value) filter (where name = 'kl/coef')          as kl_coef,
    coalesce(max(value) filter (where name = 'actor/approx_kl'),
             max(value) filter (where name = 'actor/ppo_kl')) as approx_kl,
    max(value) filter (where name = 'actor/kl_loss')    as kl_loss,
    max(value) filter (where name = 'actor/entropy')    as entropy
  from step_metrics
  where name in ('kl/mean', 'kl/coef', 'actor/approx_kl', 'actor/ppo_kl', 'actor/kl_loss', 'actor/entropy')
  group by run_id, step
) m
left join lateral (
  select avg(u.lp::double precision - u.ref::double precision) as kl_k1_from_logprobs, count(u.ref) as kl_tokens
  from trajectories tr,
       unnest(coalesce(tr.old_logprobs, tr.behaviour_logprobs), tr.ref_logprobs) as u(lp, ref)
  where tr.run_id = m.run_id and tr.step = m.step and tr.kind = 'train' and not tr.filtered
    and tr.ref_logprobs is not null
) t on true;

create or replace view v_runs as
select
  r.run_id,
  r.project,
  r.experiment,
  r.status,
  r.parent_run_id,
  r.created_at,
  r.updated_at,
  m.steps,
  m.last_step,
  fr.value                  as final_reward_mean,
  bv.value                  as best_val_accuracy,
  bv.step                   as best_val_step,
  lv.value                  as final_val_accuracy,
  ck.checkpoints,
  ck.last_checkpoint_step,
  (select count(*) from trajectories t where t.run_id = r.run_id)  as trajectories,
  (select count(*) from dead_letters d where d.run_id = r.run_id)  as dead_letters
from runs r
left join lateral (
  select count(distinct s.step) as steps, max(s.step) as last_step
  from step_metrics s
  where s.run_id = r.run_id and s.name not like 'val/%'
) m on true
left join lateral (
  select s.value from step_metrics s
  where s.run_id = r.run_id and s.name = 'reward/mean'
  order by s.step desc limit 1
) fr on true
left join lateral (
  select s.value, s.step from step_metrics s
  where s.run_id = r.run_id and s.name = 'val/accuracy' and s.value <> 'NaN'::double precision
  order by s.value desc, s.step asc limit 1
) bv on true
left join lateral (
  select s.value from step_metrics s
  where s.run_id = r.run_id and s.name = 'val/accuracy'
  order by s.step desc limit 1
) lv on true
left join lateral (
  select count(*) as checkpoints, max(c.step) as last_checkpoint_step
  from checkpoints c
  where c.run_id = r.run_id
) ck on true;
