/**
 * Prepares the transformers cross-check (README.md beside this file): tiny Qwen2.5-VL and Qwen2-VL
 * directories, two images, rlstream's pixels (patchified, one frame) and greedy generations.
 *
 *   node --import tsx scripts/transformers-vl-check/prep.ts OUT_DIR
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import sharp from 'sharp';
import { prepareImage, decodePixels } from '../../lib/data/images.ts';
import { patchify } from '../../lib/model/vision.ts';
import { fromHfConfig } from '../../lib/model/config.ts';
import { writeQwenVlDir } from '../../devkit/qwen-vl-dir.ts';

const root = process.argv[2];
if (!root) {
  process.stderr.write('usage: prep.ts OUT_DIR\n');
  process.exit(2);
}
mkdirSync(root, { recursive: true });
const cli = join(import.meta.dirname, '../../bin/rlstream.mjs');
const run = (...a: string[]) => execFileSync(process.execPath, [cli, ...a], { encoding: 'utf8' });
writeQwenVlDir(join(root, 'qvl25-src'), { shape: 'tiny', modelType: 'qwen2_5_vl', seed: 1 });
run('export', join(root, 'qvl25-src'), '--out', join(root, 'qvl25'), '--dtype', 'bf16');
rmSync(join(root, 'qvl25-src'), { recursive: true });
writeQwenVlDir(join(root, 'qvl2'), { shape: 'tiny', modelType: 'qwen2_vl', seed: 2 });
// two images: one already on the 8-px grid within [256, 4096] pixels, one that smart_resize resizes
const mk = async (w: number, h: number, name: string) => {
  const data = Buffer.alloc(w * h * 3);
  for (let y = 0; y < h; y++)
    for (let x = 0; x < w; x++) {
      const i = (y * w + x) * 3;
      data[i] = (x * 37 + y * 11) % 256;
      data[i + 1] = (x * 5 + y * 29 + ((x * y) % 17) * 7) % 256;
      data[i + 2] = ((x ^ y) * 13) % 256;
    }
  await sharp(data, { raw: { width: w, height: h, channels: 3 } })
    .png()
    .toFile(join(root, name));
};
await mk(64, 48, 'fit.png');
await mk(70, 50, 'resize.png');
const GEN = ['--prompt', 'Describe the picture.', '--max-new-tokens', '12', '--temperature', '0', '--json'];
const out: Record<string, unknown> = {};
for (const d of ['qvl25', 'qvl2']) {
  const dir = join(root, d);
  const c = fromHfConfig(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')));
  for (const im of ['fit.png', 'resize.png']) {
    const img = await prepareImage(readFileSync(join(root, im)), {
      factor: 8,
      minPixels: 256,
      maxPixels: 4096,
      resample: 'bicubic',
    });
    const px = await decodePixels(img.png);
    const p = patchify(c.vision!, px as never);
    writeFileSync(
      join(root, `${d}_${im}.f32`),
      Buffer.from(p.patches.buffer, p.patches.byteOffset, p.patches.byteLength),
    );
    const g = run('generate', dir, '--chat', '--image', join(root, im), ...GEN);
    out[`${d}/${im}`] = {
      ...JSON.parse(g.trim().split('\n').pop()!),
      width: px.width,
      height: px.height,
      patches: p.count,
    };
  }
}
for (const d of ['qvl25', 'qvl2'])
  writeFileSync(join(root, `text_${d}.json`), run('generate', join(root, d), '--chat', ...GEN));
writeFileSync(join(root, 'ours.json'), JSON.stringify(out));
console.log(
  Object.entries(out)
    .map(([k, v]) => `${k}: ${JSON.stringify({ ...(v as object), logprobs: undefined })}`)
    .join('\n'),
);
