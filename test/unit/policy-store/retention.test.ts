/** Which policy versions the update stage prunes (lib/policy-store/retention.ts). */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { versionsToPrune, keptCheckpointSteps, optimizerStatesToPrune } from '../../../lib/policy-store/index.ts';

const all = (n: number) => Array.from({ length: n + 1 }, (_, i) => i);

test('keeps the reference, the newest two, and nothing else when on-policy', () => {
  assert.deepEqual(
    versionsToPrune(all(10), { newest: 10, maxStaleness: 0, checkpointSteps: [], keepExtra: 0 }),
    [1, 2, 3, 4, 5, 6, 7, 8],
  );
});

test('keeps versions within max_staleness and the kept checkpoints', () => {
  assert.deepEqual(
    versionsToPrune(all(10), { newest: 10, maxStaleness: 2, checkpointSteps: [4, 8], keepExtra: 0 }),
    [1, 2, 3, 5, 6],
  );
});

test('trainer.keep_policy_versions keeps that many more of the newest others', () => {
  assert.deepEqual(
    versionsToPrune(all(10), { newest: 10, maxStaleness: 0, checkpointSteps: [], keepExtra: 3 }),
    [1, 2, 3, 4, 5],
  );
  assert.deepEqual(versionsToPrune(all(10), { newest: 10, maxStaleness: 0, checkpointSteps: [], keepExtra: 100 }), []);
});

test('never prunes a version beyond the newest; a short run prunes nothing', () => {
  assert.deepEqual(
    versionsToPrune([0, 1, 2, 9], { newest: 2, maxStaleness: 0, checkpointSteps: [], keepExtra: 0 }),
    [],
  );
  assert.deepEqual(versionsToPrune([0, 1], { newest: 1, maxStaleness: 0, checkpointSteps: [], keepExtra: 0 }), []);
});

test('save_limit: only the newest checkpoints are kept', () => {
  assert.deepEqual(keptCheckpointSteps([2, 4, 6, 8], 2), [6, 8]);
  assert.deepEqual(keptCheckpointSteps([2, 4], -1), [2, 4]);
});

test('a validation round still running keeps its version', () => {
  assert.deepEqual(
    versionsToPrune(all(6), { newest: 6, maxStaleness: 0, checkpointSteps: [], keepExtra: 0, inUse: [2] }),
    [1, 3, 4],
  );
});

test('optimizer states are kept with their checkpoints only, never beyond the newest version', () => {
  const o = { newest: 10, maxStaleness: 2, checkpointSteps: [6, 8], keepExtra: 3 };
  assert.deepEqual(optimizerStatesToPrune([2, 4, 6, 8, 12], o), [2, 4]);
});
