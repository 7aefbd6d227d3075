/**
 * Registry `policy_loss` (verl actor.policy_loss.loss_mode): vanilla (alias ppo), gspo, sapo, gpg,
 * cispo, reinforce, geo_mean, clip_cov, kl_cov, nft.
 */
import { Registry } from './registry.ts';
import {
  computePolicyLossCispo,
  computePolicyLossClipCov,
  computePolicyLossGeoMean,
  computePolicyLossGpg,
  computePolicyLossGspo,
  computePolicyLossKlCov,
  computePolicyLossReinforce,
  computePolicyLossSapo,
  computePolicyLossVanilla,
  type PolicyLossConfig,
  type PolicyLossFn,
  type PolicyLossInput,
  type PolicyLossOutput,
} from './policy-loss.ts';
import { computeNftLoss } from './nft.ts';
import { ConfigError } from '../errors.ts';

/** NFT through the common policy-loss signature: needs `rewards` (±1) and `index` in the input. */
export const computePolicyLossNft: PolicyLossFn = (input, cfg = {}) => {
  if (!input.rewards || !input.index)
    throw new ConfigError('policy_loss "nft" needs rewards (±1 per response) and index (group labels) in its input');
  const out = computeNftLoss({ ...input, rewards: input.rewards, index: input.index }, cfg);
  return { pg_loss: out.pg_loss, pg_losses: out.pg_losses, metrics: out.metrics, grad_log_prob: out.grad_log_prob };
};

export const policyLosses = new Registry<PolicyLossFn>('policy_loss', {
  vanilla: computePolicyLossVanilla,
  ppo: computePolicyLossVanilla,
  gspo: computePolicyLossGspo,
  sapo: computePolicyLossSapo,
  gpg: computePolicyLossGpg,
  cispo: computePolicyLossCispo,
  reinforce: computePolicyLossReinforce,
  geo_mean: computePolicyLossGeoMean,
  clip_cov: computePolicyLossClipCov,
  kl_cov: computePolicyLossKlCov,
  nft: computePolicyLossNft,
});

/** Looks the loss up by config name (`policy_loss.loss_mode`) and runs it. */
export function computePolicyLoss(
  name: string,
  input: PolicyLossInput,
  config: PolicyLossConfig = {},
): PolicyLossOutput {
  return policyLosses.get(name)(input, config);
}
