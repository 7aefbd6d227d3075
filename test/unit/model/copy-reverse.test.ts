/**
 * A shortened run of examples/copy-reverse.ts: the held-out token accuracy of the tiny model must
 * rise clearly above chance within 60 SFT steps (the full example reaches ≥ 99 %).
 */
import assert from 'node:assert/strict';
import { it } from 'node:test';
import { trainCopyReverse } from '../../../examples/copy-reverse.ts';

it('copy/reverse: accuracy rises clearly within 60 steps', async () => {
  const r = await trainCopyReverse({ steps: 60, batchSize: 32, evalEvery: 30, threads: 1 });
  const first = r.history[0].accuracy, last = r.history.at(-1)!.accuracy;
  assert.equal(r.history[0].step, 0);
  assert.ok(first < 0.25, `untrained accuracy ${first} should be near chance`);
  assert.ok(last > 0.45 && last > first + 0.25, `held-out accuracy ${first} → ${last}`);
  assert.ok(r.history.at(-1)!.loss < 1.6, `final loss ${r.history.at(-1)!.loss}`);
});
