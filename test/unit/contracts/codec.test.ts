import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  Codec,
  EncodeError,
  PlainMessageCodec,
  SCHEMA_HEADER,
  createCodec,
  createMessageCodec,
} from '../../../lib/contracts/codec.ts';
import { SCHEMA_FAMILIES, schemaCatalogue, type SchemaFamily } from '../../../lib/contracts/schemas.ts';
import { avro } from '../../../lib/contracts/avro.ts';
import { PoisonMessageError } from '../../../lib/errors.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { Gen, plain } from './fixtures.ts';
import type { ControlEvent, ScoredGroup, TrajectoryGroup } from '../../../lib/contracts/types.ts';

const isPoison = (re?: RegExp) => (e: unknown) => {
  assert.ok(
    e instanceof PoisonMessageError,
    `expected PoisonMessageError, got ${(e as Error)?.name}: ${(e as Error)?.message}`,
  );
  assert.equal(e.retriable, false);
  if (re) assert.match(e.message, re);
  return true;
};
const isEncodeError = (re: RegExp) => (e: unknown) => {
  assert.ok(e instanceof EncodeError, `expected EncodeError, got ${(e as Error)?.name}: ${(e as Error)?.message}`);
  assert.match(e.message, re);
  return true;
};

test('every schema family round-trips seeded random records (unicode, empty arrays, 64-bit-ish longs)', () => {
  for (const seed of [1, 2, 3, 'x']) {
    const all = new Gen(seed).all();
    for (const family of SCHEMA_FAMILIES) {
      const codec = createCodec(family);
      assert.ok(all[family].length > 0, family);
      for (const rec of all[family] as unknown[]) {
        const bytes = (codec as Codec<unknown>).encode(rec);
        const back = (codec as Codec<unknown>).decode(bytes);
        assert.deepEqual(plain(back), plain(rec), `${family} seed ${seed}`);
        // the reuse path gives the same bytes
        assert.deepEqual((codec as Codec<unknown>).encode(rec, true), bytes);
      }
    }
  }
});

test('decoded packed arrays are typed arrays that own their memory', () => {
  const codec = createCodec('trajectories');
  const g = new Gen(5).trajectoryGroup(3, { n: 2, tokens: 7 });
  const bytes = codec.encode(g);
  for (const off of [0, 1, 2, 3]) {
    // every alignment of the message inside its buffer
    const holder = Buffer.alloc(bytes.length + off);
    bytes.copy(holder, off);
    const msg = holder.subarray(off);
    const d = codec.decode(msg);
    assert.ok(d.samples[1].response_ids instanceof Int32Array);
    assert.ok(d.samples[1].behaviour_logprobs instanceof Float32Array);
    assert.deepEqual(d.samples[1].behaviour_logprobs, g.samples[1].behaviour_logprobs);
    assert.notEqual(d.prompt_ids.buffer, holder.buffer);
    holder.fill(0);
    assert.deepEqual(
      d.samples[1].response_ids,
      g.samples[1].response_ids,
      'decoded data must survive reuse of the message buffer',
    );
  }
});

test('a batch over 1 MB encodes (growing the buffer) and round-trips', () => {
  const codec = new Codec('updates', { initialBufferBytes: 1024 });
  const g = new Gen(11).updateGroup(7, { n: 64, tokens: 1024 });
  g.filtered = false;
  g.filter_reason = null;
  const bytes = codec.encode(g);
  assert.ok(bytes.length > 1_000_000, `only ${bytes.length} bytes`);
  assert.deepEqual(plain(codec.decode(bytes)), plain(g));
  const small = new Gen(12).updateGroup(1, { n: 1, tokens: 3 });
  assert.deepEqual(plain(codec.decode(codec.encode(small))), plain(small), 'a small record after a large one');
});

test('reuse returns a view that the next encode overwrites; the default returns owned bytes', () => {
  const codec = createCodec('metrics');
  const gen = new Gen(3);
  const a = gen.metrics(1);
  const b = gen.metrics(2);
  const ownedA = codec.encode(a);
  const viewA = codec.encode(a, true);
  assert.deepEqual(viewA, ownedA);
  codec.encode(b, true);
  assert.notDeepEqual(viewA, ownedA, 'a reused view is overwritten by the next encode');
  assert.deepEqual(plain(codec.decode(ownedA)), plain(a));
});

