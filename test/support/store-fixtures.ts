/**
 * Deterministic store fixtures: trajectory rows whose every field depends on (runId, i), and
 * float32-aware comparison helpers (the store keeps per-token numbers as real = float32).
 */
import assert from 'node:assert/strict';
import type { StoredTrajectory, TrajectoryRow } from '../../lib/store/port.ts';

let counter = 0;

/** A run id no other test (or concurrent test process on the shared PostgreSQL) uses. */
export function uniqueRunId(prefix: string): string {
  counter += 1;
  return `${prefix}-${process.pid}-${Date.now().toString(36)}-${counter}`;
}

/** One complete trajectory; `responseLength` tokens, arrays filled from (i, k). */
export function trajectory(
  runId: string,
  i: number,
  over: Partial<TrajectoryRow> = {},
  responseLength = 12,
): TrajectoryRow {
  const n = over.responseTokens?.length ?? responseLength;
  const lp = Float32Array.from({ length: n }, (_, k) => -((i * 31 + k * 7) % 97) / 13);
  const failed = i % 5 === 4;
  return {
    id: `${runId}/s${Math.floor(i / 8)}/p${Math.floor(i / 4)}/${i % 4}`,
    runId,
    step: Math.floor(i / 8),
    epoch: 0,
    kind: 'train',
    groupUid: `${runId}/g${Math.floor(i / 4)}`,
    promptIndex: Math.floor(i / 4),
    sampleIndex: i % 4,
    policyVersion: Math.floor(i / 8),
    promptTokens: Array.from({ length: 5 }, (_, k) => 100 + i + k),
    responseTokens: Int32Array.from({ length: n }, (_, k) => 1000 + ((i * 17 + k) % 5000)),
    promptText: `prompt ${i}: what is ${i} + ${i}?`,
    responseText: `the answer is ${2 * i}`,
    groundTruth: String(2 * i),
    behaviourLogprobs: lp,
    refLogprobs: lp.map((x) => x - 0.125),
    oldLogprobs: null,
    advantages: new Float32Array(n).fill((i % 3) - 1),
    advantage: (i % 3) - 1,
    returns: null,
    reward: failed ? null : i % 2,
    rewardDetails: failed ? null : { correct: i % 2 === 1, format: 1 },
    rewardFailure: failed ? 'reward server timed out after 3 attempts' : null,
    finishReason: 'stop',
    filtered: false,
    filterReason: null,
    staleness: i % 2,
    ...over,
  };
}

/** Float32 equality that treats NaN as equal to NaN (values come back as the nearest float32). */
export function sameFloat32(a: number, b: number): boolean {
  return Object.is(Math.fround(a), Math.fround(b));
}

export function assertFloat32Array(
  actual: readonly number[] | null,
  expected: ArrayLike<number> | null | undefined,
  what: string,
): void {
  if (expected === null || expected === undefined) {
    assert.equal(actual, null, `${what}: expected NULL`);
    return;
  }
  assert.ok(Array.isArray(actual), `${what}: expected an array, got ${String(actual)}`);
  assert.equal(actual.length, expected.length, `${what}: length`);
  for (let k = 0; k < expected.length; k++) {
    assert.ok(sameFloat32(actual[k]!, expected[k]!), `${what}[${k}]: stored ${actual[k]}, wrote ${expected[k]}`);
  }
}

/** Asserts that a stored trajectory holds exactly what was written. */
export function assertSameTrajectory(stored: StoredTrajectory | undefined, row: TrajectoryRow): void {
  assert.ok(stored, `trajectory ${row.id} was not stored`);
  const scalar = [
    'id',
    'runId',
    'step',
    'epoch',
    'kind',
    'groupUid',
    'promptIndex',
    'sampleIndex',
    'policyVersion',
    'promptText',
    'responseText',
    'groundTruth',
    'rewardFailure',
    'finishReason',
    'filtered',
    'filterReason',
    'staleness',
    'generatedImageHash',
  ] as const;
  for (const k of scalar) assert.deepEqual(stored[k], row[k] ?? null, `${row.id}.${k}`);
  assert.deepEqual(stored.rewardDetails, row.rewardDetails ?? null, `${row.id}.rewardDetails`);
  assert.ok(
    Object.is(stored.reward, row.reward ?? null),
    `${row.id}.reward: stored ${stored.reward}, wrote ${row.reward}`,
  );
  assert.ok(
    Object.is(stored.advantage, row.advantage ?? null),
    `${row.id}.advantage: stored ${stored.advantage}, wrote ${row.advantage}`,
  );
  assert.deepEqual(stored.promptTokens, Array.from(row.promptTokens), `${row.id}.promptTokens`);
  assert.deepEqual(stored.responseTokens, Array.from(row.responseTokens), `${row.id}.responseTokens`);
  assert.equal(stored.responseLength, row.responseTokens.length, `${row.id}.responseLength`);
  assertFloat32Array(stored.behaviourLogprobs, row.behaviourLogprobs, `${row.id}.behaviourLogprobs`);
  assertFloat32Array(stored.refLogprobs, row.refLogprobs, `${row.id}.refLogprobs`);
  assertFloat32Array(stored.oldLogprobs, row.oldLogprobs, `${row.id}.oldLogprobs`);
  assertFloat32Array(stored.advantages, row.advantages, `${row.id}.advantages`);
  assertFloat32Array(stored.returns, row.returns, `${row.id}.returns`);
  assert.deepEqual(stored.imageHashes, [...(row.imageHashes ?? [])], `${row.id}.imageHashes`);
  assertFloat32Array(stored.vppoPerturbedLogprobs, row.vppoPerturbedLogprobs, `${row.id}.vppoPerturbedLogprobs`);
  assert.deepEqual(
    stored.vppoTokenMask,
    row.vppoTokenMask == null ? null : Array.from(row.vppoTokenMask as ArrayLike<boolean | number>, (x) => !!x),
    `${row.id}.vppoTokenMask`,
  );
  assert.equal(stored.vppoScalingFactor, row.vppoScalingFactor ?? null, `${row.id}.vppoScalingFactor`);
  assertFloat32Array(stored.vppoEntropies, row.vppoEntropies, `${row.id}.vppoEntropies`);
  assert.ok(stored.createdAt instanceof Date, `${row.id}.createdAt`);
}
