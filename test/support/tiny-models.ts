/**
 * Model shapes shared by the tests that need a random-weight model and nothing of a real one:
 * small enough to build and run in milliseconds, with every structural feature the test exercises.
 */
import type { ModelConfigInput } from '../../lib/model/config.ts';

/** Two layers, GQA (4 query heads over 2 key/value heads) and q/k/v biases: the sampler and decoding tests' model. */
export const TINY_GQA_BIAS: ModelConfigInput = {
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: 40,
  maxPositionEmbeddings: 64,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
  attentionBias: true,
};

/** One layer of width 16: the policy-store and checkpoint tests' model (what matters there is the files). */
export const TINY_ONE_LAYER: ModelConfigInput = {
  hiddenSize: 16,
  intermediateSize: 24,
  numHiddenLayers: 1,
  numAttentionHeads: 2,
  numKeyValueHeads: 1,
  vocabSize: 32,
  maxPositionEmbeddings: 32,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
};
