/**
 * actor.model.vision / freeze_vision_tower: a fresh vision-language policy and critic from the
 * config keys (vision tokens after the tokenizer's ids, never sampled), and the checks that keep
 * image sides on the merge grid.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { criticModelConfig, policyModelConfig, tokenizerFor } from '../../../lib/pipeline/policy.ts';
import { logitBiasOf } from '../../../lib/model/decode-graph.ts';
import { load, problemsOf } from '../config/helpers.ts';

const VLM = [
  'actor.model.vision.enable=true',
  'actor.model.vision.patch_size=4',
  'data.image_factor=8',
  'actor.model.vision.hidden_size=16',
  'actor.model.vision.num_heads=2',
];

test('actor.model.vision makes the fresh policy and critic vision-language models', () => {
  const cfg = load({ overrides: [...VLM, 'algorithm.adv_estimator=gae', 'actor.model.freeze_vision_tower=true'] });
  const tok = tokenizerFor(cfg);
  const c = policyModelConfig(cfg, tok);
  assert.deepEqual(c.vision, {
    depth: 2,
    hiddenSize: 16,
    intermediateSize: 128,
    numHeads: 2,
    outHiddenSize: cfg.actor.model.d_model,
    patchSize: 4,
    temporalPatchSize: 2,
    spatialMergeSize: 2,
    layerNormEps: 1e-6,
    rope: '2d',
    ropeTheta: 10000,
    imageTokenId: tok.vocabSize,
    visionStartTokenId: tok.vocabSize + 1,
    visionEndTokenId: tok.vocabSize + 2,
    // the fresh tower is Qwen2-VL's: LayerNorm, quick-GELU MLP, full attention in every block
    norm: 'layernorm',
    mlp: 'quick_gelu',
    windowSize: null,
    fullattBlockIndexes: [],
  });
  assert.equal(c.vocabSize, tok.vocabSize + 3);
  const bias = logitBiasOf(c)!;
  for (const id of [tok.vocabSize, tok.vocabSize + 1, tok.vocabSize + 2])
    assert.equal(bias[id], -1e9, `vision token ${id} is never sampled`);
  const critic = criticModelConfig(cfg, tok);
  assert.equal(critic.head, 'value');
  assert.equal(critic.vision?.imageTokenId, tok.vocabSize);
  assert.equal(cfg.actor.model.freeze_vision_tower, true);
  assert.equal(policyModelConfig(load(), tok).vision, undefined);
});

test('image_factor must be patch_size × spatial_merge_size; the ViT head size must suit its rotary positions', () => {
  const p = problemsOf(() => load({ overrides: [...VLM, 'data.image_factor=28'] }));
  assert.ok(
    p.some((m) =>
      m.includes('data.image_factor = 28 must be actor.model.vision.patch_size × spatial_merge_size = 4 × 2 = 8'),
    ),
    p.join('\n'),
  );
  const q = problemsOf(() => load({ overrides: [...VLM, 'actor.model.vision.num_heads=8'] }));
  assert.ok(
    q.some((m) => m.includes('head size 2 (hidden_size / num_heads) must be a multiple of 4 for 2d rotary positions')),
    q.join('\n'),
  );
});
