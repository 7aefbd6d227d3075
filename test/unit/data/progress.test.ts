import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderProgress, formatDuration, formatTable } from '../../../lib/console/progress.ts';
import { lrAt } from '../../../lib/optim/lr-schedule.ts';
import { StepCollector } from '../../../lib/pipeline/collector.ts';

test('progress line shows steps, reward, val accuracy and ETA', () => {
  const line = renderProgress({ step: 5, totalSteps: 20, reward: 0.5, valAccuracy: 0.75 }, 50, 10);
  assert.equal(line, 'step 5/20  ███░░░░░░░  reward 0.500  val acc 0.750  elapsed 00:50  eta 02:30');
  assert.equal(formatDuration(3725), '1:02:05');
  assert.equal(formatDuration(NaN), '--:--');
});

test('tables align numbers right and text left', () => {
  assert.equal(
    formatTable([
      ['name', 'value'],
      ['a', 1],
      ['bb', 0.5],
    ]),
    'name   value\n----  ------\na          1\nbb    0.5000',
  );
});

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

test('step collector orders by id, drops duplicates and reports low watermarks', () => {
  const c = new StepCollector<number>();
  assert.equal(c.add('s1', 'b', 2, { topic: 't', partition: 0, offset: 7 }), true);
  assert.equal(c.add('s1', 'a', 1, { topic: 't', partition: 0, offset: 9 }), true);
  assert.equal(c.add('s1', 'a', 1, { topic: 't', partition: 0, offset: 12 }), false);
  c.add('s2', 'c', 3, { topic: 't', partition: 1, offset: 4 });
  assert.deepEqual(
    c.groups('s1').map((g) => g.id),
    ['a', 'b'],
  );
  assert.deepEqual(
    [...c.lowWatermarks()],
    [
      ['t:0', 7],
      ['t:1', 4],
    ],
  );
  c.take('s1');
  assert.deepEqual([...c.lowWatermarks()], [['t:1', 4]]);
});
