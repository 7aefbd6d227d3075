/**
 * RL algorithms library: pure functions over typed arrays (no I/O), matched to verl's core_algos
 * (`test/fixtures/golden/rl_golden.json` holds the reference cases) plus VPPO, NFT, online filtering,
 * overlong shaping and EMA. Algorithms are looked up by config name through registries:
 *
 *   advEstimators (adv_estimator) · policyLosses (policy_loss) · klPenaltyModes (kl_penalty)
 *   lossAggModes (loss_agg_mode) · onlineFilters (online_filter)
 */
export * from './tensor.ts';
export * from './registry.ts';
export * from './masked.ts';
export * from './agg.ts';
export * from './advantage.ts';
export * from './kl.ts';
export * from './policy-loss.ts';
export * from './policy-loss-registry.ts';
export { computeNftLoss, nftRHat, type NftInput, type NftOutput } from './nft.ts';
export * from './filter.ts';
export * from './shaping.ts';
export * from './vppo.ts';
export * from './vppo-stage.ts';
export * from './ema.ts';
export * from './turns.ts';
export { torchSumF32, torchMeanF32 } from './f32.ts';
export { ConfigError, RlError } from '../errors.ts';
