/**
 * LiveTensorBoard (trainer.logger: tensorboard) over a PGlite store written step by step the way
 * the stages write it: a step's train scalars are appended once the update stage has written that
 * step, a validation round's as soon as it is stored; reopening (a restarted run) rewrites the file
 * from the store instead of duplicating; a completed run's file is the `report --tensorboard` export.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDatabase, type Database } from '../../../lib/db/database.ts';
import { createStore, type MetricRow, type Store } from '../../../lib/store/index.ts';
import { LiveTensorBoard, tensorboardDir } from '../../../lib/analysis/tensorboard-live.ts';
import { exportRunToTensorBoard, readScalars } from '../../../lib/analysis/tensorboard.ts';

let dir: string;
let database: Database;
let store: Store;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-tb-live-'));
  database = await openDatabase({ kind: 'pglite', dir: join(dir, 'db') });
  store = createStore(database);
});
after(async () => {
  await database.close();
  rmSync(dir, { recursive: true, force: true });
});

const row = (runId: string, step: number, name: string, value: number, stage: string): MetricRow => ({
  runId,
  step,
  name,
  value,
  stage,
});
/** The metrics the rollout, advantage and update stages write for a training step. */
const trainStep = (runId: string, step: number) => ({
  before: [
    row(runId, step, 'perf/rollout_tokens', 100 * step, 'rollout'),
    row(runId, step, 'reward/mean', step / 10, 'advantage'),
  ],
  update: [row(runId, step, 'actor/pg_loss', -step, 'update')],
});
const val = (runId: string, step: number) => [
  row(runId, step, 'val/accuracy', step / 20, 'controller'),
  row(runId, step, 'val/reward_score', step / 40, 'controller'),
];
const pairs = (tb: string) =>
  readScalars(tb)
    .map((s) => `${s.step} ${s.tag}`)
    .sort();

test('appends settled steps only, never twice; a restart rewrites from the store; completion writes the export', async () => {
  const runId = 'tb-live';
  await store.upsertRun({ runId, project: 'p', experiment: 'e', config: {} as never });
  const tb = tensorboardDir(join(dir, 'run'));
  const live = await LiveTensorBoard.open(database.db, runId, tb, { intervalMs: 60_000 });
  assert.deepEqual(readScalars(tb), [], 'an empty file while nothing is stored');
  const files = readdirSync(tb);
  assert.equal(files.length, 1);
  assert.match(files[0], /^events\.out\.tfevents\.\d+\.rlstream-export\.tb-live$/);

  await store.insertMetrics(val(runId, 0));
  const s1 = trainStep(runId, 1);
  await store.insertMetrics(s1.before);
  assert.equal(await live.sync(), 2, 'validation round 0 is settled; step 1 is not until the update wrote it');
  assert.deepEqual(pairs(tb), ['0 val/accuracy', '0 val/reward_score']);
  await store.insertMetrics(s1.update);
  const s2 = trainStep(runId, 2);
  await store.insertMetrics(s2.before);
  assert.equal(await live.sync(), 3);
  assert.deepEqual(pairs(tb), [
    '0 val/accuracy',
    '0 val/reward_score',
    '1 actor/pg_loss',
    '1 perf/rollout_tokens',
    '1 reward/mean',
  ]);
  assert.equal(await live.sync(), 0, 'nothing new: nothing appended');
  // the process dies here (no finish): step 2's partial rows are in the store, not in the file
  await store.insertMetrics(s2.update);
  await store.insertMetrics(val(runId, 2));

  const restarted = await LiveTensorBoard.open(database.db, runId, tb, { intervalMs: 60_000 });
  const afterRestart = pairs(tb);
  assert.equal(new Set(afterRestart).size, afterRestart.length, 'no scalar twice after the restart');
  assert.equal(afterRestart.length, 10, 'steps 1 and 2 and both validation rounds');
  const s3 = trainStep(runId, 3);
  await store.insertMetrics([...s3.before, ...s3.update]);
  assert.equal(await restarted.sync(), 3);
  assert.equal(readdirSync(tb).length, 1, 'one file');
  const live3 = readScalars(tb);
  assert.deepEqual(
    live3.filter((s) => s.tag === 'reward/mean').map((s) => [s.step, s.value]),
    [
      [1, Math.fround(0.1)],
      [2, Math.fround(0.2)],
      [3, Math.fround(0.3)],
    ],
  );

  // a late value of a written step (a counter's increment) reaches the file with the final export
  await store.insertMetrics([{ ...row(runId, 3, 'perf/rollout_tokens', 1, 'rollout'), agg: 'sum', increment: true }]);
  await restarted.finish(true);
  await live.finish(false); // the first writer's file was replaced; closing it writes nothing more
  const final = readFileSync(join(tb, files[0]));
  const exported = await exportRunToTensorBoard(database.db, runId, join(dir, 'export'));
  assert.deepEqual(final, readFileSync(exported.path), "a completed run's file is the export");
  assert.equal(readScalars(tb).find((s) => s.step === 3 && s.tag === 'perf/rollout_tokens')!.value, 301);
});

test('a stopped run keeps what was appended and appends the settled rest', async () => {
  const runId = 'tb-stopped';
  await store.upsertRun({ runId, project: 'p', experiment: 'e', config: {} as never });
  const tb = tensorboardDir(join(dir, 'stopped'));
  const live = await LiveTensorBoard.open(database.db, runId, tb, { intervalMs: 60_000 });
  const s1 = trainStep(runId, 1),
    s2 = trainStep(runId, 2);
  await store.insertMetrics([...s1.before, ...s1.update, ...s2.before]);
  await live.finish(false);
  assert.deepEqual(pairs(tb), ['1 actor/pg_loss', '1 perf/rollout_tokens', '1 reward/mean']);
  await live.finish(false);
  assert.equal(await live.sync(), 0, 'a finished logger writes nothing');
});

test('polls on its own', async () => {
  const runId = 'tb-poll';
  await store.upsertRun({ runId, project: 'p', experiment: 'e', config: {} as never });
  const tb = tensorboardDir(join(dir, 'poll'));
  const live = await LiveTensorBoard.open(database.db, runId, tb, { intervalMs: 20 });
  try {
    const s1 = trainStep(runId, 1);
    await store.insertMetrics([...s1.before, ...s1.update]);
    const deadline = Date.now() + 10_000;
    while (readScalars(tb).length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual(pairs(tb), ['1 actor/pg_loss', '1 perf/rollout_tokens', '1 reward/mean']);
  } finally {
    await live.finish(false);
  }
});

test('needs the run to exist', async () => {
  await assert.rejects(
    LiveTensorBoard.open(database.db, 'nope', join(dir, 'nope')),
    /run "nope" is not in this database/,
  );
});
