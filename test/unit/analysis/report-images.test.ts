/**
 * The report of a run with prompt images shows the last validation round's first images, inline,
 * with the policy's answers (the vision number game: "a few validation images with the model's
 * answers"); the report of a multi-turn run shows a few episodes of its last round as
 * conversations (role, text, tool name and arguments, per-turn reward).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { createStore } from '../../../lib/store/index.ts';
import {
  GENERATED_PER_STEP,
  loadReportData,
  renderReport,
  REPORT_EPISODES,
  spreadSteps,
  VAL_IMAGES,
} from '../../../lib/analysis/report.ts';
import { imageToPng } from '../../../lib/image/png.ts';
import { imageHash } from '../../../lib/data/image-hash.ts';
import type { Episode, EpisodeTurn } from '../../../lib/contracts/index.ts';
import { encodeRgbPng, prepareImage } from '../../../lib/data/images.ts';
import { generateVisionGame } from '../../../lib/tasks/number-game-vision.ts';
import { trajectory } from '../../support/store-fixtures.ts';

let dir: string;
let db: Database;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-report-images-'));
  db = await openDatabase({ kind: 'pglite', dir });
});
after(async () => {
  await db?.close();
  rmSync(dir, { recursive: true, force: true });
});

test('validation images of the last round with answers, inline; a run without images has no such section', async () => {
  const store = createStore(db);
  const runId = 'vision-report';
  await store.upsertRun({ runId, project: 'p', experiment: 'e', config: {} as never });
  const imgs = await Promise.all(
    generateVisionGame(10, 3).map(async (s) =>
      prepareImage(await encodeRgbPng(s.image), { factor: 28, minPixels: 3136, maxPixels: 12544, resample: 'bicubic' }),
    ),
  );
  await store.insertPromptImages(
    imgs.map((im) => ({ runId, hash: im.hash, width: im.width, height: im.height, png: im.png })),
  );
  const val = (step: number, p: number) =>
    trajectory(runId, 1000 * step + p, {
      id: `${runId}/val/r${step}/p${p}/n0`,
      kind: 'val',
      step,
      promptIndex: p,
      sampleIndex: 0,
      responseText: `<${p % 3}>`,
      groundTruth: String((p + 1) % 3),
      reward: p % 2,
      rewardFailure: null,
      filtered: false,
      filterReason: null,
      imageHashes: [imgs[p]!.hash],
    });
  await store.insertTrajectories([
    ...Array.from({ length: 10 }, (_, p) => val(5, p)),
    ...Array.from({ length: 10 }, (_, p) => val(10, p)),
    trajectory(runId, 7),
  ]);
  const data = await loadReportData(db, runId);
  assert.equal(data.valImages.length, VAL_IMAGES);
  assert.ok(
    data.valImages.every((v) => v.step === 10),
    'the last validation round',
  );
  assert.deepEqual(
    data.valImages.map((v) => v.promptIndex),
    [0, 1, 2, 3, 4, 5, 6, 7],
  );
  data.valImages.forEach((v, p) =>
    assert.ok(Buffer.from(v.pngBase64, 'base64').equals(imgs[p]!.png), `prompt ${p}: the stored PNG, byte for byte`),
  );
  const html = renderReport(data);
  assert.match(html, /<h2>Validation images \(round 10\)<\/h2>/);
  assert.equal((html.match(/<img src="data:image\/png;base64,/g) ?? []).length, VAL_IMAGES);
  assert.match(html, /width="336" height="168"/, 'shown at 3×');
  assert.match(
    html,
    /prompt 1: answered <span class="mono">&lt;1&gt;<\/span>, expected <span class="mono">2<\/span>, reward 1/,
  );
  assert.doesNotMatch(html, /<script|https?:\/\/(?!www\.w3\.org\/2000\/svg)/, 'still self-contained');

  await store.upsertRun({ runId: 'text-only', project: 'p', experiment: 'e', config: {} as never });
  await store.insertTrajectories([trajectory('text-only', 1, { kind: 'val' })]);
  const plain = await loadReportData(db, 'text-only');
  assert.deepEqual(plain.valImages, []);
  assert.doesNotMatch(renderReport(plain), /Validation images/);
});

const turn = (role: string, text: string, reward = 0, over: Partial<EpisodeTurn> = {}): EpisodeTurn => ({
  role,
  start: 0,
  end: 0,
  text,
  tool_name: null,
  arguments: null,
  latency_ms: 1,
  error: null,
  reward,
  ...over,
});

function episode(p: number, failure: string | null = null): Episode {
  return {
    turns: [
      turn('assistant', '8'),
      turn('user', '>'),
      turn('assistant', '<tool_call>{"name":"calc","arguments":{"x":"12"}}</tool_call>'),
      turn('tool', `${p + 12}`, 0, { tool_name: 'calc', arguments: '{"x":"12"}' }),
      turn('assistant', '12'),
      turn('user', 'correct', 0.64),
    ],
    assistant_turns: 3,
    reward: 0.64,
    done: failure === null,
    failure,
    timed_out: false,
    tool_calls: 1,
    tool_errors: 0,
    metrics: {},
  };
}

test('episodes of the last validation round as conversations; a run without episodes has no such section', async () => {
  const store = createStore(db);
  const runId = 'agent-report';
  await store.upsertRun({ runId, project: 'p', experiment: 'e', config: {} as never });
  const id = (kind: string, step: number, p: number) => `${runId}/${kind}/s${step}/p${p}/n0`;
  const rows = [
    ...[2, 4].flatMap((step) =>
      Array.from({ length: 6 }, (_, p) => ({ kind: 'val' as const, step, p, trajectoryId: id('val', step, p) })),
    ),
    { kind: 'train' as const, step: 9, p: 0, trajectoryId: id('train', 9, 0) },
  ];
  await store.insertTrajectories(
    rows.map((r, i) =>
      trajectory(runId, i, { id: r.trajectoryId, kind: r.kind, step: r.step, promptText: `secret #${r.p}` }),
    ),
  );
  await store.insertEpisodes(
    rows.map((r) => ({
      runId,
      trajectoryId: r.trajectoryId,
      step: r.step,
      kind: r.kind,
      policyVersion: r.step,
      responseTokens: 12,
      episode: episode(r.p, r.p === 1 ? 'timeout: no answer in 10 s' : null),
    })),
  );
  const data = await loadReportData(db, runId);
  assert.equal(data.episodes.length, REPORT_EPISODES);
  assert.ok(
    data.episodes.every((e) => e.kind === 'val' && e.step === 4),
    'the last validation round',
  );
  assert.deepEqual(
    data.episodes.map((e) => [e.prompt, e.outcome]),
    [
      ['secret #0', 'done'],
      ['secret #1', 'failed'],
      ['secret #2', 'done'],
      ['secret #3', 'done'],
    ],
  );
  assert.deepEqual(
    data.episodes[2]!.turns.map((t) => [t.role, t.text, t.toolName, t.reward]),
    [
      ['assistant', '8', null, 0],
      ['user', '>', null, 0],
      ['assistant', '<tool_call>{"name":"calc","arguments":{"x":"12"}}</tool_call>', null, 0],
      ['tool', '14', 'calc', 0],
      ['assistant', '12', null, 0],
      ['user', 'correct', null, 0.64],
    ],
  );
  const html = renderReport(data);
  assert.match(html, /<h2>Episodes \(val step 4, first 4\)<\/h2>/);
  assert.match(html, /val step 4: 3 assistant turns, failed \(timeout: no answer in 10 s\), reward 0\.64/);
  assert.match(html, /<tr><td>tool<\/td><td>14<\/td><td>calc \{&quot;x&quot;:&quot;12&quot;\}<\/td><td>0<\/td>/);
  assert.match(html, /<tr><td>user<\/td><td>correct<\/td><td><\/td><td>0\.64(00)?<\/td>/);
  assert.match(html, /<td>&lt;tool_call&gt;/, 'escaped');

  await store.upsertRun({ runId: 'single-turn', project: 'p', experiment: 'e', config: {} as never });
  await store.insertTrajectories([trajectory('single-turn', 1, { kind: 'val' })]);
  const plain = await loadReportData(db, 'single-turn');
  assert.deepEqual(plain.episodes, []);
  assert.doesNotMatch(renderReport(plain), /<h2>Episodes/);
});

test("an image policy's generated images: one row per step, spread over the run, each with its first images, prompt and reward", async () => {
  assert.deepEqual(spreadSteps([1, 2, 3], 6), [1, 2, 3]);
  assert.deepEqual(spreadSteps([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 6), [1, 3, 5, 7, 9, 11]);
  const store = createStore(db);
  const runId = 'image-policy-report';
  await store.upsertRun({ runId, project: 'p', experiment: 'e', config: {} as never });
  const pngs = await Promise.all(
    Array.from({ length: 3 }, (_, k) => imageToPng(new Float32Array(16).fill(k / 2 - 0.5), 1, 4)),
  );
  await store.insertPromptImages(pngs.map((png) => ({ runId, hash: imageHash(png), width: 4, height: 4, png })));
  const rows = [];
  for (const step of [1, 2, 3])
    for (let p = 0; p < 5; p++)
      for (let n = 0; n < 2; n++)
        rows.push(
          trajectory(runId, 100 * step + 10 * p + n, {
            id: `${runId}/train/s${step}/p${p}/n${n}`,
            step,
            promptIndex: p,
            sampleIndex: n,
            promptText: `glyph ${p}`,
            reward: n / 2,
            rewardFailure: null,
            filtered: false,
            filterReason: null,
            generatedImageHash: imageHash(pngs[(p + n) % 3]!),
          }),
        );
  await store.insertTrajectories([...rows, trajectory(runId, 999, { step: 4 })]);
  const data = await loadReportData(db, runId);
  assert.deepEqual(
    data.generated.map((g) => g.step),
    [1, 2, 3],
  );
  for (const g of data.generated) {
    assert.equal(g.images.length, GENERATED_PER_STEP);
    assert.deepEqual(g.images[0]!.prompt, 'glyph 0');
    assert.deepEqual(g.images[1]!.reward, 0.5);
    assert.ok(Buffer.from(g.images[2]!.pngBase64, 'base64').equals(pngs[1]!), 'prompt 1 sample 0: its stored PNG');
  }
  const html = renderReport(data);
  assert.match(html, /<h2>Generated images<\/h2>/);
  assert.match(html, /<h3>step 3<\/h3>/);
  assert.equal((html.match(/alt="generated for glyph/g) ?? []).length, 3 * GENERATED_PER_STEP);
  assert.deepEqual((await loadReportData(db, 'text-only')).generated, []);
});
