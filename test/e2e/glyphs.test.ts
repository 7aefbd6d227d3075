/**
 * The glyphs example at a tiny size: renders, the recogniser, a few flow-matching SFT steps, then
 * one DiffusionNFT and one Flow-GRPO iteration from the saved SFT weights; every phase writes its
 * curve line and sample grid, rewards are probabilities, and the run's outputs reload.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { runGlyphs } from '../../examples/glyphs/run.ts';
import { tempDir } from '../../devkit/torch-ref.ts';
import { createSession } from '../../lib/onnx/runtime.ts';

test('glyphs example: recogniser, SFT, DiffusionNFT and Flow-GRPO at a tiny size', async () => {
  const tmp = tempDir('rlstream-glyphs-');
  try {
    const base = { chars: 3, size: 16, recogniserSteps: 30, perChar: 5, evalEvery: 10, minutes: 5, threads: 1 };
    const sft = await runGlyphs({
      ...base,
      out: join(tmp.dir, 'sft'),
      algo: 'diffusion_nft',
      sftSteps: 10,
      rlIters: 1,
    });
    assert.ok(sft.recogniserHeldout >= 0 && sft.recogniserHeldout <= 1);
    const curve = readFileSync(join(tmp.dir, 'sft', 'curve.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    assert.deepEqual(
      curve.map((l) => l.phase),
      ['recogniser', 'sft', 'diffusion_nft'],
    );
    for (const l of curve.slice(1)) {
      assert.ok(l.ocr_confidence > 0 && l.ocr_confidence < 1, JSON.stringify(l));
      assert.ok(typeof l.wall_min === 'number' && typeof l.load1 === 'number');
    }
    assert.ok(curve[2].reward_mean > 0 && curve[2].reward_mean < 1);
    const pngs = readdirSync(join(tmp.dir, 'sft')).filter((f) => f.endsWith('.png'));
    assert.deepEqual(pngs.sort(), ['diffusion_nft-00001.png', 'sft-00010.png']);
    await createSession(readFileSync(join(tmp.dir, 'sft', 'recogniser.onnx')), { threads: 1 });
    const grpo = await runGlyphs({
      ...base,
      out: join(tmp.dir, 'grpo'),
      algo: 'flow_grpo',
      sftSteps: 0,
      rlIters: 1,
      fromSft: join(tmp.dir, 'sft', 'sft.safetensors'),
    });
    // the same SFT weights and evaluation seed: the same accuracy before RL
    assert.equal(grpo.sftAccuracy, sft.sftAccuracy);
    assert.ok(existsSync(join(tmp.dir, 'grpo', 'flow_grpo-00001.png')));
  } finally {
    tmp.cleanup();
  }
});
