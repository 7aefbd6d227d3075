/** serve's SIGTERM handling (app/serve.ts gracefulStop): first signal aborts, a second one or the deadline exits with 143. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { gracefulStop } from '../../../app/serve.ts';
import { silentLogger } from '../../../lib/log.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Removes the listeners gracefulStop added (not the test runner's). */
function restore(before: { term: unknown[]; int: unknown[] }): void {
  for (const l of process.listeners('SIGTERM'))
    if (!before.term.includes(l)) process.removeListener('SIGTERM', l as NodeJS.SignalsListener);
  for (const l of process.listeners('SIGINT'))
    if (!before.int.includes(l)) process.removeListener('SIGINT', l as NodeJS.SignalsListener);
}
const listeners = () => ({ term: [...process.listeners('SIGTERM')], int: [...process.listeners('SIGINT')] });

test('the first SIGTERM aborts the signal; a second exits at once', () => {
  const before = listeners();
  const exits: number[] = [];
  const signal = gracefulStop(60_000, silentLogger(), (c) => exits.push(c));
  assert.equal(signal.aborted, false);
  process.emit('SIGTERM', 'SIGTERM');
  assert.equal(signal.aborted, true);
  assert.deepEqual(exits, [], 'the stage gets its grace period');
  process.emit('SIGTERM', 'SIGTERM');
  assert.deepEqual(exits, [143]);
  restore(before);
});

test('the deadline exits when stopping takes too long', async () => {
  const before = listeners();
  const exits: number[] = [];
  const signal = gracefulStop(50, silentLogger(), (c) => exits.push(c));
  process.emit('SIGINT', 'SIGINT');
  assert.equal(signal.aborted, true);
  await sleep(150);
  assert.deepEqual(exits, [143]);
  restore(before);
});
