-- VPPO's entropy filtering (algorithm.vppo.enable_entropy_filtering) per trajectory, written by the
-- advantage stage when both are on, null otherwise (and for every row written before this
-- migration):
--   vppo_entropies  the entropy of the policy's token distribution at each response position with
--                   the real prompt image (the weights that generated the sample, at the rollout
--                   temperature): the quantity whose top top_p_entropy_tokens fraction per response
--                   joins the perception tokens in vppo_token_mask
-- With vppo_perturbed_logprobs and old_logprobs, every stored mask can be recomputed from the row.
-- Frozen once landed.
alter table trajectories
  add column vppo_entropies real[],
  add constraint trajectories_vppo_entropies_length check (vppo_entropies is null or cardinality(vppo_entropies) = response_length);
