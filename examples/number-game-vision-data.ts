/**
 * Writes the vision number game (lib/tasks/number-game-vision.ts) as files, for use with
 * `data.train_files` / `data.val_files` and the `data.image_key` path instead of `data.task`:
 *
 *   node --import tsx examples/number-game-vision-data.ts <out dir> [count = 1000] [seed = 1]
 *
 * gives `<out dir>/data.jsonl` (one row per sample: `prompt`, `answer`, `images` — a path relative
 * to the file —, `data_source`, `extra_info: {numbers}`) and `<out dir>/images/<i>.png`. The same
 * seed gives the same files as the built-in task's rows (train uses data.seed, val data.seed +
 * 1000003). Train with e.g. `data.task=null data.train_files=[<dir>/data.jsonl] data.min_pixels=784
 * data.max_pixels=12544 reward.reward_fn=number_game_vision`.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { encodeRgbPng } from '../lib/data/images.ts';
import { generateVisionGame } from '../lib/tasks/number-game-vision.ts';
import { VISION_GAME_PROMPT } from '../lib/tasks/index.ts';

export async function writeVisionGameDataset(
  dir: string,
  count: number,
  seed: number,
): Promise<{ file: string; rows: number }> {
  mkdirSync(join(dir, 'images'), { recursive: true });
  const lines: string[] = [];
  const samples = generateVisionGame(count, seed);
  const width = String(Math.max(0, count - 1)).length;
  for (const [i, s] of samples.entries()) {
    const name = `images/${String(i).padStart(width, '0')}.png`;
    writeFileSync(join(dir, name), await encodeRgbPng(s.image));
    lines.push(
      JSON.stringify({
        prompt: VISION_GAME_PROMPT,
        answer: String(s.answer),
        images: name,
        data_source: 'number_game_vision',
        extra_info: { numbers: s.numbers },
      }),
    );
  }
  const file = join(dir, 'data.jsonl');
  writeFileSync(file, `${lines.join('\n')}\n`);
  return { file, rows: count };
}

if (process.argv[1] && pathToFileURL(resolve(process.argv[1])).href === import.meta.url) {
  const [dir, count = '1000', seed = '1'] = process.argv.slice(2);
  if (!dir || !/^\d+$/.test(count) || !/^-?\d+$/.test(seed)) {
    console.error('usage: node --import tsx examples/number-game-vision-data.ts <out dir> [count] [seed]');
    process.exit(2);
  }
  const out = await writeVisionGameDataset(dir, Number(count), Number(seed));
  console.log(`wrote ${out.rows} rows to ${out.file}`);
}
