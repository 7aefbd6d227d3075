import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, appendFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { crc32c, decodeRecords, encodeRecord, maskedCrc32c } from '../../../lib/analysis/tfrecord.ts';
import {
  FILE_VERSION,
  TensorBoardWriter,
  decodeEvent,
  encodeScalarEvent,
  encodeVarint,
  readEventFile,
  readScalars,
} from '../../../lib/analysis/tensorboard.ts';

const tmp = () => mkdtempSync(join(tmpdir(), 'rlstream-tb-'));

test('CRC-32C matches the published check value and the RFC 3720 test vectors', () => {
  assert.equal(crc32c(Buffer.from('123456789')), 0xe3069283);
  assert.equal(crc32c(new Uint8Array(32)), 0x8a9136aa);
  assert.equal(crc32c(new Uint8Array(32).fill(0xff)), 0x62a8ab43);
  assert.equal(crc32c(Uint8Array.from({ length: 32 }, (_, i) => i)), 0x46dd794e);
  assert.equal(crc32c(Uint8Array.from({ length: 32 }, (_, i) => 31 - i)), 0x113fdb5c);
  assert.equal(crc32c(new Uint8Array(0)), 0);
  // The mask: rotate right by 15, add 0xa282ead8 (mod 2^32).
  const c = crc32c(Buffer.from('123456789'));
  assert.equal(maskedCrc32c(Buffer.from('123456789')), ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0);
});

