/**
 * `rlstream fetch` (lib/assets/fetch.ts): a model directory and a parquet file from s3rver, and the
 * same from a directory (a volume), each file checked against SHA256SUMS; a damaged object, an
 * unlisted file and a missing list are refused naming the file; a rerun keeps what is in place.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PutObjectCommand } from '@aws-sdk/client-s3';
import { fetchAssets } from '../../../lib/assets/fetch.ts';
import { IntegrityError } from '../../../lib/policy-store/index.ts';
import { startLocalS3, type LocalS3 } from '../../../devkit/s3-local.ts';
import { ROOT } from '../../../devkit/pipeline-procs.ts';

let s3: LocalS3;
const tmp = mkdtempSync(join(tmpdir(), 'rl-fetch-'));
before(async () => {
  s3 = await startLocalS3('rlstream-assets');
});
after(async () => {
  await s3.close();
  rmSync(tmp, { recursive: true, force: true });
});
const sha = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');
const FILES: Record<string, Buffer> = {
  'config.json': Buffer.from('{"model_type":"qwen3"}'),
  'model.safetensors': Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 7) & 0xff)),
  'sub/tokenizer.json': Buffer.from('{}'),
};
const sums = (files: Record<string, Buffer>) =>
  Object.entries(files)
    .map(([n, b]) => `${sha(b)}  ${n}\n`)
    .join('');
async function upload(prefix: string, files: Record<string, Buffer | string>) {
  for (const [n, b] of Object.entries(files))
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}${n}`, Body: b }));
}
const client = () => Promise.resolve(s3.client);

test('from s3: every file verified; a rerun keeps the files in place; the CLI does the same', async () => {
  await upload('models/m1/', { ...FILES, SHA256SUMS: sums(FILES) });
  const dest = join(tmp, 'm1');
  const r = await fetchAssets(`s3://${s3.bucket}/models/m1/`, dest, { client });
  assert.deepEqual(r.fetched, Object.keys(FILES).sort());
  for (const [n, b] of Object.entries(FILES)) assert.deepEqual(readFileSync(join(dest, n)), b);
  const again = await fetchAssets(`s3://${s3.bucket}/models/m1`, dest, { client });
  assert.deepEqual([again.fetched, again.kept.length], [[], 3]);
  // (asynchronously: s3rver answers from this process)
  const cli = await promisify(execFile)(
    process.execPath,
    [
      join(ROOT, 'bin/rlstream.mjs'),
      'fetch',
      `s3://${s3.bucket}/models/m1/`,
      join(tmp, 'cli'),
      '--endpoint',
      s3.endpoint,
      '--path-style',
    ],
    { encoding: 'utf8', env: { ...process.env, ...s3.env } },
  );
  assert.match(cli.stderr, /3 file\(s\) fetched .* all sha256-verified/);
  assert.deepEqual(readFileSync(join(tmp, 'cli', 'model.safetensors')), FILES['model.safetensors']);
});

test('from s3: a damaged object, an unlisted file, no list: refused, naming the file; nothing half-written', async () => {
  const damaged = Buffer.from(FILES['model.safetensors']);
  damaged[5] ^= 1;
  await upload('models/bad/', { ...FILES, 'model.safetensors': damaged, SHA256SUMS: sums(FILES) });
  const dest = join(tmp, 'bad');
  await assert.rejects(fetchAssets(`s3://${s3.bucket}/models/bad/`, dest, { client }), (e: unknown) => {
    assert.ok(e instanceof IntegrityError);
    assert.match(e.message, /models\/bad\/model\.safetensors has sha256 [0-9a-f]{64}, but SHA256SUMS lists/);
    return true;
  });
  assert.throws(() => readFileSync(join(dest, 'model.safetensors')), /ENOENT/);
  await upload('models/extra/', { ...FILES, 'stray.bin': 'x', SHA256SUMS: sums(FILES) });
  await assert.rejects(
    fetchAssets(`s3://${s3.bucket}/models/extra/`, join(tmp, 'x'), { client }),
    /not in SHA256SUMS: stray\.bin/,
  );
  await upload('models/nosums/', FILES);
  await assert.rejects(
    fetchAssets(`s3://${s3.bucket}/models/nosums/`, join(tmp, 'y'), { client }),
    /has no SHA256SUMS/,
  );
});

test('from a volume (a directory), with the list given apart', async () => {
  const src = join(tmp, 'pvc');
  for (const [n, b] of Object.entries(FILES)) {
    mkdirSync(join(src, n, '..'), { recursive: true });
    writeFileSync(join(src, n), b);
  }
  writeFileSync(join(tmp, 'list'), sums(FILES));
  const r = await fetchAssets(src, join(tmp, 'from-pvc'), { sumsFile: join(tmp, 'list') });
  assert.equal(r.fetched.length, 3);
  assert.deepEqual(readFileSync(join(tmp, 'from-pvc', 'sub/tokenizer.json')), FILES['sub/tokenizer.json']);
});
