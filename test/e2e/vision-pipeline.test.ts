/**
 * Images reach a vision-language policy through the pipeline: a tiny fresh VLM
 * (actor.model.vision) trains 2 GRPO steps on a JSONL dataset with one picture per row. The
 * stored prompt ids hold each image's expanded <|image_pad|> block (before the text: the prompts
 * have no <image> marker); the behaviour log-probs equal a Scorer re-computation with the prompt's
 * image and differ with another image; the reference log-probs of step 1 (the advantage stage,
 * version 0 = the behaviour policy) equal the behaviour log-probs; the update stage trains on the
 * rows (a row whose pads have no image is refused by the trainer); a replay of the run with its
 * own config reproduces its checkpoint, and the run resumes for a third step. Validation prompts
 * with an <image> marker get the block there.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { createLogger, silentLogger } from '../../lib/log.ts';
import { replayRun } from '../../app/replay.ts';
import { openStore } from '../../lib/store/index.ts';
import { loadCheckpoint, checkpointSha256 } from '../../lib/model/index.ts';
import { Scorer } from '../../lib/model/score.ts';
import { decodePixels } from '../../lib/data/images.ts';
import { policyModelConfig, tokenizerFor } from '../../lib/pipeline/policy.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `vision-pipeline-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

/** A 16×16 PNG: a background colour with a square of another at (x, y). */
const pic = (bg: number, x: number, y: number) =>
  sharp({ create: { width: 16, height: 16, channels: 3, background: { r: bg, g: 255 - bg, b: 60 } } })
    .composite([
      {
        input: { create: { width: 6, height: 6, channels: 3, background: { r: 255 - bg, g: 20, b: 220 } } },
        left: x,
        top: y,
      },
    ])
    .png()
    .toBuffer();

