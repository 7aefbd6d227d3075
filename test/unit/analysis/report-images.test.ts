/**
 * The report of a run with prompt images shows the last validation round's first images, inline,
 * with the policy's answers (the vision number game: "a few validation images with the model's
 * answers").
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { createStore } from '../../../lib/store/index.ts';
import { loadReportData, renderReport, VAL_IMAGES } from '../../../lib/analysis/report.ts';
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
