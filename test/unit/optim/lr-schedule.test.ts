import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lrAt } from '../../../lib/optim/lr-schedule.ts';

test('lr schedules: linear warmup, constant, cosine to min ratio', () => {
  const c = { lr: 1e-3, scheduler: 'cosine' as const, warmupSteps: 2, minLrRatio: 0.1 };
  assert.equal(lrAt(c, 1, 12), 5e-4);
  assert.equal(lrAt(c, 2, 12), 1e-3);
  assert.ok(Math.abs(lrAt(c, 12, 12) - 1e-4) < 1e-12);
  assert.ok(Math.abs(lrAt(c, 7, 12) - 1e-3 * (0.1 + 0.9 * 0.5)) < 1e-12);
  assert.equal(lrAt({ lr: 2, scheduler: 'constant', warmupRatio: 0.5 }, 3, 4), 2);
  assert.equal(lrAt({ lr: 2, scheduler: 'constant', warmupRatio: 0.5 }, 1, 4), 1);
  assert.throws(() => lrAt(c, 0, 10), /must be ≥ 1/);
});
