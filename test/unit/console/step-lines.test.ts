import { test } from 'node:test';
import assert from 'node:assert/strict';
import { StepLines } from '../../../lib/console/step-lines.ts';
import type { MetricsRecord } from '../../../lib/contracts/index.ts';

const rec = (stage: string, step: number, values: Record<string, number>, kind: 'train' | 'val' = 'train') =>
  ({
    run_id: 'r',
    id: `${stage}-${step}`,
    kind,
    stage,
    replica: '',
    step,
    values,
    timing_ms: {},
    time_ms: 0,
  }) as unknown as MetricsRecord;

test('one line per trained step, once the update stage reports it, with the main metrics of every stage', () => {
  const lines = new StepLines(() => 10, 1000);
  assert.equal(lines.add(rec('rollout', 1, { 'response_length/mean': 12.5 }), 1100), null);
  assert.equal(lines.add(rec('reward', 1, { 'reward/mean': 0.25, 'reward/accuracy': 0.5 }), 1200), null);
  assert.equal(lines.add(rec('advantage', 1, { 'kl/mean': 0.002 }), 1300), null);
  assert.equal(lines.add(rec('controller', 1, { 'val/accuracy': 0.9 }, 'val'), 1300), null);
  const l = lines.add(rec('update', 1, { 'actor/entropy': 1.5, 'actor/kl_loss': 9 }), 3500)!;
  assert.deepEqual(l.fields, {
    reward: 0.25,
    accuracy: 0.5,
    kl: 0.002,
    entropy: 1.5,
    response_length: 12.5,
    step_time_s: 2.5,
  });
  assert.equal(
    l.text,
    'step 1/10: reward 0.250, accuracy 0.500, kl 2.00e-3, entropy 1.500, response length 12.500, step time 2.50 s',
  );
  // a second update record of the same step (another flush) makes no second line
  assert.equal(lines.add(rec('update', 1, { 'perf/samples_per_second': 3 }), 3600), null);
  // no advantage KL: the KL loss; step time from the previous line
  const l2 = lines.add(rec('update', 2, { 'actor/kl_loss': 0.5 }), 4500)!;
  assert.deepEqual(l2.fields, { kl: 0.5, step_time_s: 1 });
});
