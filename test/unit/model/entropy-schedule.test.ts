/**
 * A scheduled entropy bonus (policy loss `entropyCoeffInput`, actor.entropy_coeff_end): the
 * coefficient is the graph input `entropy_coeff`, fed at every step. Fed the constant's value, a
 * step gives the constant-coefficient graph's weights bit for bit; fed another value, the loss
 * is pg_loss − that value · entropy.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { modelConfig } from '../../../lib/model/config.ts';
import type { LossConfigInput } from '../../../lib/model/loss.ts';
import { SessionCache } from '../../../lib/model/session-cache.ts';
import { createTrainer, type TrainBatch } from '../../../lib/model/train.ts';
import { linearCoefAt } from '../../../lib/optim/lr-schedule.ts';
import { trainerSettings } from '../../../lib/pipeline/trainer-settings.ts';
import { load } from '../config/helpers.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { TINY_ONE_LAYER } from '../../support/tiny-models.ts';

const model = modelConfig(TINY_ONE_LAYER);

function batch(): TrainBatch {
  const rng = Rng.fromSeed('entropy-schedule');
  const B = 3,
    T = 8,
    n = B * T;
  return {
    batchSize: B,
    seqLen: T,
    attentionMask: new Float32Array(n).fill(1),
    responseMask: Float32Array.from({ length: n }, (_, i) => (i % T >= 4 ? 1 : 0)),
    tokens: Int32Array.from({ length: n }, () => 3 + rng.int(model.vocabSize - 3)),
    advantages: Float32Array.from({ length: n }, () => rng.next() * 2 - 1),
    oldLogprobs: Float32Array.from({ length: n }, () => -3.3 + 0.4 * rng.next()),
  };
}

async function step(loss: LossConfigInput, entropyCoeff?: number) {
  const tr = createTrainer({ model, loss, threads: 1, seed: 3, cache: new SessionCache() });
  const s = await tr.step(batch(), 1e-2, entropyCoeff === undefined ? {} : { entropyCoeff });
  return { metrics: s.metrics, weights: new Map([...tr.weightsView()].map(([k, w]) => [k, Float32Array.from(w)])) };
}

describe('a scheduled entropy bonus', () => {
  it('fed the constant: the same step bit for bit; fed another value: loss = pg_loss − value · entropy', async () => {
    const constant = await step({ type: 'policy', entropyCoeff: 0.05 });
    const fed = await step({ type: 'policy', entropyCoeffInput: true }, 0.05);
    for (const [k, w] of constant.weights) assert.deepEqual(fed.weights.get(k), w, `${k} differs`);
    assert.equal(fed.metrics.loss, constant.metrics.loss);

    const high = await step({ type: 'policy', entropyCoeffInput: true }, 0.5);
    const m = high.metrics;
    assert.ok(
      Math.abs(m.loss - (m.pg_loss - 0.5 * m.entropy)) < 1e-5,
      `loss ${m.loss}, pg ${m.pg_loss}, H ${m.entropy}`,
    );
    const moved = [...constant.weights].filter(([k, w]) => w.some((x, i) => x !== high.weights.get(k)![i]));
    assert.ok(moved.length > 0, 'a larger bonus moves the weights elsewhere');
  });

  it('linearCoefAt: start at step 1, end at the last step and after', () => {
    assert.equal(linearCoefAt(0.1, 0, 1, 5), 0.1);
    assert.ok(Math.abs(linearCoefAt(0.1, 0, 3, 5) - 0.05) < 1e-15);
    assert.equal(linearCoefAt(0.1, 0, 5, 5), 0);
    assert.equal(linearCoefAt(0.1, 0.02, 9, 5), 0.02);
    assert.equal(linearCoefAt(0.1, 0.02, 1, 1), 0.02);
    assert.throws(() => linearCoefAt(0.1, 0, 0, 5), /must be ≥ 1/);
  });

  it('actor.entropy_coeff_end: the policy loss takes the coefficient as an input, scheduled from entropy_coeff', () => {
    const on = trainerSettings(load({ overrides: ['actor.entropy_coeff=0.1', 'actor.entropy_coeff_end=0'] }));
    assert.deepEqual(on.entropySchedule, { start: 0.1, end: 0 });
    assert.equal((on.policyLoss as { entropyCoeffInput?: boolean }).entropyCoeffInput, true);
    const off = trainerSettings(load({ overrides: ['actor.entropy_coeff=0.1'] }));
    assert.equal(off.entropySchedule, null);
    assert.equal((off.policyLoss as { entropyCoeffInput?: boolean }).entropyCoeffInput, false);
  });
});