test(
  "a tiny VLM trains on prompts with images: behaviour log-probs are the image's, and the replay reproduces the run",
  { timeout: 300_000 },
  async () => {
    const data = join(tmp, 'data');
    mkdirSync(join(data, 'img'), { recursive: true });
    const pics = await Promise.all(
      [
        [10, 1, 2],
        [90, 8, 3],
        [170, 4, 9],
        [240, 9, 9],
      ].map(([bg, x, y]) => pic(bg!, x!, y!)),
    );
    pics.forEach((b, i) => writeFileSync(join(data, 'img', `p${i}.png`), b));
    const nums = [
      [3, 7, 1],
      [9, 2, 5],
      [0, 4, 8],
      [6, 1, 2],
      [5, 8, 3],
      [2, 0, 9],
      [7, 3, 4],
      [1, 6, 0],
    ];
    const row = (n: number[], i: number, prompt: string) =>
      JSON.stringify({ prompt, answer: String(n.indexOf(Math.max(...n))), images: [`img/p${i % 4}.png`] });
    writeFileSync(join(data, 'train.jsonl'), nums.map((n, i) => row(n, i, `${n.join(' ')}:`)).join('\n'));
    // validation prompts put the image at their <image> marker
    writeFileSync(
      join(data, 'val.jsonl'),
      nums
        .slice(0, 2)
        .map((n, i) => row(n, i, `${n.join(' ')}<image>:`))
        .join('\n'),
    );

    const runId = 'vision-pipeline-e2e';
    const runDir = join(tmp, 'run');
    const overrides = [
      `trainer.run_dir=${runDir}`,
      `pipeline.run_id=${runId}`,
      'data.task=null',
      'trainer.total_epochs=2',
      `data.train_files=${join(data, 'train.jsonl')}`,
      `data.val_files=${join(data, 'val.jsonl')}`,
      'trainer.val_before_train=true',
      'actor.model.alphabet="0123456789 :"',
      'data.min_pixels=64',
      'data.max_pixels=256',
      'data.image_factor=8',
      'data.max_prompt_length=24',
      'rollout.temperature=0.7',
      'actor.model.vision.enable=true',
      'actor.model.vision.patch_size=4',
      'actor.model.vision.hidden_size=16',
      'actor.model.vision.num_heads=2',
      'actor.model.vision.depth=1',
      // every version a file: versions 1 and 2 are compared below
      'policy.version_files=every_step',
    ];
    const cfg = loadConfig({
      file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
      overrides: [...overrides, 'trainer.max_steps=2'],
    });
    const lines: string[] = [];
    const out = await trainEmbedded(cfg, createLogger({ runId, pretty: false, sink: { write: (l) => lines.push(l) } }));
    assert.equal(out.status, 'completed', out.message);
    assert.ok(
      !lines.some((l) => l.includes('the policy is text-only')),
      'a vision policy sees the images: no text-only note',
    );

    const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
    const [rows, val, stored] = await Promise.all([
      store.getTrajectories(runId, { kind: 'train' }),
      store.getTrajectories(runId, { kind: 'val' }),
      store.getPromptImages(runId),
    ]).finally(() => store.close());
    const images = new Map(stored.map((i) => [i.hash, i]));
    assert.equal(rows.length, 2 * 4 * 4, '2 steps × 4 prompts × n = 4');
    const v0 = await loadCheckpoint(join(runDir, 'policy/v000000'), { optimizer: false });
    // the policy as the stages build it (its sampling mask included)
    const model = policyModelConfig(cfg, tokenizerFor(cfg));
    const vis = model.vision!;
    assert.deepEqual(v0.config.vision, vis);
    const scorer = new Scorer(model, { threads: 1 });
    const step1 = rows.filter((r) => r.step === 1);
    assert.equal(step1.length, 16);
    let worstSame = 0,
      worstRef = 0,
      minOther = Infinity;
    for (const r of step1) {
      assert.equal(r.policyVersion, 0);
      const img = images.get(r.imageHashes[0]!)!;
      assert.deepEqual([img.width, img.height], [16, 16]);
      // BOS, <|vision_start|>, 16/4 · 16/4 / 2² = 4 pads, <|vision_end|>, then the text
      const p = Array.from(r.promptTokens);
      assert.deepEqual(
        p.slice(0, 7),
        [
          p[0],
          vis.visionStartTokenId,
          vis.imageTokenId,
          vis.imageTokenId,
          vis.imageTokenId,
          vis.imageTokenId,
          vis.visionEndTokenId,
        ],
        `${r.id}: the image block before the text`,
      );
      assert.equal(p.filter((t) => t === vis.imageTokenId).length, 4);
      const px = await decodePixels(img.png);
      // another of the run's pictures (same size)
      const other = await decodePixels([...images.values()].find((i) => i.hash !== img.hash)!.png);
      const [same, diff] = await scorer.score(
        v0.weights,
        [
          { prompt: r.promptTokens, response: r.responseTokens, images: [px] },
          { prompt: r.promptTokens, response: r.responseTokens, images: [other] },
        ],
        { temperature: 0.7, entropy: false },
      );
      let d = 0;
      r.behaviourLogprobs.forEach((b, t) => {
        worstSame = Math.max(worstSame, Math.abs(b - same!.logprobs[t]!));
        worstRef = Math.max(worstRef, Math.abs(b - r.refLogprobs![t]!));
        d = Math.max(d, Math.abs(b - diff!.logprobs[t]!));
      });
      minOther = Math.min(minOther, d);
    }
    assert.ok(worstSame < 1e-4, `behaviour log-probs and a re-computation with the image differ by up to ${worstSame}`);
    assert.ok(
      worstRef < 1e-4,
      `step 1: reference (advantage stage, with images) and behaviour log-probs differ by up to ${worstRef}`,
    );
    assert.ok(minOther > 1e-4, `another image changes every response's log-probs (smallest change ${minOther})`);
    // validation (rollout of the controller's val rounds): the block at the marker, after the numbers
    assert.ok(val.length > 0);
    for (const r of val) {
      const p = Array.from(r.promptTokens),
        at = p.indexOf(vis.visionStartTokenId);
      assert.deepEqual(
        [at, p.filter((t) => t === vis.imageTokenId).length, p[at + 5]],
        [6, 4, vis.visionEndTokenId],
        `${r.id}: the image block at <image>`,
      );
    }
    const sha2 = await checkpointSha256(join(runDir, 'policy/v000002'));
    assert.notEqual(sha2, await checkpointSha256(join(runDir, 'policy/v000001')), 'step 2 trained');

    // a replay with the run's own config re-scores and re-trains with the images: the same checkpoint
    const rep = await replayRun({
      from: runDir,
      overrides: ['pipeline.run_id=vision-replay'],
      log: silentLogger('vision-replay'),
    });
    assert.equal(rep.status, 'completed', rep.message);
    assert.equal(rep.finalSha256, sha2, "the replay reproduces the run's step-2 policy");

    // the run resumes for a third step (its state, its images: the trainer refuses pads without their image)
    const more = loadConfig({
      file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
      overrides: [...overrides, 'trainer.max_steps=3'],
    });
    const again = await trainEmbedded(more, silentLogger(runId));
    assert.equal(again.status, 'completed', again.message);
    assert.equal(again.finalVersion, 3);
  },
);

