import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { HASH_SLICE, sha256Hex, updateHash } from '../../../lib/util/hash.ts';

test('sliced SHA-256 equals the one-call digest, whatever the slice', () => {
  const data = randomBytes(1000);
  const whole = createHash('sha256').update(data).digest('hex');
  for (const slice of [1, 7, 64, 999, 1000, 4096]) assert.equal(sha256Hex(data, slice), whole, `slice ${slice}`);
  // two arrays fed one after the other, as the checkpoint writer feeds a file's parts
  const h = createHash('sha256');
  updateHash(h, data.subarray(0, 300), 13);
  updateHash(h, data.subarray(300), 13);
  assert.equal(h.digest('hex'), whole);
  assert.equal(sha256Hex(new Uint8Array(0)), createHash('sha256').digest('hex'));
});

test('the slice stays under the 2^31 − 1 bytes Hash.update takes in one call', () => {
  assert.ok(HASH_SLICE > 0 && HASH_SLICE <= 2 ** 31 - 1);
});
