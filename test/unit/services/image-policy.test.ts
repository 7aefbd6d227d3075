/**
 * An image policy through the stages' logic: the rollout samples n images per prompt (Flow-GRPO's
 * SDE, every step's log-probability recorded), the reward scores the generated PNGs, the advantage
 * stage group-normalises, and the update's batch rebuilt from the records reproduces the sampling
 * exactly (flow_grpo ratio 1: no clipping, the recorded log-probs) or gives DiffusionNFT's
 * optimality from the rewards.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generationRequests, trajectoryGroups } from '../../../services/rollout/logic.ts';
import { rewardItems, scoredGroup } from '../../../services/reward/logic.ts';
import { computeStep, generatedImageRows, trajectoryRows } from '../../../services/advantage/logic.ts';

import { groupId, hashId, type PromptBatch, type UpdateGroup } from '../../../lib/contracts/index.ts';
import { recordProblems } from '../../../lib/contracts/invariants.ts';
import { ditConfig, initDitWeights } from '../../../lib/image/dit.ts';
import { ImageTrainer } from '../../../lib/image/trainer.ts';
import { sampleRequests } from '../../../lib/image/trajectory.ts';
import { imageUpdate, imageUpdateBatch, nftOptimality } from '../../../lib/image/rl.ts';
import { pngToImage } from '../../../lib/image/png.ts';
import { Rng } from '../../../lib/util/rng.ts';
import { advantageSettings } from './advantage-fixtures.ts';

const CLASSES = ['A', 'B'];
const cfg = ditConfig({ numClasses: 2, imageSize: 4, patchSize: 2, hidden: 8, depth: 1, heads: 2, timeFreqs: 4 });
const N = 4;

function batch(): PromptBatch {
  return {
    run_id: 'r',
    id: `${groupId('r', 1, 0)}+2`,
    step: 1,
    policy_version: 0,
    kind: 'train',
    epoch: 0,
    attempt: 0,
    sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 1 },
    groups: CLASSES.map((c, p) => ({
      id: groupId('r', 1, p),
      group_uid: hashId(groupId('r', 1, p)),
      n: N,
      prompt_index: p,
      dataset_index: p,
      prompt_ids: Int32Array.from([65 + p]),
      prompt_text: c,
      images: [],
      image_refs: [],
      data_source: 'glyphs',
      ground_truth: c,
      extra_info: '{}',
    })),
  };
}

const classOf = (g: { prompt_text: string }) => CLASSES.indexOf(g.prompt_text);

async function step(): Promise<{ updates: UpdateGroup[]; tr: ImageTrainer; rewards: number[] }> {
  const tr = new ImageTrainer(
    cfg,
    initDitWeights(cfg, 4, { zeroInit: false }),
    { betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0, maxGradNorm: null, lr: 0 },
    { threads: 1 },
  );
  const { requests, groups } = generationRequests([batch()]);
  const gens = await sampleRequests(
    (x, t, c) => tr.velocity(x, t, c),
    requests.map((r) => ({ id: r.id, cls: classOf(groups[r.groupIndex].group) })),
    { channels: 1, size: 4, steps: 3, noiseLevel: 0.7, seed: 1 },
  );
  const trajs = trajectoryGroups(groups, requests, gens, () => assert.fail('an image sample has no text to decode'), 0);
  const rewards: number[] = [];
  const scored = [];
  for (const g of trajs) {
    assert.deepEqual(recordProblems('trajectories', g), []);
    // the reward sees each sample's generated PNG: here, its mean brightness
    const items = rewardItems(g);
    const outcomes = [];
    for (const it of items) {
      const { x } = await pngToImage(it.images![0], 1);
      const r = x.reduce((a, b) => a + b, 0) / x.length;
      rewards.push(r);
      outcomes.push({ id: it.id, ok: true as const, reward: r, details: {}, server: 'fn:brightness' });
    }
    scored.push(scoredGroup(g, outcomes, 'fn:brightness', 1));
  }
  const { updates } = computeStep(scored, [], null, advantageSettings({ rolloutBatchSize: 2 }), null);
  for (const u of updates) assert.deepEqual(recordProblems('updates', u), []);
  return { updates, tr, rewards };
}

test('flow_grpo through the stages: group-normalised advantages on every denoising step; the update on the records has ratio 1', async () => {
  const { updates, tr, rewards } = await step();
  assert.equal(updates.length, 2);
  for (const u of updates)
    for (const s of u.samples) {
      assert.equal(s.response_ids.length, 2, '3 steps, the last deterministic');
      assert.equal(new Set(s.advantages).size, 1, 'one advantage per image, on each step');
    }
  for (const u of updates) {
    const adv = u.samples.map((s) => s.advantages[0]);
    assert.ok(Math.abs(adv.reduce((a, b) => a + b, 0)) < 1e-5, 'centred within the group');
  }
  const b = imageUpdateBatch(updates, 'flow_grpo', classOf);
  assert.deepEqual(b.cls, [0, 0, 0, 0, 1, 1, 1, 1]);
  const m = await imageUpdate(tr, b, {
    loss: { name: 'flow_grpo', clipLow: 0.2, clipHigh: 0.2 },
    rng: Rng.fromSeed(2),
  });
  assert.equal(m.clipfrac, 0, 'the weights that sampled give ratio 1');
  const recorded = b.samples.flatMap((s) => [...s.logprobs]);
  const mean = recorded.reduce((a, c) => a + c, 0) / recorded.length;
  assert.ok(Math.abs(m.log_prob - mean) < 1e-4, `log_prob ${m.log_prob} vs recorded ${mean}`);
  assert.equal(rewards.length, 8);
  // the store: each generated PNG once by hash (prompt_images), named by its trajectory row
  const images = generatedImageRows('r', updates);
  assert.equal(images.length, 8);
  assert.ok(images.every((i) => i.width === 4 && i.height === 4 && i.runId === 'r'));
  const rows = updates.flatMap((u) => trajectoryRows('r', u, 1, new Map(), null));
  assert.deepEqual(
    rows.map((r) => r.generatedImageHash),
    updates.flatMap((u) => u.samples.map((s) => s.generated!.hash)),
  );
  assert.deepEqual(generatedImageRows('r', [...updates, ...updates]).length, 8, 'distinct by hash');
});

test('diffusion_nft through the stages: optimality from the rewards of each group, trained from the clean images', async () => {
  const { updates, tr, rewards } = await step();
  const b = imageUpdateBatch(updates, 'diffusion_nft', classOf);
  const expected = nftOptimality(rewards, N);
  b.weights.forEach((w, i) => assert.ok(Math.abs(w - expected[i]) < 1e-6));
  const paper = { clip: 5, std: 'global' } as const;
  const bp = imageUpdateBatch(updates, 'diffusion_nft', classOf, paper);
  const expectedPaper = nftOptimality(rewards, N, paper);
  bp.weights.forEach((w, i) => assert.ok(Math.abs(w - expectedPaper[i]) < 1e-6));
  const m = await imageUpdate(tr, b, { loss: { name: 'diffusion_nft', nftBeta: 1 }, rng: Rng.fromSeed(2) });
  assert.ok(Number.isFinite(m.loss) && Number.isFinite(m.pos_mse));
  const { samples: _s, ...rest } = updates[0];
  assert.throws(
    () =>
      imageUpdateBatch(
        [{ ...rest, samples: updates[0].samples.map((s) => ({ ...s, generated: null })) }],
        'diffusion_nft',
        classOf,
      ),
    /has no generated image/,
  );
});
