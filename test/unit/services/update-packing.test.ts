/**
 * The update stage's tensor packing (services/update/logic.ts): a step's samples in id order,
 * duplicates dropped, split into mini-batches; each row prompt then response, right-padded, with
 * the per-token targets at the response positions only.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  packPolicyBatches,
  packValueBatches,
  rolloutCorrectionOf,
  type PackOptions,
} from '../../../services/update/logic.ts';
import type { UpdateGroup, UpdateSample } from '../../../lib/contracts/index.ts';

const PAD = 0;
const opts: PackOptions = { miniBatchSize: 2, padTokenId: PAD, lossScaleFactor: 8, vppo: false, klLoss: false };

function sample(id: string, response: number[], vppo: UpdateSample['vppo'] = null): UpdateSample {
  const L = response.length;
  const seq = (k: number) => Float32Array.from({ length: L }, (_, t) => k + t);
  return {
    id,
    response_ids: Int32Array.from(response),
    behaviour_logprobs: seq(-10),
    advantages: seq(100),
    ref_logprobs: seq(-20),
    loss_weights: Float32Array.from({ length: L }, () => 1),
    values: seq(200),
    returns: seq(300),
    response_mask: Buffer.alloc(0),
    vppo,
  } as unknown as UpdateSample;
}
function group(prompt: number[], samples: UpdateSample[]): UpdateGroup {
  return { prompt_ids: Int32Array.from(prompt), samples } as unknown as UpdateGroup;
}

const a = group([7, 8, 9], [sample('s2', [5]), sample('s0', [4, 4])]);
const b = group([6], [sample('s1', [3, 3, 3]), sample('s3', [2])]);

test('policy batches: id order, prompt then response right-padded, targets at the response positions', () => {
  // s2 again (a redelivered group) is dropped
  const out = packPolicyBatches(
    [a, b, group([7, 8, 9], [sample('s2', [5])])],
    { oldLogprobs: new Map([['s0', Float32Array.from([-1, -2])]]) },
    opts,
  );
  assert.equal(out.length, 2);
  const [m0, m1] = out.map((o) => o.batch);
  // mini-batch 0: s0 (prompt 7 8 9, response 4 4) and s1 (prompt 6, response 3 3 3); T = 5
  assert.equal(m0.batchSize, 2);
  assert.equal(m0.seqLen, 5);
  assert.deepEqual([...m0.tokens], [7, 8, 9, 4, 4, 6, 3, 3, 3, PAD]);
  assert.deepEqual([...m0.attentionMask!], [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]);
  assert.deepEqual([...m0.responseMask!], [0, 0, 0, 1, 1, 0, 1, 1, 1, 0]);
  assert.deepEqual([...m0.advantages!], [0, 0, 0, 100, 101, 0, 100, 101, 102, 0]);
  // recomputed old log-probs (s0) win over the behaviour log-probs (s1)
  assert.deepEqual([...m0.oldLogprobs!], [0, 0, 0, -1, -2, 0, -10, -9, -8, 0]);
  assert.deepEqual([...m0.lossWeights!], [0, 0, 0, 1, 1, 0, 1, 1, 1, 0]);
  assert.equal(m0.refLogprobs, undefined, 'no KL loss: no reference log-probs');
  assert.equal(m0.rewards, undefined);
  assert.equal(m0.images, undefined);
  assert.deepEqual(m0.globalBatch, { loss_scale_factor: 8 });
  assert.equal(out[0].tokens, 5 + 4);
  // mini-batch 1: s2 (prompt 7 8 9, response 5) and s3 (prompt 6, response 2); T = 4
  assert.deepEqual([...m1.tokens], [7, 8, 9, 5, 6, 2, PAD, PAD]);
  assert.equal(out[1].tokens, 4 + 2);
});

test('policy batches: reference log-probs with the KL loss, VPPO mask and scaling, NFT targets', () => {
  const v = group(
    [1],
    [
      sample('t0', [4, 4, 4], {
        perturbed_logprobs: new Float32Array(3),
        token_mask: Buffer.from([1, 0, 1]),
        scaling_factor: 0.5,
      }),
      sample('t1', [4]),
    ],
  );
  const nft = new Map([
    ['t0', { reward: 1 as const, groupAccuracy: 0.5 }],
    ['t1', { reward: -1 as const, groupAccuracy: 0.5 }],
  ]);
  const [{ batch }] = packPolicyBatches([v], { oldLogprobs: new Map(), nft }, { ...opts, vppo: true, klLoss: true });
  assert.deepEqual([...batch.refLogprobs!], [0, -20, -19, -18, 0, -20, 0, 0]);
  assert.deepEqual([...batch.advantages!], [0, 50, 50.5, 51, 0, 100, 0, 0]);
  assert.deepEqual([...batch.lossWeights!], [0, 1, 0, 1, 0, 1, 0, 0]);
  assert.deepEqual(batch.rewards, [1, -1]);
  assert.deepEqual(batch.groupAccuracy, [0.5, 0.5]);
  // VPPO off: the recorded mask and scaling are ignored
  const [{ batch: off }] = packPolicyBatches([v], { oldLogprobs: new Map() }, opts);
  assert.deepEqual([...off.advantages!], [0, 100, 101, 102, 0, 100, 0, 0]);
  assert.deepEqual([...off.lossWeights!], [0, 1, 1, 1, 0, 1, 0, 0]);
});

test('value batches: old values and returns at the response positions, the images of each row', () => {
  const px = [{ h: 1 }] as never;
  const out = packValueBatches([a, b], new Map([[b, px]]), opts);
  const m0 = out[0].batch;
  assert.deepEqual([...m0.values!], [0, 0, 0, 200, 201, 0, 200, 201, 202, 0]);
  assert.deepEqual([...m0.returns!], [0, 0, 0, 300, 301, 0, 300, 301, 302, 0]);
  assert.equal(m0.advantages, undefined);
  assert.deepEqual(m0.images, [undefined, px]);
});

test('rollout correction: recomputed samples get TIS weights in their loss weights, the others keep theirs', () => {
  // s0's behaviour log-probs are −10, −9; recomputed −9, −9.5: ratios e^1 (capped at 2) and e^−0.5
  const old = new Map([['s0', Float32Array.from([-9, -9.5])]]);
  const fix = rolloutCorrectionOf([a, b], old, { mode: 'tis', level: 'token', threshold: 2, threshold_lower: null });
  assert.deepEqual([...fix.weights!.keys()], ['s0']);
  const [{ batch }] = packPolicyBatches([a, b], { oldLogprobs: old, isWeights: fix.weights }, opts);
  assert.deepEqual(
    [...batch.lossWeights!].map((v) => +v.toFixed(4)),
    [0, 0, 0, 2, +Math.exp(-0.5).toFixed(4), 0, 1, 1, 1, 0],
  );
  assert.ok(Math.abs(fix.metrics['rollout/is_weight_mean'] - (2 + Math.exp(-0.5)) / 2) < 1e-6);
  assert.equal(fix.metrics['rollout/is_weight_clipped_frac'], 0.5);
  const off = rolloutCorrectionOf([a, b], old, { mode: 'off', level: 'token', threshold: 2, threshold_lower: null });
  assert.equal(off.weights, null);
  assert.ok(off.metrics['rollout/mismatch_kl'] > 0);
  assert.deepEqual(
    rolloutCorrectionOf([a, b], new Map(), { mode: 'tis', level: 'token', threshold: 2, threshold_lower: null })
      .metrics,
    {},
  );
});
