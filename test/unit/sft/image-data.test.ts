/** `rlstream sft`'s (prompt, image) rows for an image policy and its flow-matching batches. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { loadConfig } from '../../../lib/config/index.ts';
import { loadImageSftData, parseImageSftRow } from '../../../lib/sft/image-data.ts';
import { imageSftBatch } from '../../../lib/sft/logic.ts';

const dir = mkdtempSync(join(tmpdir(), 'rl-image-sft-'));
const cfgFor = (f: string, ...more: string[]) =>
  loadConfig({ overrides: [`data.train_files=${f}`, 'actor.model.kind=image', ...more], command: 'sft', env: {} });

test('rows: a prompt (text or one user message) and one image (path, list of one); others are bad rows naming file:line', async () => {
  const keys = { prompt: 'prompt', image: 'images' };
  assert.deepEqual(parseImageSftRow({ prompt: ' A ', images: ['a.png'] }, keys), { prompt: 'A', image: 'a.png' });
  assert.deepEqual(parseImageSftRow({ prompt: [{ role: 'user', content: 'B' }], images: 'b.png' }, keys), {
    prompt: 'B',
    image: 'b.png',
  });
  assert.match((parseImageSftRow({ prompt: 'A' }, keys) as { reason: string }).reason, /no image: "images"/);
  assert.match(
    (parseImageSftRow({ prompt: 'A', images: ['a.png', 'b.png'] }, keys) as { reason: string }).reason,
    /holds 2 images/,
  );
  assert.match((parseImageSftRow({ images: 'a.png' }, keys) as { reason: string }).reason, /no prompt/);

  // a 4×2 white-on-black RGB image: read at 1×2×2 grey (short side to 2, centre crop)
  const png = await sharp({ create: { width: 4, height: 2, channels: 3, background: { r: 255, g: 255, b: 255 } } })
    .png()
    .toBuffer();
  writeFileSync(join(dir, 'w.png'), png);
  const f = join(dir, 'rows.jsonl');
  writeFileSync(
    f,
    [
      { prompt: 'zeta', images: ['w.png'] },
      { prompt: 'alpha', images: png.toString('base64') },
      { prompt: 'beta', images: ['missing.png'] },
    ]
      .map((r) => JSON.stringify(r))
      .join('\n'),
  );
  const shape = { channels: 1 as const, imageSize: 2 };
  await assert.rejects(loadImageSftData(cfgFor(f), shape, null), /rows\.jsonl:3: image in "images" file not found/);
  const d = await loadImageSftData(cfgFor(f, 'data.on_bad_row=skip'), shape, null);
  assert.deepEqual(d.classNames, ['alpha', 'zeta']);
  assert.deepEqual(d.cls, [1, 0]);
  assert.deepEqual([...d.images], Array(8).fill(1));
  assert.equal(d.skipped.length, 1);
  // a model's vocabulary: a prompt outside it is a bad row
  const v = await loadImageSftData(cfgFor(f, 'data.on_bad_row=skip'), shape, ['alpha']);
  assert.deepEqual(v.cls, [0]);
  assert.match(v.skipped[0].reason, /not one of the model's prompts/);
});

test('a flow-matching batch is a pure function of (seed, step); cfg_dropout replaces classes by the null class at its rate', () => {
  const n = 400,
    px = 4;
  const images = Float32Array.from({ length: n * px }, (_, i) => i);
  const cls = Array.from({ length: n }, (_, i) => i % 3);
  const args = {
    images,
    cls,
    pixels: px,
    indices: cls.map((_, i) => i),
    seed: 5,
    step: 2,
    cfgDropout: 0.25,
    nullClass: 3,
  };
  const a = imageSftBatch(args);
  assert.deepEqual(imageSftBatch(args), a);
  assert.notDeepEqual(imageSftBatch({ ...args, step: 3 }).floats.noise, a.floats.noise);
  assert.deepEqual(a.floats.x0, images);
  assert.ok(a.floats.t.every((t) => t >= 0 && t < 1));
  const dropped = a.cls.filter((c) => c === 3).length;
  assert.ok(dropped > 0.18 * n && dropped < 0.32 * n, `${dropped} of ${n} dropped at 0.25`);
  a.cls.forEach((c, i) => assert.ok(c === 3 || c === cls[i]));
  // the dropout draws leave the noise and times alone, and 0 drops none
  const none = imageSftBatch({ ...args, cfgDropout: 0 });
  assert.deepEqual(none.cls, cls);
  assert.deepEqual(none.floats, a.floats);
});

test('config: a fresh image policy is checked against actor.model.image; LoRA needs a base and DiT module names', () => {
  assert.throws(
    () => cfgFor('x.jsonl', 'actor.model.image.image_size=30', 'actor.model.image.patch_size=4'),
    /actor\.model\.image\.image_size = 30 is not a multiple of patch_size = 4/,
  );
  assert.throws(
    () => cfgFor('x.jsonl', 'actor.model.image.num_heads=3'),
    /num_heads = 3 does not divide hidden_size = 64/,
  );
  assert.throws(() => cfgFor('x.jsonl', 'actor.model.lora.rank=4'), /actor\.model\.lora needs actor\.model\.path/);
  assert.throws(
    () => cfgFor('x.jsonl', 'actor.model.lora.target_modules=[q_proj]'),
    /"q_proj" is no linear layer of an image policy's DiT blocks; valid: ada, qkv, proj, fc1, fc2 \(or all-linear\)/,
  );
});