test('every truncation of a record is poison, naming topic and schema', () => {
  const codec = new Codec<TrajectoryGroup>('trajectories', { label: 'rl.run.trajectories' });
  const bytes = codec.encode(new Gen(8).trajectoryGroup(2, { n: 2, tokens: 5 }));
  for (let cut = 0; cut < bytes.length; cut++) {
    assert.throws(
      () => codec.decode(bytes.subarray(0, cut)),
      isPoison(/^rl\.run\.trajectories: cannot decode a trajectories message \(writer schema trajectories\.v4/),
    );
  }
  assert.throws(() => codec.decode(bytes.subarray(0, 10)), isPoison(/truncated|invalid Avro data|rules/));
});

test('trailing bytes after a record are poison', () => {
  const codec = createCodec('policy');
  const bytes = codec.encode(new Gen(1).policyVersion(2));
  assert.throws(
    () => codec.decode(Buffer.concat([bytes, Buffer.from([0, 1])])),
    isPoison(/2 unexpected bytes after the record/),
  );
});

test('random garbage and corrupted records are poison or valid records, never another error or a hang', () => {
  const rng = Rng.fromSeed('garbage');
  const codec = createCodec('scored');
  const good = codec.encode(new Gen(4).scoredGroup(3, { n: 4, tokens: 16 }));
  let garbageRejected = 0;
  let flipped = 0;
  for (let i = 0; i < 400; i++) {
    const garbage = i % 2 === 0;
    let buf: Buffer;
    if (garbage) {
      buf = Buffer.from(Array.from({ length: rng.int(300) }, () => rng.int(256)));
    } else {
      buf = Buffer.from(good);
      for (let k = 0; k < 1 + rng.int(4); k++) buf[rng.int(buf.length)] = rng.int(256);
    }
    try {
      const v = codec.decode(buf);
      codec.encode(v); // whatever decodes (a flipped bit inside a float or text) must be a valid record
      flipped++;
    } catch (e) {
      isPoison()(e);
      if (garbage) garbageRejected++;
    }
  }
  assert.equal(garbageRejected, 200, 'random bytes never make a valid record');
  assert.ok(flipped < 200, 'some bit flips must be caught');
});

test('a corrupted array count (10^9 items) is rejected at once instead of looping', () => {
  const codec = createCodec('trajectories');
  const g = new Gen(2).trajectoryGroup(1, { n: 1, tokens: 1 });
  g.samples = [];
  const bytes = codec.encode(g);
  assert.equal(bytes[bytes.length - 1], 0, 'an empty array ends with a 0 block count');
  // zigzag varint of 10^9 followed by a few bytes: the decoder must stop at the end of the buffer
  const n = 2e9; // zigzag(1e9)
  const varint: number[] = [];
  let x = n;
  while (x >= 0x80) {
    varint.push((x % 0x80) | 0x80);
    x = Math.floor(x / 0x80);
  }
  varint.push(x);
  const corrupt = Buffer.concat([bytes.subarray(0, bytes.length - 1), Buffer.from(varint), Buffer.from([2, 0x41, 2])]);
  assert.throws(() => codec.decode(corrupt), isPoison(/truncated|invalid Avro data/));
  // the same for a map (metrics values)
  const m = createCodec('metrics');
  const rec = new Gen(2).metrics(1);
  rec.values = {};
  rec.timing_ms = {};
  const mb = m.encode(rec);
  const idx = mb.length - 1 - 6 - 1 - 1; // ... values{} (0) timing_ms{} (0) time_ms (6 bytes)
  assert.equal(mb[idx], 0);
  const corruptMap = Buffer.concat([mb.subarray(0, idx), Buffer.from(varint), mb.subarray(idx + 1)]);
  assert.throws(() => m.decode(corruptMap), isPoison());
});

test('plain wire format: the rl-schema header names the writer; wrong, unknown or malformed headers are poison', async () => {
  const mc = createMessageCodec('trajectories', { format: 'plain' }, { label: 'p.r.trajectories' });
  const g = new Gen(6).trajectoryGroup(4);
  const msg = mc.encode(g);
  assert.deepEqual(msg.headers, { [SCHEMA_HEADER]: 'trajectories.v4' });
  assert.deepEqual(plain(await mc.decode(msg.value, msg.headers)), plain(g));
  assert.deepEqual(
    plain(await mc.decode(msg.value, { [SCHEMA_HEADER]: Buffer.from('trajectories.v4') })),
    plain(g),
    'header as bytes',
  );
  assert.deepEqual(
    plain(await mc.decode(msg.value, { [SCHEMA_HEADER]: ['trajectories.v4'] })),
    plain(g),
    'header as a list',
  );
  assert.deepEqual(plain(await mc.decode(msg.value, {})), plain(g), 'no header: the current version');
  assert.equal(mc.writerOf(msg.value, msg.headers), 'trajectories.v4');
  await assert.rejects(
    mc.decode(msg.value, { [SCHEMA_HEADER]: 'scored.v1' }),
    isPoison(/written with schema scored\.v1 \(family scored\), but p\.r\.trajectories carries trajectories records/),
  );
  await assert.rejects(
    mc.decode(msg.value, { [SCHEMA_HEADER]: 'trajectories.v9' }),
    isPoison(
      /unknown schema version trajectories\.v9 \(this build knows trajectories\.v1, trajectories\.v2, trajectories\.v3, trajectories\.v4\).*upgrade this consumer/,
    ),
  );
  await assert.rejects(
    mc.decode(msg.value, { [SCHEMA_HEADER]: 'Trajectories v1' }),
    isPoison(/is not a schema name like trajectories\.v4/),
  );
  await assert.rejects(mc.decode(null, msg.headers), isPoison(/tombstone/));
});

test('a record of another family under the right header is poison, not a silent misread', () => {
  const t = createCodec('trajectories');
  const s = createCodec('scored');
  const scored = new Gen(7).scoredGroup(2, { n: 3 });
  assert.throws(() => t.decode(s.encode(scored)), isPoison());
});

test('encode errors name the field path and what was expected', () => {
  const codec = new Codec<TrajectoryGroup>('trajectories', { label: 'rl.r.trajectories' });
  const g = new Gen(9).trajectoryGroup(2, { n: 2, tokens: 4 });
  const bad1 = {
    ...g,
    samples: [g.samples[0], { ...g.samples[1], behaviour_logprobs: [0.1, 0.2] as unknown as Float32Array }],
  };
  assert.throws(
    () => codec.encode(bad1),
    isEncodeError(
      /^rl\.r\.trajectories: cannot encode a trajectories\.v4 record: samples\.1\.behaviour_logprobs: expected a Float32Array, got an array of length 2/,
    ),
  );
  const bad2 = { ...g, prompt_ids: new Float32Array(3) as unknown as Int32Array };
  assert.throws(
    () => codec.encode(bad2),
    isEncodeError(/prompt_ids: expected an Int32Array, got a Float32Array of length 3/),
  );
  const { data_source: _omit, ...bad3 } = g;
  assert.throws(
    () => codec.encode(bad3 as TrajectoryGroup),
    isEncodeError(/data_source: expected string, got undefined \(missing\)/),
  );
  assert.throws(
    () => codec.encode({ ...g, kind: 'test' as 'train' }),
    isEncodeError(/kind: expected one of train\|val, got string "test"/),
  );
  assert.throws(() => codec.encode({ ...g, step: 1.5 }), isEncodeError(/step: expected int, got number 1\.5/));
});

test('record rules are enforced on encode (producer bug) and on decode (poison)', () => {
  const gen = new Gen(10);
  const t = createCodec('trajectories');
  const g = gen.trajectoryGroup(3, { n: 2, tokens: 4 });
  const mismatch = { ...g, samples: [{ ...g.samples[0], behaviour_logprobs: new Float32Array(3) }, g.samples[1]] };
  assert.throws(
    () => t.encode(mismatch),
    isEncodeError(/samples\[0\]\.behaviour_logprobs: 3 values for 4 response tokens/),
  );
  assert.throws(
    () => t.encode({ ...g, group_uid: 'ffffffffffffffff' }),
    isEncodeError(/group_uid: "ffffffffffffffff" is not hashId\(id\)/),
  );
  assert.throws(() => t.encode({ ...g, step: g.step + 1 }), isEncodeError(/id: ".*" does not match run_id=.*step=4/));
  assert.throws(
    () => t.encode({ ...g, samples: [g.samples[0], { ...g.samples[1], sample_index: 0 }] }),
    isEncodeError(/samples\[1\]\.sample_index: 0 appears twice/),
  );
  // bytes written without the rules (e.g. by another client) are poison on decode
  const raw = schemaCatalogue().latest('trajectories').type.toBuffer(mismatch);
  assert.throws(
    () => t.decode(raw),
    isPoison(/breaks the trajectories rules: samples\[0\]\.behaviour_logprobs: 3 values for 4 response tokens/),
  );

  const s = createCodec('scored');
  const sg: ScoredGroup = gen.scoredGroup(2, { n: 2 });
  sg.samples[0] = { ...sg.samples[0], reward: null, failure: null };
  assert.throws(() => s.encode(sg), isEncodeError(/samples\[0\]\.reward: null without a failure record/));
  sg.samples[0] = { ...sg.samples[0], reward: 0, failure: { code: 'X', message: 'y', retriable: false, attempts: 1 } };
  assert.throws(() => s.encode(sg), isEncodeError(/samples\[0\]\.failure: set together with a reward/));
  sg.samples[0] = { ...sg.samples[0], reward: Number.NaN, failure: null };
  assert.throws(() => s.encode(sg), isEncodeError(/samples\[0\]\.reward: NaN is not finite/));

  const u = createCodec('updates');
  const ug = gen.updateGroup(2, { n: 2, tokens: 5 });
  ug.filtered = false;
  ug.filter_reason = null;
  ug.samples[1] = { ...ug.samples[1], advantages: new Float32Array(2) };
  assert.throws(() => u.encode(ug), isEncodeError(/samples\[1\]\.advantages: 2 values for 5 response tokens/));
  ug.filtered = true;
  assert.throws(() => u.encode(ug), isEncodeError(/filter_reason: a filtered group needs a reason/));
  ug.filter_reason = 'all rewards equal';
  assert.doesNotThrow(() => u.encode(ug), 'a filtered group may carry short per-token arrays');

  const c = createCodec('control');
  const ev = gen.controlEvents()[2] as ControlEvent;
  assert.throws(
    () => c.encode({ ...ev, run_done: { final_version: 1, steps: 1 } } as unknown as ControlEvent),
    isEncodeError(/run_done: set although type is refill_request/),
  );
  assert.throws(
    () => c.encode({ ...ev, refill_request: null } as unknown as ControlEvent),
    isEncodeError(/refill_request: type is refill_request but its payload is null/),
  );

  const p = createCodec('prompts');
  const pb = gen.promptBatch(3);
  assert.throws(() => p.encode({ ...pb, id: `${pb.id}x` }), isEncodeError(/is not the chunk id/));
  assert.throws(
    () => p.encode({ ...pb, groups: [] }),
    isEncodeError(/groups: a prompt batch needs at least one group/),
  );
  const pol = createCodec('policy');
  assert.throws(
    () => pol.encode({ ...gen.policyVersion(3), sha256: 'ABC' }),
    isEncodeError(/sha256: "ABC" is not 64 lowercase hex chars/),
  );
  const m = createCodec('metrics');
  assert.throws(
    () => m.encode({ ...gen.metrics(1), run_id: 'no/slash' }),
    isEncodeError(/run_id: "no\/slash" is not a valid run id/),
  );
});

test('control events narrow on type', () => {
  const c = createCodec('control');
  for (const ev of new Gen(1).controlEvents()) {
    const d = c.decode(c.encode(ev));
    switch (d.type) {
      case 'refill_request':
        assert.equal(d.refill_request.needed, 3);
        break;
      case 'run_started':
        assert.equal(d.run_started.seed, 2 ** 40);
        break;
      case 'epoch_started':
        assert.equal(d.epoch_started.first_step, 11);
        break;
      case 'val_round_done':
        assert.equal(d.val_round_done.round, 5);
        break;
      case 'run_done':
        assert.equal(d.run_done.final_version, 100);
        break;
      case 'run_failed':
        assert.match(d.run_failed.message, /✗/);
        break;
    }
  }
});

test('a codec for an unknown family or version is a clear error', () => {
  assert.throws(() => createCodec('nope' as SchemaFamily), /no schema for "nope"; known: control, deadletter/);
  assert.throws(
    () => new Codec('trajectories', { ref: 'trajectories.v7' }),
    /unknown schema trajectories\.v7; known: /,
  );
  assert.throws(
    () => new Codec('trajectories', { ref: 'scored.v1' }),
    /schema scored\.v1 is not of family trajectories/,
  );
  assert.ok(new PlainMessageCodec(createCodec('policy')).codec.ref === 'policy.v1');
});

test('packed bytes whose length is not a multiple of 4 are poison', () => {
  const codec = createCodec('trajectories');
  const g = new Gen(13).trajectoryGroup(2, { n: 1, tokens: 2 });
  // the same schema without logical types writes Buffers where the codec writes typed arrays
  const rawType = avro.Type.forSchema(
    JSON.parse(codec.schema.text.replace(/,"logicalType":"(int32|float32)-le"/g, '')),
    { wrapUnions: 'never' },
  );
  const asBytes = (a: Int32Array | Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
  const raw = (promptIds: Buffer) =>
    rawType.toBuffer({
      ...g,
      prompt_ids: promptIds,
      samples: g.samples.map((s) => ({
        ...s,
        response_ids: asBytes(s.response_ids),
        behaviour_logprobs: asBytes(s.behaviour_logprobs),
      })),
    });
  assert.ok(raw(asBytes(g.prompt_ids)).equals(codec.encode(g)), 'the raw schema writes the same bytes');
  assert.throws(
    () => codec.decode(raw(Buffer.alloc(5))),
    isPoison(/int32-le field holds 5 bytes, not a multiple of 4/),
  );
});
