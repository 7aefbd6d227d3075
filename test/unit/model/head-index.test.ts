/**
 * The LM head only at the loss positions (train-graph.ts headIndex, the trainer's default): the
 * head runs on the gathered hidden states of the positions with a non-zero loss mask and its
 * results are placed back, so the prompt positions cost no vocabulary-sized work. Trainer steps
 * with it on and off must give the same metrics and weights (policy loss with a KL term and an
 * entropy bonus, left padding, micro-batches, one of them without any loss position; the SFT loss
 * and its token accuracy). Equal up to float rounding: the head's Gemms run over fewer rows, so
 * their blocking (and the scatter-add of the hidden-state gradient) may round differently.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { modelConfig } from '../../../lib/model/config.ts';
import type { LossConfigInput } from '../../../lib/model/loss.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { createTrainer, headFeeds, type TrainBatch } from '../../../lib/model/train.ts';
import { Rng } from '../../../lib/util/rng.ts';

const model = modelConfig({
  modelType: 'qwen2',
  attentionBias: true,
  tieWordEmbeddings: true,
  hiddenSize: 32,
  intermediateSize: 48,
  numHiddenLayers: 2,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  vocabSize: 37,
  maxPositionEmbeddings: 16,
  bosTokenId: 1,
  eosTokenId: 2,
  padTokenId: 0,
});

/** 4 rows of 10: row 1 left-padded by 3, row 3 with no response token (its micro-batch of 1 has no loss position). */
function batch(): TrainBatch {
  const rng = Rng.fromSeed('head-index');
  const B = 4,
    T = 10,
    n = B * T;
  const attn = Float32Array.from({ length: n }, (_, i) => (Math.floor(i / T) === 1 && i % T < 3 ? 0 : 1));
  const resp = Float32Array.from({ length: n }, (_, i) => (Math.floor(i / T) !== 3 && i % T >= 6 ? 1 : 0));
  return {
    batchSize: B,
    seqLen: T,
    attentionMask: attn,
    responseMask: resp,
    tokens: Int32Array.from({ length: n }, () => 3 + rng.int(model.vocabSize - 3)),
    advantages: Float32Array.from({ length: n }, () => rng.next() * 2 - 1),
    oldLogprobs: Float32Array.from({ length: n }, () => -3.6 + 0.4 * rng.next()),
    refLogprobs: Float32Array.from({ length: n }, () => -3.6 + 0.4 * rng.next()),
  };
}

/** The gradient and metrics of the batch, then the metrics of a step and of the gradient after it. */
async function run(loss: LossConfigInput, head: boolean, micro?: number) {
  const tr = createTrainer({
    model,
    loss,
    threads: 2,
    seed: 5,
    cache: new SessionCache(),
    headAtLossPositions: head,
    ...(micro ? { microBatchSize: micro } : {}),
  });
  const g1 = await tr.computeGradients(batch());
  const s = await tr.step(batch(), 1e-2);
  const g2 = await tr.computeGradients(batch());
  return { grads: [g1.grads, g2.grads], metrics: [g1.metrics, s.metrics, g2.metrics] };
}

function assertClose(a: Record<string, number>, b: Record<string, number>, what: string): void {
  assert.deepEqual(Object.keys(a).sort(), Object.keys(b).sort(), `${what}: the same metric names`);
  for (const k of Object.keys(a))
    assert.ok(
      Math.abs(a[k] - b[k]) <= 1e-5 * (1 + Math.abs(a[k])),
      `${what} ${k}: ${a[k]} (all positions) vs ${b[k]} (loss positions)`,
    );
}

/**
 * max |a − b| ≤ tol · max |a| per tensor, and no tensor all zero. After a step the weights already
 * differ by rounding, which AdamW's m / √v scales up where the gradient is small: a looser tol.
 */
function assertSameGrads(a: Map<string, Float32Array>, b: Map<string, Float32Array>, what: string, tol: number): void {
  assert.deepEqual([...b.keys()].sort(), [...a.keys()].sort());
  for (const [k, x] of a) {
    const y = b.get(k)!;
    let diff = 0,
      scale = 0;
    for (let i = 0; i < x.length; i++) {
      diff = Math.max(diff, Math.abs(x[i] - y[i]));
      scale = Math.max(scale, Math.abs(x[i]));
    }
    assert.ok(scale > 0, `${what} ${k}: an all-zero gradient tests nothing`);
    assert.ok(diff <= tol * scale, `${what} ${k}: gradients differ by ${diff} (largest element ${scale})`);
  }
}

describe('the LM head at the loss positions only', () => {
  it('headFeeds: the positions with a non-zero mask, and k + 1 at the k-th of them', () => {
    const f = headFeeds([0, 1, 0, 0.5, 1]);
    assert.deepEqual([...f.head_index], [1n, 3n, 4n]);
    assert.deepEqual([...f.head_inverse], [0n, 1n, 0n, 2n, 3n]);
    const none = headFeeds([0, 0]);
    assert.deepEqual([...none.head_index], [0n], 'no loss position: the head runs at position 0, placed nowhere');
    assert.deepEqual([...none.head_inverse], [0n, 0n]);
  });
  const cases: [string, LossConfigInput][] = [
    [
      'PPO loss with low_var_kl KL loss and an entropy bonus',
      { type: 'policy', useKlLoss: true, klLossType: 'low_var_kl', klLossCoef: 0.1, entropyCoeff: 0.01 },
    ],
    ['SFT loss (token accuracy from the placed argmax flags)', { type: 'sft' }],
  ];
  for (const [name, loss] of cases) {
    for (const micro of [undefined, 1]) {
      it(`${name}${micro ? ', micro-batches of 1 row' : ''}: the same gradients and metrics, before and after an AdamW step`, async () => {
        const off = await run(loss, false, micro),
          on = await run(loss, true, micro);
        off.metrics.forEach((m, i) =>
          assertClose(m, on.metrics[i], `${name} (${['gradient', 'step', 'gradient after the step'][i]})`),
        );
        off.grads.forEach((g, i) =>
          assertSameGrads(g, on.grads[i], `${name} (${i ? 'after the step' : 'first'})`, i ? 3e-4 : 1e-5),
        );
      });
    }
  }
});
