-- Analysis views over the run store (migrations/20261121_0001_core.sql): the common questions
-- about a run, answerable with `rlstream sql <run-or-url> "select … from v_…"`. Every view keeps
-- run_id as its first column, so `where run_id = '…'` selects one run on a shared PostgreSQL.
-- Plain SQL, no app code; frozen once landed (change a view with a later-dated migration that
-- does `create or replace view` / `drop view`).

-- One row per (run, step) with the main scalar metrics as columns (NULL where a metric was not
-- logged at that step). Metric names are the stable ones of the pipeline; the full set stays in
-- step_metrics (name, value) for everything not listed here.
create view v_step_metrics_wide as
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

-- Time per stage and step, long form (one row per run, step, stage) from
-- perf/step_time_s/<stage>, timing/<stage>/wait_s and timing/<stage>/compute_s.
create view v_step_times as
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

-- Reward of each prompt group at each step (a prompt seen in several epochs has one row per step;
-- group by prompt_text or prompt_hash to follow it across steps). accuracy_mean reads
-- reward_details.accuracy when the reward function reports it.
create view v_reward_by_prompt as
select
  run_id,
  kind,
  left(md5(prompt_text), 12)                                 as prompt_hash,
  prompt_text,
  ground_truth,
  step,
  group_uid,
  prompt_index,
  count(*)                                                   as n,
  count(reward)                                              as n_scored,
  count(*) filter (where reward_failure is not null)         as n_failed,
  count(*) filter (where filtered)                           as n_filtered,
  avg(reward)                                                as reward_mean,
  min(reward)                                                as reward_min,
  max(reward)                                                as reward_max,
  avg(case when jsonb_typeof(reward_details -> 'accuracy') = 'number'
           then (reward_details ->> 'accuracy')::double precision end) as accuracy_mean
from trajectories
group by run_id, kind, step, group_uid, prompt_index, prompt_text, ground_truth;

-- Distribution of response lengths (tokens) per step; p50/p90 interpolate linearly (as numpy).
-- n_truncated counts responses cut by max_new_tokens (finish_reason 'length').
create view v_response_length as
select
  run_id,
  kind,
  step,
  count(*)                                                                        as n,
  min(response_length)                                                            as min_len,
  percentile_cont(0.5) within group (order by response_length)                    as p50_len,
  percentile_cont(0.9) within group (order by response_length)                    as p90_len,
  max(response_length)                                                            as max_len,
  avg(response_length)::double precision                                          as mean_len,
  count(*) filter (where finish_reason = 'length')                                as n_truncated
from trajectories
group by run_id, kind, step;

-- KL and entropy per step: the logged metrics, plus the k1 estimate recomputed from the stored
-- per-token log-probs of the step's unfiltered train trajectories
-- (mean over tokens of log pi_old - log pi_ref, pi_old = old_logprobs or else behaviour_logprobs).
create view v_kl_entropy as
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

-- Groups dropped by the online filter, with the filter's reason and the group's rewards.
create view v_filtered_groups as
select
  run_id,
  kind,
  step,
  group_uid,
  min(prompt_index)                           as prompt_index,
  min(prompt_text)                            as prompt_text,
  string_agg(distinct filter_reason, '; ')    as filter_reason,
  count(*)                                    as n,
  avg(reward)                                 as reward_mean,
  stddev_pop(reward)                          as reward_std,
  min(reward)                                 as reward_min,
  max(reward)                                 as reward_max
from trajectories
where filtered
group by run_id, kind, step, group_uid;

-- Every failed reward: trajectories (train and val) and validation generations. A failed score is
-- stored as reward NULL plus its reason, never as 0.
create view v_reward_failures as
select run_id, 'trajectory'::text as source, kind, step, id as trajectory_id, null::integer as val_idx,
       group_uid, prompt_text, response_text, reward_failure, created_at
from trajectories
where reward_failure is not null
union all
select run_id, 'val_generation'::text, 'val'::text, step, null::text, idx,
       null::text, prompt, response, reward_failure, created_at
from val_generations
where reward_failure is not null;

-- How stale the trained-on data was: policy versions and staleness (policy updates between
-- sampling and training) of each step's train trajectories.
create view v_staleness as
select
  run_id,
  step,
  count(*)                                 as n,
  min(policy_version)                      as min_policy_version,
  max(policy_version)                      as max_policy_version,
  avg(staleness)::double precision         as mean_staleness,
  max(staleness)                           as max_staleness,
  count(*) filter (where staleness > 0)    as n_stale
from trajectories
where kind = 'train'
group by run_id, step;

-- Checkpoint lineage: each checkpoint with the previous one of its run and, for a replay or fork
-- (runs.parent_run_id), the parent's checkpoint at the same step and whether the bytes match.
create view v_checkpoint_lineage as
select
  c.run_id,
  c.step,
  c.policy_version,
  c.sha256,
  c.path,
  c.created_at,
  lag(c.step) over (partition by c.run_id order by c.step)    as prev_step,
  lag(c.sha256) over (partition by c.run_id order by c.step)  as prev_sha256,
  r.parent_run_id,
  p.sha256                                                    as parent_sha256,
  case when p.sha256 is null then null else p.sha256 = c.sha256 end as matches_parent,
  c.consumed_offsets
from checkpoints c
join runs r on r.run_id = c.run_id
left join checkpoints p on p.run_id = r.parent_run_id and p.step = c.step;

-- Messages a stage could not process, with the reason and where they came from (source topic,
-- partition and offset); the payload's size only (the bytes stay in dead_letters.payload).
create view v_dead_letters as
select
  run_id,
  stage,
  topic                  as source_topic,
  partition              as source_partition,
  msg_offset             as source_offset,
  reason,
  error_code,
  octet_length(payload)  as payload_bytes,
  created_at
from dead_letters;

-- One row per run: status, progress and the headline numbers (what `rlstream runs` prints).
-- steps counts the distinct steps with training metrics (val/* excluded); best_val_accuracy is
-- the highest finite val/accuracy (earliest step on ties).
create view v_runs as
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