test('varints and the Event encoding follow the protobuf wire format byte for byte', () => {
  assert.deepEqual(encodeVarint(0), [0]);
  assert.deepEqual(encodeVarint(1), [1]);
  assert.deepEqual(encodeVarint(300), [0xac, 0x02]);
  assert.deepEqual(encodeVarint(-1), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
  // Event{wall_time=1.5, step=3, summary{value{tag="a", simple_value=2}}}
  const ev = Buffer.from(encodeScalarEvent({ tag: 'a', step: 3, value: 2, wallTime: 1.5 }));
  const expected = Buffer.from([
    0x09,
    0,
    0,
    0,
    0,
    0,
    0,
    0xf8,
    0x3f, // field 1, fixed64: 1.5
    0x10,
    0x03, //                          field 2, varint: 3
    0x2a,
    0x0a, //                          field 5, 10 bytes: Summary
    0x0a,
    0x08, //                            field 1, 8 bytes: Value
    0x0a,
    0x01,
    0x61, //                        field 1 "a"
    0x15,
    0,
    0,
    0,
    0x40, //                     field 2, fixed32: 2.0f
  ]);
  assert.deepEqual(ev, expected);
  const back = decodeEvent(ev);
  assert.deepEqual(back, { wallTime: 1.5, step: 3, values: [{ tag: 'a', value: 2 }] });
  assert.equal(decodeEvent(Buffer.from(encodeScalarEvent({ tag: 'neg', step: -5, value: 0, wallTime: 0 }))).step, -5);
});

test('TFRecord framing round-trips and rejects a corrupted record with its offset', () => {
  const a = encodeRecord(Buffer.from('hello'));
  assert.equal(a.length, 8 + 4 + 5 + 4);
  assert.equal(a.readBigUInt64LE(0), 5n);
  assert.equal(a.readUInt32LE(8), maskedCrc32c(a.subarray(0, 8)));
  const b = encodeRecord(Buffer.from('world!'));
  const both = Buffer.concat([a, b]);
  assert.deepEqual(decodeRecords(both).records.map(String), ['hello', 'world!']);
  const bad = Buffer.from(both);
  bad[a.length + 13] ^= 0x01; // a data byte of the second record
  assert.throws(() => decodeRecords(bad, 'f'), /f: corrupt record data at byte 21 \(CRC mismatch\)/);
  const badLen = Buffer.from(both);
  badLen[0] ^= 0x01;
  assert.throws(() => decodeRecords(badLen), /corrupt record length at byte 0/);
  // A torn final record (writer killed mid-write) is reported, not thrown.
  const torn = decodeRecords(both.subarray(0, both.length - 3));
  assert.deepEqual(torn.records.map(String), ['hello']);
  assert.equal(torn.truncatedAt, a.length);
});

test('TensorBoardWriter writes a readable event file: file_version first, then the scalars', () => {
  const dir = tmp();
  try {
    const w = new TensorBoardWriter(dir, { wallTime: 1_700_000_000.25, flushEvery: 3 });
    assert.match(w.path, /events\.out\.tfevents\.1700000000\./);
    w.scalar('reward/mean', 1, 0.5, 1_700_000_001);
    w.scalar('reward/mean', 2, 0.75, 1_700_000_002);
    w.scalars(2, { 'actor/pg_loss': -0.125, 'actor/grad_norm': Number.NaN }, 1_700_000_003);
    w.scalar('kl/mean', 3, 1e-3, 1_700_000_004);
    w.close();
    assert.throws(() => w.scalar('x', 1, 1), /closed/);
    const { events, truncatedAt } = readEventFile(w.path);
    assert.equal(truncatedAt, undefined);
    assert.equal(events[0].fileVersion, FILE_VERSION);
    assert.equal(events[0].wallTime, 1_700_000_000.25);
    const scalars = readScalars(dir);
    assert.deepEqual(
      scalars.map((s) => [s.tag, s.step, s.wallTime]),
      [
        ['reward/mean', 1, 1_700_000_001],
        ['reward/mean', 2, 1_700_000_002],
        ['actor/pg_loss', 2, 1_700_000_003],
        ['actor/grad_norm', 2, 1_700_000_003],
        ['kl/mean', 3, 1_700_000_004],
      ],
    );
    // simple_value is float32.
    assert.deepEqual(scalars.map((s) => s.value).slice(0, 3), [0.5, 0.75, -0.125]);
    assert.ok(Number.isNaN(scalars[3].value));
    assert.equal(scalars[4].value, Math.fround(1e-3));

    // Appending to an existing file (a resumed run) adds no second file_version event.
    const again = new TensorBoardWriter(dir, { filename: w.path.split('/').pop()! });
    again.scalar('reward/mean', 4, 1, 1_700_000_005);
    again.close();
    const ev2 = readEventFile(w.path).events;
    assert.equal(ev2.filter((e) => e.fileVersion).length, 1);
    assert.equal(readScalars(w.path).length, 6);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('bad input gets a clear error; an atomic writer publishes only on close', () => {
  const dir = tmp();
  try {
    const w = new TensorBoardWriter(dir, { filename: 'events.out.tfevents.1.export', atomic: true, wallTime: 1 });
    assert.throws(() => w.scalar('', 1, 1), /tag must be a non-empty string/);
    assert.throws(() => w.scalar('a', 1.5, 1), /step must be an integer/);
    assert.throws(() => w.scalar('a', 1, '1' as unknown as number), /value must be a number/);
    w.scalar('a', 1, 1, 2);
    w.flush();
    assert.deepEqual(
      readdirSync(dir).filter((f) => f.includes('tfevents')),
      [],
      'nothing visible to TensorBoard before close',
    );
    w.close();
    assert.deepEqual(readdirSync(dir), ['events.out.tfevents.1.export']);
    const aborted = new TensorBoardWriter(dir, { filename: 'events.out.tfevents.2.export', atomic: true, wallTime: 1 });
    aborted.scalar('a', 1, 1, 2);
    aborted.abort();
    assert.deepEqual(readdirSync(dir), ['events.out.tfevents.1.export']);
    assert.throws(() => new TensorBoardWriter(dir, { filename: 'metrics.bin' }), /must contain "tfevents"/);
    // A torn tail is tolerated by the reader.
    const f = join(dir, 'events.out.tfevents.1.export');
    appendFileSync(f, Buffer.from([1, 2, 3]));
    assert.equal(readScalars(f).length, 1);
    writeFileSync(f, Buffer.concat([readFileSync(f).subarray(0, 20), Buffer.alloc(40, 7)]));
    assert.throws(() => readScalars(f), /CRC mismatch/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the TensorBoard Python package reads the file, when it is installed', (t) => {
  const probe = spawnSync('/usr/bin/python3', ['-c', 'import tensorboard'], { encoding: 'utf8' });
  if (probe.status !== 0) {
    t.skip('python3 with the tensorboard package is not installed');
    return;
  }
  const dir = tmp();
  try {
    const w = new TensorBoardWriter(dir, { wallTime: 1000 });
    for (let s = 0; s < 5; s++) w.scalar('reward/mean', s, s / 4, 1000 + s);
    w.close();
    const py = [
      'import sys',
      'from tensorboard.backend.event_processing.event_accumulator import EventAccumulator',
      'acc = EventAccumulator(sys.argv[1]); acc.Reload()',
      'print(",".join(f"{e.step}:{e.value}" for e in acc.Scalars("reward/mean")))',
    ].join('\n');
    const res = spawnSync('/usr/bin/python3', ['-c', py, dir], { encoding: 'utf8' });
    assert.equal(res.status, 0, res.stderr);
    assert.equal(res.stdout.trim(), '0:0.0,1:0.25,2:0.5,3:0.75,4:1.0');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
