import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { stepCapNotice, totalSteps } from '../../../lib/pipeline/plan.ts';

describe('stepCapNotice (trainer.max_steps capped by total_epochs)', () => {
  const plan = { trainSize: 1024, rolloutBatchSize: 128, totalEpochs: 1, maxSteps: 20, valOnly: false };
  it('names both numbers and the key to change when max_steps is capped', () => {
    assert.equal(totalSteps(plan), 8);
    const line = stepCapNotice(plan)!;
    assert.match(line, /trainer\.max_steps = 20, but trainer\.total_epochs = 1 gives only 8 steps/);
    assert.match(line, /1024 training rows \/ data\.rollout_batch_size 128 = 8 steps per epoch/);
    assert.match(line, /set trainer\.total_epochs=3 to train 20 steps/);
    assert.ok(!line.includes('\n'));
  });
  it('says nothing when max_steps fits, is unset, or the run only validates', () => {
    assert.equal(stepCapNotice({ ...plan, maxSteps: 8 }), null);
    assert.equal(stepCapNotice({ ...plan, maxSteps: null }), null);
    assert.equal(stepCapNotice({ ...plan, valOnly: true }), null);
    assert.equal(stepCapNotice({ ...plan, totalEpochs: 3 }), null);
  });
  it('an epoch without a full batch says so', () => {
    assert.match(
      stepCapNotice({ ...plan, trainSize: 100 })!,
      /an epoch has no full batch .* trains 0 steps: lower data\.rollout_batch_size/,
    );
  });
});
