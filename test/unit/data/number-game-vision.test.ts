import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { loadDataset } from '../../../lib/data/dataset.ts';
import { writeVisionGameDataset } from '../../../examples/number-game-vision-data.ts';
import {
  drawVisionGameSample,
  generateVisionGame,
  readNumberGameImage,
  VISION_GAME_CELL,
  VISION_GAME_HEIGHT,
  VISION_GAME_WIDTH,
} from '../../../lib/tasks/number-game-vision.ts';
import { numberGameVision, tasks } from '../../../lib/tasks/index.ts';
import { applyRewardFn, rewardFns } from '../../../lib/reward-fns/index.ts';
import { decodePixels, encodeRgbPng } from '../../../lib/data/images.ts';
import { loadConfig } from '../../../lib/config/index.ts';
import { loadRunData } from '../../../lib/pipeline/data.ts';
import { tokenizerFor } from '../../../lib/pipeline/policy.ts';
import { Rng } from '../../../lib/util/rng.ts';

test('vision game: the same seed gives the same pixels, another seed other ones', () => {
  const a = generateVisionGame(50, 3),
    b = generateVisionGame(50, 3),
    c = generateVisionGame(50, 4);
  assert.deepEqual(a, b);
  assert.notDeepEqual(
    a.map((s) => s.image.data),
    c.map((s) => s.image.data),
  );
  assert.deepEqual(numberGameVision.generate(20, 3), numberGameVision.generate(20, 3));
});

test("vision game: three distinct digits, the answer is the largest one's index, and the image shows exactly those digits", () => {
  const samples = generateVisionGame(400, 11);
  const answers = [0, 0, 0];
  const scales = new Set<number>();
  for (const s of samples) {
    assert.equal(new Set(s.numbers).size, 3);
    assert.equal(s.answer, s.numbers.indexOf(Math.max(...s.numbers)));
    answers[s.answer]++;
    assert.equal(s.image.width, VISION_GAME_WIDTH);
    assert.equal(s.image.height, VISION_GAME_HEIGHT);
    // digits stay inside their 28-px cell (one merge window = one image token), left to right
    s.placements.forEach((p, i) => {
      assert.ok(
        p.x >= i * VISION_GAME_CELL && p.x + 5 * p.scale <= (i + 1) * VISION_GAME_CELL,
        `digit ${i} at x=${p.x} scale ${p.scale}`,
      );
      assert.ok(p.y >= 1 && p.y + 7 * p.scale <= VISION_GAME_HEIGHT);
      scales.add(p.scale);
    });
    assert.deepEqual(readNumberGameImage(s.image), s.numbers);
  }
  assert.deepEqual([...scales].sort(), [2, 3]);
  assert.ok(
    answers.every((n) => n > 90),
    `answers roughly balanced: ${answers}`,
  );
});

test('vision game: positions, shades and noise vary between samples', () => {
  const rng = Rng.fromSeed(5);
  const a = drawVisionGameSample(rng),
    b = drawVisionGameSample(rng);
  assert.notDeepEqual(a.placements, b.placements);
  // noise: the paper is not one flat value
  const paper = new Set<number>();
  for (let x = 0; x < VISION_GAME_WIDTH; x++) paper.add(a.image.data[x * 3]);
  assert.ok(paper.size > 10);
});

test('the reader refuses what is not a game image (a blank image, a digit cut off)', () => {
  const blank = {
    width: VISION_GAME_WIDTH,
    height: VISION_GAME_HEIGHT,
    data: new Uint8Array(VISION_GAME_WIDTH * VISION_GAME_HEIGHT * 3).fill(255),
  };
  assert.equal(readNumberGameImage(blank), null);
  const s = generateVisionGame(1, 2)[0];
  const cut = { ...s.image, data: s.image.data.slice() };
  const p = s.placements[1];
  for (let x = p.x; x < p.x + 5 * p.scale; x++)
    for (let c = 0; c < 3; c++) cut.data[((p.y + 7 * p.scale - 1) * VISION_GAME_WIDTH + x) * 3 + c] = 255;
  assert.equal(readNumberGameImage(cut), null);
});

test('the PNG round trip keeps the pixels; the built-in task goes through data.* image handling with its extra_info', async () => {
  const s = generateVisionGame(1, 9)[0];
  const px = await decodePixels(await encodeRgbPng(s.image));
  assert.deepEqual(px.data, s.image.data);
  const cfg = loadConfig({
    env: {},
    onWarning: () => undefined,
    file: join(import.meta.dirname, '../../../examples/number-game-vision.yaml'),
    overrides: ['data.task_size.train=6', 'data.task_size.val=3'],
  });
  assert.equal(cfg.reward.reward_fn, 'number_game_vision');
  const data = await loadRunData(cfg, tokenizerFor(cfg));
  const gen = tasks.get('number_game_vision').generate(6, cfg.data.seed);
  assert.equal(data.train.length, 6);
  for (let i = 0; i < 6; i++) {
    const row = data.train[i];
    assert.equal(row.images.length, 1);
    assert.equal(row.images[0].width, 84);
    assert.equal(row.images[0].height, 28);
    const seen = readNumberGameImage(await decodePixels(row.images[0].png));
    assert.deepEqual(
      seen,
      JSON.parse(row.extraInfo!).numbers,
      'the stored image shows the recorded digits (min/max pixels keep its size)',
    );
    assert.equal(row.answer, gen[i].answer);
    assert.equal(Number(row.answer), seen!.indexOf(Math.max(...seen!)));
  }
});

test('number_game_vision reward: exact index plus format', async () => {
  const fn = rewardFns.get('number_game_vision');
  assert.deepEqual(await applyRewardFn(fn, { prompt: '', response: '2', ground_truth: '2', kwargs: {} }), {
    ok: true,
    reward: 1.1,
    metrics: { overall: 1.1, accuracy: 1, format: 1 },
  });
  assert.deepEqual(await applyRewardFn(fn, { prompt: '', response: '1', ground_truth: '2', kwargs: {} }), {
    ok: true,
    reward: 0.1,
    metrics: { overall: 0.1, accuracy: 0, format: 1 },
  });
});

test("the game as JSONL + PNG files loads through data.image_key as the built-in task's rows", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'vision-game-files-'));
  try {
    const { file } = await writeVisionGameDataset(dir, 12, 5);
    const { rows, bad } = await loadDataset([file], {
      prompt_key: 'prompt',
      answer_key: 'answer',
      image_key: 'images',
      image: { factor: 28, minPixels: 784, maxPixels: 12544, resample: 'bicubic' },
    });
    assert.deepEqual(bad, []);
    const task = numberGameVision.generate(12, 5);
    assert.equal(rows.length, 12);
    for (const [i, r] of rows.entries()) {
      assert.equal(r.prompt, task[i]!.prompt);
      assert.equal(r.answer, task[i]!.answer);
      assert.deepEqual(JSON.parse(r.extraInfo!), task[i]!.extraInfo);
      assert.deepEqual(
        readNumberGameImage(await decodePixels(r.images[0]!.png)),
        (task[i]!.extraInfo as { numbers: number[] }).numbers,
      );
      assert.deepEqual(
        (await decodePixels(r.images[0]!.png)).data,
        task[i]!.image!.data,
        'the same pixels as the built-in task',
      );
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
