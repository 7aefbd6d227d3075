import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import {
  assertRunId,
  chunkId,
  controlId,
  deadLetterId,
  groupId,
  groupIdFor,
  hashId,
  metricsId,
  parseId,
  policyId,
  refillId,
  sampleId,
  sampleIdFor,
  seedFromId,
  seedWordsFromId,
  valGroupId,
  valSampleId,
} from '../../../lib/contracts/ids.ts';
import {
  copyFloat32,
  copyInt32,
  packFloat32,
  packInt32,
  unpackFloat32,
  unpackInt32,
} from '../../../lib/contracts/packing.ts';

test('ids are derived from run, kind, step/round, prompt and sample, and parse back', () => {
  assert.equal(groupId('r1', 3, 17), 'r1/train/s3/p17');
  assert.equal(sampleId('r1', 3, 17, 5), 'r1/train/s3/p17/n5');
  assert.equal(valGroupId('r1', 4, 0), 'r1/val/r4/p0');
  assert.equal(valSampleId('r1', 4, 0, 2), 'r1/val/r4/p0/n2');
  assert.equal(groupIdFor('val', 'r1', 4, 0), valGroupId('r1', 4, 0));
  assert.equal(sampleIdFor('train', 'r1', 3, 17, 5), sampleId('r1', 3, 17, 5));
  assert.equal(chunkId('train', 'r1', 3, 16, 1), groupId('r1', 3, 16));
  assert.equal(chunkId('train', 'r1', 3, 16, 4), 'r1/train/s3/p16+4');
  assert.equal(policyId('r1', 0), 'r1/policy/v0');
  assert.equal(metricsId('r1', 'update', 'train', 3), 'r1/metrics/update/train/s3/step');
  assert.equal(controlId('r1', 'epoch_started', 'e2'), 'r1/control/epoch_started/e2');
  assert.equal(refillId('r1', 3, 2), 'r1/control/refill_request/s3.q2');
  assert.equal(
    deadLetterId('r1', 'reward', 'rl.r1.trajectories', 2, 2n ** 62n),
    `r1/deadletter/reward/rl.r1.trajectories/2/${2n ** 62n}`,
  );
  assert.deepEqual(parseId('my.run-1/train/s3/p17/n5'), {
    runId: 'my.run-1',
    kind: 'train',
    step: 3,
    promptIndex: 17,
    sampleIndex: 5,
  });
  assert.deepEqual(parseId(valGroupId('x', 9, 1)), {
    runId: 'x',
    kind: 'val',
    step: 9,
    promptIndex: 1,
    sampleIndex: null,
  });
  assert.equal(parseId('x/policy/v1'), null);
  assert.equal(parseId('x/train/s1/p1/n1/extra'), null);
});

test('distinct positions give distinct ids and hashes; the same position always the same', () => {
  const seen = new Set<string>();
  for (const kind of ['train', 'val'] as const) {
    for (let step = 0; step < 12; step++) {
      for (let p = 0; p < 12; p++) {
        for (let n = 0; n < 12; n++) {
          const id = sampleIdFor(kind, 'run', step, p, n);
          assert.equal(id, sampleIdFor(kind, 'run', step, p, n));
          seen.add(hashId(id));
        }
      }
    }
  }
  assert.equal(seen.size, 2 * 12 * 12 * 12);
  // step 1 prompt 11 vs step 11 prompt 1: no ambiguity
  assert.notEqual(groupId('r', 1, 11), groupId('r', 11, 1));
});

test('hashId and seeds are sha256-derived, stable, and salted on request', () => {
  const id = sampleId('r1', 3, 17, 5);
  const digest = createHash('sha256').update(id).digest();
  assert.equal(hashId(id), digest.toString('hex').slice(0, 16));
  assert.match(hashId(id), /^[0-9a-f]{16}$/);
  assert.equal(seedFromId(id), BigInt(`0x${hashId(id)}`), 'the seed is the hash as a number');
  const [hi, lo] = seedWordsFromId(id);
  assert.equal((BigInt(hi) << 32n) | BigInt(lo), seedFromId(id));
  assert.notEqual(seedFromId(id, 'seed=1'), seedFromId(id));
  assert.equal(seedFromId(id, 'seed=1'), seedFromId(id, 'seed=1'));
  assert.notEqual(seedFromId(id, 'seed=1'), seedFromId(id, 'seed=2'));
  assert.ok(seedFromId(id) < 2n ** 64n);
});

test('bad arguments are refused with what to use instead', () => {
  assert.throws(() => groupId('a/b', 1, 1), /invalid run id "a\/b": use 1–128 letters, digits/);
  assert.throws(() => assertRunId(''), /invalid run id ""/);
  assert.throws(() => assertRunId('x'.repeat(129)), /invalid run id/);
  assert.doesNotThrow(() => assertRunId('x'.repeat(128)));
  assert.throws(() => groupId('r', -1, 0), /step must be a non-negative integer, got -1/);
  assert.throws(() => sampleId('r', 1, 0.5, 0), /promptIndex must be a non-negative integer, got 0\.5/);
  assert.throws(() => chunkId('train', 'r', 1, 0, 0), /count must be a positive integer, got 0/);
  assert.throws(() => metricsId('r', 'up/date', 'train', 1), /stage must be letters, digits/);
  assert.throws(() => deadLetterId('r', 'reward', 't', 0, -1), /offset must be a non-negative integer, got -1/);
});

test('packing: views without copies, aligned unpack is a view, unaligned a copy', () => {
  const ids = Int32Array.from([1, -2, 151_000, 2 ** 31 - 1]);
  const b = packInt32(ids);
  assert.equal(b.buffer, ids.buffer, 'pack is a view');
  assert.deepEqual([...b.subarray(0, 8)], [1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff], 'little-endian');
  const view = unpackInt32(b);
  assert.equal(view.buffer, ids.buffer, 'aligned unpack is a view');
  assert.deepEqual(view, ids);
  const unaligned = Buffer.alloc(b.length + 1).fill(7);
  b.copy(unaligned, 1);
  const u = unpackInt32(unaligned.subarray(1));
  assert.notEqual(u.buffer, unaligned.buffer, 'unaligned unpack copies');
  assert.deepEqual(u, ids);
  const f = Float32Array.from([0, -0.5, Number.NEGATIVE_INFINITY, 3.4e38]);
  assert.deepEqual(unpackFloat32(packFloat32(f)), f);
  const fu = Buffer.alloc(17);
  packFloat32(f).copy(fu, 1);
  assert.deepEqual(unpackFloat32(fu.subarray(1)), f);
  assert.deepEqual(copyInt32(b), ids);
  assert.notEqual(copyFloat32(packFloat32(f)).buffer, f.buffer);
  assert.throws(() => unpackInt32(Buffer.alloc(6)), /unpackInt32: 6 bytes is not a multiple of 4/);
  assert.throws(() => unpackFloat32(Buffer.alloc(3)), /not a multiple of 4/);
});
