import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderProgress, formatDuration, formatTable } from '../../../lib/console/progress.ts';

test('progress line shows steps, reward, val accuracy and ETA', () => {
  const line = renderProgress({ step: 5, totalSteps: 20, reward: 0.5, valAccuracy: 0.75 }, 50, 10);
  assert.equal(line, 'step 5/20  ███░░░░░░░  reward 0.500  val acc 0.750  elapsed 00:50  eta 02:30');
  assert.equal(formatDuration(3725), '1:02:05');
  assert.equal(formatDuration(NaN), '--:--');
});

test('before step 1 the line says what start-up is doing; from step 1 the ETA', () => {
  const phase = 'loading the model from models/x and opening the trainer';
  assert.equal(
    renderProgress({ step: 0, totalSteps: 20, phase }, 12, 10),
    `step 0/20  ░░░░░░░░░░  elapsed 00:12  ${phase}`,
  );
  assert.equal(
    renderProgress({ step: 1, totalSteps: 20, phase }, 30, 10),
    'step 1/20  █░░░░░░░░░  elapsed 00:30  eta 09:30',
  );
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
