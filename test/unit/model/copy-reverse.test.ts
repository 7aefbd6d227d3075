/**
 * examples/copy-reverse.ts, the sanity check of the whole training path: from chance, the held-out
 * token accuracy of the tiny model reaches ≥ 99 % within the example's 600 SFT steps (it stops
 * there; about 300 steps and 10 s on 2 cores), and the curve rises on the way.
 */
import assert from 'node:assert/strict';
import { it } from 'node:test';
import { trainCopyReverse } from '../../../examples/copy-reverse.ts';

it(
  'copy/reverse: a tiny model learns to copy and reverse to ≥ 99 % held-out token accuracy',
  { timeout: 300_000 },
  async () => {
    const r = await trainCopyReverse({ threads: 1 });
    const first = r.history[0].accuracy,
      last = r.history.at(-1)!.accuracy;
    assert.equal(r.history[0].step, 0);
    assert.ok(first < 0.25, `untrained accuracy ${first} should be near chance`);
    assert.ok(
      last >= 0.99,
      `held-out accuracy after ${r.steps} steps: ${last} (curve ${r.history.map((h) => `${h.step}:${h.accuracy.toFixed(3)}`).join(' ')})`,
    );
    assert.ok(r.steps < 600, `stopped at the target before the step budget (${r.steps} steps)`);
  },
);
