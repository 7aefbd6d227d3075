-- VPPO token perception RL (arXiv 2510.09285) per trajectory, written by the advantage stage when
-- algorithm.vppo.enable is on, null otherwise (and for every row written before this migration):
--   vppo_perturbed_logprobs  log-prob of each response token with the prompt image perturbed
--                            (algorithm.vppo.perturbation, seeded by the sample id)
--   vppo_token_mask          the token mask the update multiplied into its loss weights
--                            (true = the token's gradient was kept)
--   vppo_scaling_factor      α, the factor the update multiplied into the trajectory's advantages
-- The stored `advantages` stay unscaled. E.g. the fraction of kept tokens per step:
--   select step, avg(k::int) from trajectories, unnest(vppo_token_mask) k
--   where vppo_token_mask is not null group by step order by step;
-- Frozen once landed.
alter table trajectories
  add column vppo_perturbed_logprobs real[],
  add column vppo_token_mask boolean[],
  add column vppo_scaling_factor double precision
    check (vppo_scaling_factor is null or (vppo_scaling_factor >= 0 and vppo_scaling_factor < 'Infinity'::double precision)),
  add constraint trajectories_vppo_lengths check (
    (vppo_perturbed_logprobs is null or cardinality(vppo_perturbed_logprobs) = response_length)
    and (vppo_token_mask is null or cardinality(vppo_token_mask) = response_length));