test('GAE with a vision-language critic: values and critic updates take the images', { timeout: 300_000 }, async () => {
  const data = join(tmp, 'gae-data');
  mkdirSync(data, { recursive: true });
  const pics = await Promise.all(
    [
      [30, 2, 2],
      [200, 9, 5],
    ].map(([bg, x, y]) => pic(bg!, x!, y!)),
  );
  const nums = [
    [3, 7, 1],
    [9, 2, 5],
    [0, 4, 8],
    [6, 1, 2],
  ];
  writeFileSync(
    join(data, 'train.jsonl'),
    nums
      .map((n, i) =>
        JSON.stringify({
          prompt: `${n.join(' ')}:`,
          answer: String(n.indexOf(Math.max(...n))),
          images: [`data:image/png;base64,${pics[i % 2]!.toString('base64')}`],
        }),
      )
      .join('\n'),
  );
  const runId = 'vision-gae-e2e';
  const runDir = join(tmp, 'gae-run');
  const cfg = loadConfig({
    file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
    overrides: [
      `trainer.run_dir=${runDir}`,
      `pipeline.run_id=${runId}`,
      'trainer.max_steps=1',
      'data.task=null',
      `data.train_files=${join(data, 'train.jsonl')}`,
      'actor.model.alphabet="0123456789 :"',
      'data.min_pixels=64',
      'data.max_pixels=256',
      'data.image_factor=8',
      'data.max_prompt_length=24',
      'algorithm.adv_estimator=gae',
      'algorithm.use_kl_loss=false',
      'actor.model.vision.enable=true',
      'actor.model.vision.patch_size=4',
      'actor.model.vision.hidden_size=16',
      'actor.model.vision.num_heads=2',
      'actor.model.vision.depth=1',
    ],
  });
  const out = await trainEmbedded(cfg, silentLogger(runId));
  assert.equal(out.status, 'completed', out.message);
  // the critic's v1 differs from its v0 in the vision tower too: its gradient came through the images
  const c0 = await loadCheckpoint(join(runDir, 'critic/v000000'), { optimizer: false });
  const c1 = await loadCheckpoint(join(runDir, 'critic/v000001'), { optimizer: false });
  const name = [...c0.weights.keys()].find((k) => k.startsWith('visual.') && k.includes('patch_embed'));
  assert.ok(name, 'the critic has a vision tower');
  assert.notDeepEqual(Array.from(c1.weights.get(name)!), Array.from(c0.weights.get(name)!), `${name} was trained`);
});
