/**
 * Images in data: a JSONL dataset whose rows carry images (file paths and data URLs) trains two
 * steps with the text policy. Each distinct image is stored once per run in prompt_images (the
 * resized, normalised PNG and its size), every trajectory names its prompt's images by hash, and
 * SQL joins a sample to its image. The policy is text-only: the run says so once at start.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import sharp from 'sharp';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { createLogger, silentLogger } from '../../lib/log.ts';
import { replayRun } from '../../app/replay.ts';
import { openStore } from '../../lib/store/index.ts';
import { imageHash } from '../../lib/data/image-hash.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `images-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

/** A w×h PNG filled with one colour. */
const png = (w: number, h: number, r: number) =>
  sharp({ create: { width: w, height: h, channels: 3, background: { r, g: 40, b: 200 - r } } })
    .png()
    .toBuffer();

test(
  'a dataset with images trains with the text policy; each image is stored once and trajectories reference it',
  { timeout: 240_000 },
  async () => {
    const data = join(tmp, 'data');
    mkdirSync(join(data, 'img'), { recursive: true });
    // four distinct pictures shared by the rows (by path and by data URL), one missing file
    const pics = await Promise.all(
      [
        [60, 40, 10],
        [90, 90, 80],
        [40, 120, 150],
        [200, 50, 220],
      ].map(([w, h, r]) => png(w!, h!, r!)),
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
    const row = (n: number[], i: number, image: unknown) =>
      JSON.stringify({ prompt: `${n.join(' ')}:`, answer: String(n.indexOf(Math.max(...n))), images: image, idx: i });
    writeFileSync(
      join(data, 'train.jsonl'),
      [...nums.map((n, i) => row(n, i, [`img/p${i % 4}.png`])), row([1, 2, 3], 8, ['img/missing.png'])].join('\n'),
    );
    writeFileSync(
      join(data, 'val.jsonl'),
      nums
        .slice(0, 2)
        .map((n, i) => row(n, i, `data:image/png;base64,${pics[i]!.toString('base64')}`))
        .join('\n'),
    );

    const runId = 'images-e2e';
    const cfg = loadConfig({
      file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
      overrides: [
        `trainer.run_dir=${join(tmp, 'run')}`,
        `pipeline.run_id=${runId}`,
        'trainer.max_steps=2',
        'data.task=null',
        `data.train_files=${join(data, 'train.jsonl')}`,
        `data.val_files=${join(data, 'val.jsonl')}`,
        'trainer.val_before_train=true',
        'actor.model.alphabet="0123456789 :"',
        'data.on_bad_row=skip',
        'data.min_pixels=784',
        'data.max_pixels=3136',
        'data.image_resample=lanczos3',
      ],
    });
    const lines: string[] = [];
    const out = await trainEmbedded(cfg, createLogger({ runId, pretty: false, sink: { write: (l) => lines.push(l) } }));
    assert.equal(out.status, 'completed', out.message);
    const said = lines.filter((l) => l.includes('images are stored but the policy is text-only'));
    assert.equal(said.length, 1, 'said once at start');
    assert.ok(
      lines.some((l) => /1 bad train row skipped.*train\.jsonl:9: image 0 in \\"images\\" file not found/.test(l)),
      'the bad image row is reported with its file:line',
    );

    const store = await openStore({ kind: 'pglite', dir: join(tmp, 'run', 'db') });
    try {
      const images = await store.getPromptImages(runId);
      const train = await store.getTrajectories(runId, { kind: 'train' });
      const val = await store.getTrajectories(runId, { kind: 'val' });
      assert.ok(train.length > 0 && val.length > 0);
      // every referenced image is stored exactly once, and nothing else is
      const referenced = new Set([...train, ...val].flatMap((t) => t.imageHashes));
      assert.deepEqual(new Set(images.map((i) => i.hash)), referenced);
      for (const t of [...train, ...val]) assert.equal(t.imageHashes.length, 1, `${t.id} has its prompt's image`);
      for (const i of images) {
        assert.equal(imageHash(i.png), i.hash);
        const meta = await sharp(i.png).metadata();
        assert.deepEqual([meta.format, meta.width, meta.height, meta.channels], ['png', i.width, i.height, 3]);
        assert.ok(
          i.width % 28 === 0 && i.height % 28 === 0 && i.width * i.height >= 784 && i.width * i.height <= 3136,
          `${i.width}×${i.height} on the grid, within the pixel bounds`,
        );
      }
      // the validation rows' data URLs are the same pictures as train files p0, p1: one row each
      const byPrompt = new Map(train.map((t) => [t.promptText, t.imageHashes[0]]));
      for (const v of val) if (byPrompt.has(v.promptText)) assert.equal(v.imageHashes[0], byPrompt.get(v.promptText));
      // SQL: a sample joined to the image it answered
      const { rows } = await sql<{ n: number; missing: number }>`
      select count(*)::int as n, count(*) filter (where i.hash is null)::int as missing
      from trajectories t cross join lateral unnest(t.image_hashes) as h(hash)
      left join prompt_images i on i.run_id = t.run_id and i.hash = h.hash
      where t.run_id = ${runId}`.execute(store.database.db);
      assert.deepEqual(rows[0], { n: train.length + val.length, missing: 0 });
    } finally {
      await store.close();
    }

    // a replay of the run has the images too: its trajectories join to its own prompt_images
    const rep = await replayRun({
      from: join(tmp, 'run'),
      overrides: ['pipeline.run_id=images-replay', 'trainer.val_before_train=false'],
      log: silentLogger('images-replay'),
    });
    assert.equal(rep.status, 'completed', rep.message);
    const rs = await openStore({ kind: 'pglite', dir: join(rep.runDir, 'db') });
    try {
      const { rows } = await sql<{ n: number; missing: number }>`
      select count(*)::int as n, count(*) filter (where i.hash is null)::int as missing
      from trajectories t cross join lateral unnest(t.image_hashes) as h(hash)
      left join prompt_images i on i.run_id = t.run_id and i.hash = h.hash
      where t.run_id = 'images-replay'`.execute(rs.database.db);
      assert.ok(rows[0]!.n > 0, 'the replay stored trajectories with images');
      assert.equal(rows[0]!.missing, 0);
    } finally {
      await rs.close();
    }
  },
);
