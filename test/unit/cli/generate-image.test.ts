/**
 * `rlstream generate --image PATH` with a vision-language checkpoint: the image is resized to the
 * patch grid and placed as <|vision_start|><|image_pad|>×n<|vision_end|> where <image> is in the
 * prompt (else first); the answer depends on the image; a text-only model refuses --image.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { generateCommand } from '../../../app/cli/commands/generate.ts';
import { saveCheckpoint } from '../../../lib/model/checkpoint.ts';
import { modelConfig } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { ByteTokenizer } from '../../../lib/model/tokenizer.ts';

const dir = mkdtempSync(join(tmpdir(), 'rlstream-gen-image-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const tok = new ByteTokenizer();
const V = tok.vocabSize; // vision tokens V, V + 1, V + 2 after the byte ids (a fresh pipeline VLM)

async function run(args: string[]): Promise<{ prompt_ids: number[]; response_ids: number[]; logprobs: number[] }> {
  const chunks: string[] = [];
  const write = process.stdout.write.bind(process.stdout);
  process.stdout.write = ((s: string) => {
    chunks.push(String(s));
    return true;
  }) as typeof process.stdout.write;
  try {
    assert.equal(await generateCommand.run(args), 0);
  } finally {
    process.stdout.write = write;
  }
  return JSON.parse(chunks.join('').trim().split('\n').at(-1)!);
}

async function png(path: string, w: number, h: number, seed: number): Promise<string> {
  const data = Buffer.from(Array.from({ length: w * h * 3 }, (_, i) => (i * 31 + seed * 97 + ((i * seed) % 7)) % 256));
  await sharp(data, { raw: { width: w, height: h, channels: 3 } })
    .png()
    .toFile(path);
  return path;
}

test('generate --image places the image tokens and its answer depends on the image', async () => {
  const c = modelConfig({
    hiddenSize: 32,
    intermediateSize: 48,
    numHiddenLayers: 1,
    numAttentionHeads: 4,
    numKeyValueHeads: 2,
    vocabSize: V + 3,
    maxPositionEmbeddings: 128,
    bosTokenId: tok.bos,
    eosTokenId: tok.eos,
    padTokenId: tok.pad,
    vision: {
      depth: 1,
      hiddenSize: 16,
      intermediateSize: 32,
      numHeads: 2,
      outHiddenSize: 32,
      patchSize: 4,
      imageTokenId: V,
      visionStartTokenId: V + 1,
      visionEndTokenId: V + 2,
    },
  });
  const vlmDir = join(dir, 'vlm');
  await saveCheckpoint(vlmDir, c, initWeights(c, 5, { std: 0.3 }), { dtype: 'float32' });
  const a = await png(join(dir, 'a.png'), 40, 20, 1),
    b = await png(join(dir, 'b.png'), 40, 20, 2);
  const common = ['--max-new-tokens', '5', '--temperature', '0', '--json', '--max-pixels', '512'];
  const ra = await run([vlmDir, '--prompt', 'Which? <image> Say.', '--image', a, ...common]);
  // 40×20 → smart_resize to the 8-pixel grid within 512 pixels: 32×16 → 8×4 patches → 8 merged tokens
  const open = ra.prompt_ids.indexOf(V + 1);
  assert.deepEqual(ra.prompt_ids.slice(open, open + 10), [V + 1, ...new Array(8).fill(V), V + 2]);
  assert.deepEqual(ra.prompt_ids.slice(0, open), [tok.bos, ...tok.encode('Which? ')]);
  assert.deepEqual(ra.prompt_ids.slice(open + 10), Array.from(tok.encode(' Say.')));
  const rb = await run([vlmDir, '--prompt', 'Which? <image> Say.', '--image', b, ...common]);
  assert.notDeepEqual(ra.logprobs, rb.logprobs, 'another image, another distribution');
  const first = await run([vlmDir, '--prompt', 'Say.', '--image', a, ...common]);
  assert.deepEqual(first.prompt_ids.slice(0, 2), [tok.bos, V + 1], 'without <image> the image comes first');
  assert.ok(
    ra.response_ids.every((t) => t < V),
    'no vision token is generated',
  );

  const textDir = join(dir, 'text');
  const t = modelConfig({ ...c, vision: undefined, vocabSize: V });
  await saveCheckpoint(textDir, t, initWeights(t, 5), { dtype: 'float32' });
  await assert.rejects(run([textDir, '--prompt', 'x', '--image', a]), /text-only model .* drop --image/);
});
