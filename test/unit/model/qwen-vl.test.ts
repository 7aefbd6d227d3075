/**
 * Qwen2-VL / Qwen2.5-VL configs and directories: config.json round trip (vision_config, mrope
 * sections, the source's other keys), the one-line refusals (a missing preprocessor_config.json,
 * an unsupported vision or processor setting, a bad mrope_section), the Qwen2.5-VL parameter names,
 * and the M-RoPE offsets of a row with two images (HF get_rope_index, worked by hand).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fromHfConfig, toHfConfig } from '../../../lib/model/config.ts';
import { loadCheckpoint } from '../../../lib/model/checkpoint.ts';
import { visionParamSpecs } from '../../../lib/model/params.ts';
import { readImageProcessor } from '../../../lib/model/processor.ts';
import { mropeDeltas } from '../../../lib/model/vision.ts';
import { qwenVlHfConfig, writeQwenVlDir } from '../../../devkit/qwen-vl-dir.ts';

describe('Qwen-VL config.json', () => {
  for (const mt of ['qwen2_5_vl', 'qwen2_vl'] as const)
    it(`${mt}: reads and writes back the same modelled keys, other keys kept`, () => {
      const j = qwenVlHfConfig(mt);
      const c = fromHfConfig(j);
      assert.equal(c.modelType, mt);
      assert.deepEqual(c.mropeSection, [2, 3, 3]);
      assert.equal(c.attentionBias, true);
      const out = toHfConfig(c, 'bfloat16');
      for (const k of Object.keys(j)) assert.deepEqual(out[k], j[k], k);
      assert.deepEqual(fromHfConfig(out), c);
    });

  it('Qwen2.5-VL tower: RMSNorm weights only, gated MLP with biases; Qwen2-VL: LayerNorm, fc1/fc2', () => {
    const n25 = visionParamSpecs(fromHfConfig(qwenVlHfConfig('qwen2_5_vl'))).map((s) => s.name);
    for (const n of ['visual.blocks.0.norm1.weight', 'visual.blocks.1.mlp.gate_proj.bias', 'visual.merger.ln_q.weight'])
      assert.ok(n25.includes(n), n);
    assert.ok(!n25.includes('visual.blocks.0.norm1.bias') && !n25.includes('visual.merger.ln_q.bias'));
    const n2 = visionParamSpecs(fromHfConfig(qwenVlHfConfig('qwen2_vl'))).map((s) => s.name);
    for (const n of ['visual.blocks.0.norm1.bias', 'visual.blocks.1.mlp.fc2.weight', 'visual.merger.ln_q.bias'])
      assert.ok(n2.includes(n), n);
  });

  it('refuses what it does not compute, in one line naming the key', () => {
    const j = qwenVlHfConfig('qwen2_5_vl');
    const vc = j.vision_config as Record<string, unknown>;
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ vision_config: { ...vc, hidden_act: 'gelu' } }, /vision_config hidden_act="gelu" is not supported/],
      [{ vision_config: { ...vc, in_chans: 4 } }, /vision_config in_chans=4 is not supported/],
      [{ vision_config: { ...vc, fullatt_block_indexes: [5] } }, /fullattBlockIndexes 5 is not a block/],
      [{ vision_config: { ...vc, window_size: 12 } }, /windowSize 12 must be a positive multiple of/],
      [{ rope_scaling: { type: 'mrope', mrope_section: [2, 2, 2] } }, /mropeSection \[2,2,2\] must sum to/],
      [{ rope_scaling: { type: 'yarn', mrope_section: [2, 3, 3] } }, /rope_scaling type "yarn" for qwen2_5_vl/],
      [{ rope_scaling: null }, /needs rope_scaling.mrope_section/],
    ];
    for (const [patch, re] of cases)
      assert.throws(
        () => fromHfConfig({ ...j, ...patch }),
        (e: Error) => re.test(e.message) && !e.message.includes('\n'),
        JSON.stringify(patch),
      );
  });
});

describe('Qwen-VL directories', () => {
  it('a directory without preprocessor_config.json, or with an unsupported processor setting, says which file and key', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'qvl-unit-'));
    try {
      const { config } = writeQwenVlDir(dir);
      assert.deepEqual(readImageProcessor(dir, config), {
        minPixels: 256,
        maxPixels: 4096,
        factor: 8,
        resample: 'bicubic',
      });
      const pre = join(dir, 'preprocessor_config.json');
      const j = JSON.parse(readFileSync(pre, 'utf8'));
      writeFileSync(pre, JSON.stringify({ ...j, patch_size: 14 }));
      assert.throws(() => readImageProcessor(dir, config), /preprocessor_config.json: patch_size=14 is not supported/);
      writeFileSync(pre, JSON.stringify({ ...j, image_mean: [0.5, 0.5, 0.5] }));
      assert.throws(() => readImageProcessor(dir, config), /image_mean=\[0.5,0.5,0.5\] is not supported \(only CLIP/);
      rmSync(pre);
      await assert.rejects(
        loadCheckpoint(dir, { optimizer: false }),
        /preprocessor_config.json not found; a qwen2_5_vl directory needs its image processor config/,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('M-RoPE offsets (get_rope_index)', () => {
  it('text, a 2×3 image, text, a 1×2 image, text; left padding does not move them', () => {
    const I = 9;
    // ids: a b [I×6] c [I×2] d — 1-D positions 0..11
    const row = [1, 2, I, I, I, I, I, I, 3, I, I, 4];
    const d = mropeDeltas(
      I,
      row,
      1,
      row.length,
      [0],
      [
        [2, 3],
        [1, 2],
      ],
    );
    const pos = Array.from({ length: row.length }, (_, t) => [0, 1, 2].map((a) => t + Number(d[t * 3 + a])));
    // HF: text 0,1; image at s = 2: t = 2, h = 2 + i, w = 2 + j; next text at 2 + max(2, 3) = 5;
    // image at s = 6 (1×2): t = 6, h = 6, w = 6 + j; next text at 6 + 2 = 8
    assert.deepEqual(pos, [
      [0, 0, 0],
      [1, 1, 1],
      [2, 2, 2],
      [2, 2, 3],
      [2, 2, 4],
      [2, 3, 2],
      [2, 3, 3],
      [2, 3, 4],
      [5, 5, 5],
      [6, 6, 6],
      [6, 6, 7],
      [8, 8, 8],
    ]);
    const padded = mropeDeltas(
      I,
      [0, 0, ...row],
      1,
      row.length + 2,
      [0],
      [
        [2, 3],
        [1, 2],
      ],
    );
    assert.deepEqual(Array.from(padded.slice(6)), Array.from(d));
  });
});
