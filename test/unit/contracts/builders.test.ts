import { test } from 'node:test';
import assert from 'node:assert/strict';
import { controlEvent, deadLetter } from '../../../lib/contracts/builders.ts';
import { createCodec } from '../../../lib/contracts/codec.ts';
import { controlId, refillId } from '../../../lib/contracts/ids.ts';
import { PoisonMessageError, TransientError } from '../../../lib/errors.ts';
import { Gen, plain } from './fixtures.ts';

test('controlEvent sets the payload of its type and nulls the others; the codec accepts it', () => {
  const ev = controlEvent(
    'refill_request',
    { request: 2, needed: 5, filtered_group_ids: ['r/train/s3/p1'], reason: 'all rewards equal' },
    { run_id: 'r', id: refillId('r', 3, 2), step: 3, policy_version: 2, time_ms: 1 },
  );
  assert.equal(ev.type, 'refill_request');
  assert.equal(ev.refill_request.needed, 5);
  assert.equal(ev.run_done, null);
  assert.equal(ev.run_started, null);
  const c = createCodec('control');
  assert.deepEqual(plain(c.decode(c.encode(ev))), plain(ev));
  const done = controlEvent(
    'run_done',
    { final_version: 9, steps: 9 },
    { run_id: 'r', id: controlId('r', 'run_done'), step: 9, policy_version: 9, time_ms: 2 },
  );
  assert.equal(c.decode(c.encode(done)).type, 'run_done');
});

test('deadLetter keeps the message byte for byte with the error code and retriable flag; its id is deterministic', () => {
  const codec = createCodec('trajectories');
  const payload = Buffer.from(codec.encode(new Gen(51).trajectoryGroup(2)).subarray(0, 40));
  let err: unknown;
  try {
    codec.decodeWithHeaders(codec.headers(), payload);
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof PoisonMessageError);
  const msg = {
    topic: 'rl.r.trajectories',
    partition: 4,
    offset: '1234567890123',
    key: 'abc',
    headers: { 'rl-schema': 'trajectories.v1', other: [Buffer.from([1, 2])] },
    value: payload,
  };
  const dl = deadLetter({ runId: 'r', stage: 'reward', message: msg, error: err, attempts: 1, timeMs: 5 });
  assert.equal(dl.id, 'r/deadletter/reward/rl.r.trajectories/4/1234567890123');
  assert.equal(deadLetter({ runId: 'r', stage: 'reward', message: msg, error: err, attempts: 3, timeMs: 9 }).id, dl.id);
  assert.equal(dl.error_code, 'ERR_POISON');
  assert.equal(dl.retriable, false);
  assert.equal(dl.schema, 'trajectories.v1');
  assert.match(dl.reason, /truncated/);
  assert.deepEqual(dl.payload, payload);
  const kept = Buffer.from(payload);
  payload.fill(0);
  assert.deepEqual(dl.payload, kept, 'the payload is copied, not a view of the consumer buffer');
  assert.deepEqual(dl.key, Buffer.from('abc'));
  assert.deepEqual(dl.headers, { 'rl-schema': Buffer.from('trajectories.v1'), other: Buffer.from([1, 2]) });
  const dc = createCodec('deadletter');
  assert.deepEqual(plain(dc.decode(dc.encode(dl))), plain(dl));
  const transient = deadLetter({
    runId: 'r',
    stage: 'reward',
    message: { ...msg, value: null, key: null, headers: undefined },
    error: new TransientError('registry down'),
    attempts: 5,
    timeMs: 5,
    schema: 'confluent:7',
    step: 3,
    policyVersion: 2,
  });
  assert.equal(transient.retriable, true);
  assert.equal(transient.error_code, 'ERR_TRANSIENT');
  assert.equal(transient.schema, 'confluent:7');
  assert.equal(transient.payload, null);
  assert.equal(transient.step, 3);
  assert.deepEqual(plain(dc.decode(dc.encode(transient))), plain(transient));
  assert.equal(
    deadLetter({ runId: 'r', stage: 's', message: msg, error: 'plain string', attempts: 1, timeMs: 0 }).error_code,
    'ERR_UNKNOWN',
  );
  assert.throws(
    () => deadLetter({ runId: 'r', stage: 's', message: { ...msg, offset: 'x' }, error: err, attempts: 1, timeMs: 0 }),
    /offset x is not a non-negative integer/,
  );
});
