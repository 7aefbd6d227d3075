/**
 * Stage metrics (lib/pipeline/metrics.ts) over an embedded store: two replicas of a stage writing
 * the same step both count (tokens summed, times the slowest replica's), a restarted stage adds
 * to what it had stored before the crash instead of overwriting it, and a batch whose transaction
 * rolls back is counted once when retried.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDatabase, type Database, type Tx } from '../../../lib/db/database.ts';
import { createStore } from '../../../lib/store/index.ts';
import type { Store } from '../../../lib/store/port.ts';
import { StageMetrics, metricAgg, metricRows, weightOf } from '../../../lib/pipeline/metrics.ts';
import type { Pipeline, StageContext } from '../../../lib/pipeline/runtime.ts';

let dir: string;
let db: Database;
let store: Store;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-metrics-'));
  db = await openDatabase({ kind: 'pglite', dir });
  store = createStore(db);
});
after(async () => {
  await db.close();
  rmSync(dir, { recursive: true, force: true });
});

async function newRun(runId: string): Promise<Pipeline> {
  await store.upsertRun({ runId, project: 'p', experiment: 'metrics', config: {} });
  return { runId, store } as unknown as Pipeline;
}

/** Runs `fn` as a batch: its metric writes and emits commit together, or not at all when it throws. */
async function batch(fn: (ctx: StageContext) => Promise<void>): Promise<unknown[]> {
  const emitted: unknown[] = [];
  await db.db.transaction().execute(async (tx: Tx) => {
    await fn({
      tx,
      db: tx,
      signal: new AbortController().signal,
      waitedMs: 0,
      emit: (_t, v) => {
        emitted.push(v);
      },
      flush: async () => undefined,
    });
  });
  return emitted;
}

const values = async (runId: string) =>
  Object.fromEntries((await store.getMetrics(runId)).map((m) => [m.name, m.value]));

test("two replicas of a stage writing one step: tokens add up, the step time is the slowest replica's", async () => {
  const p = await newRun('m-replicas');
  const r0 = new StageMetrics(p, 'rollout', '0');
  const r1 = new StageMetrics(p, 'rollout', '1');
  r0.add(5, { 'perf/rollout_tokens': 300 }, { load: 100, generate: 900 });
  const e0 = await batch((ctx) => r0.flush(ctx, 1));
  r1.add(5, { 'perf/rollout_tokens': 200 }, { load: 50, generate: 1450 });
  await batch((ctx) => r1.flush(ctx, 2));
  r0.add(5, { 'perf/rollout_tokens': 100 }, { load: 0, generate: 200 });
  await batch((ctx) => r0.flush(ctx, 3));
  const v = await values(p.runId);
  assert.equal(v['perf/rollout_tokens'], 600);
  assert.equal(v['perf/step_time_s/rollout'], 1.5); // replica 1: 1.5 s; replica 0: 1.2 s
  assert.equal(v['timing/rollout/generate_s'], 1.45);
  assert.equal(v['timing/rollout/load_s'], 0.1);
  assert.deepEqual((e0[0] as { replica: string; values: object }).replica, '0', 'the topic record names its replica');
});

test('a restarted stage adds to its stored counters (no undercount after a crash)', async () => {
  const p = await newRun('m-restart');
  const before = new StageMetrics(p, 'reward');
  before.add(2, { 'reward/failures': 3 }, { compute: 1000 });
  await batch((ctx) => before.flush(ctx));
  // the process dies; a new one handles the step's remaining groups with empty memory
  const after = new StageMetrics(p, 'reward');
  after.add(2, { 'reward/failures': 1 }, { compute: 500 });
  await batch((ctx) => after.flush(ctx));
  const v = await values(p.runId);
  assert.equal(v['reward/failures'], 4);
  assert.equal(v['timing/reward/compute_s'], 1.5);
});

test('a batch that rolls back and is retried counts once', async () => {
  const p = await newRun('m-retry');
  const m = new StageMetrics(p, 'rollout', '0');
  const handle = (ctx: StageContext) => {
    m.add(1, { 'perf/rollout_tokens': 10 });
    return m.flush(ctx);
  };
  await assert.rejects(
    batch(async (ctx) => {
      await handle(ctx);
      throw new Error('crash before commit');
    }),
    /crash before commit/,
  );
  await batch(handle);
  assert.equal((await values(p.runId))['perf/rollout_tokens'], 10);
});

test("set values: a writer's last value wins; val batches store only val/* names", async () => {
  const p = await newRun('m-set');
  const m = new StageMetrics(p, 'advantage');
  m.set(3, { 'kl/coef': 0.1, 'reward/mean': 0.5 });
  m.set(3, { 'kl/coef': 0.2 });
  m.set(4, { 'val/accuracy': 0.75, other: 1 }, 'val');
  await batch((ctx) => m.flush(ctx));
  assert.deepEqual(
    (await store.getMetrics(p.runId)).map((x) => [x.name, x.step, x.value]),
    [
      ['kl/coef', 3, 0.2],
      ['reward/mean', 3, 0.5],
      ['val/accuracy', 4, 0.75],
    ],
  );
});

test("how replicas' values combine, by name", () => {
  assert.equal(metricAgg('reward_server/a/requests_total'), 'sum');
  assert.equal(metricAgg('reward/scored'), 'sum');
  assert.equal(metricAgg('reward_server/a/requests_per_s'), 'sum');
  assert.equal(metricAgg('reward_server/a/latency_p99_ms'), 'max');
  assert.equal(metricAgg('reward_server/a/breaker_open'), 'max');
  assert.equal(metricAgg('reward_server/a/error_rate'), 'mean');
  assert.equal(metricAgg('actor/pg_loss'), 'last');
  assert.equal(weightOf('reward_server/a/error_rate', { 'reward_server/a/requests_total': 40 }), 40);
  assert.equal(weightOf('reward_server/a/error_rate', {}), 1);
  const rows = metricRows('r', 'rollout', '1', 7, {
    sums: { 'perf/rollout_tokens': 5 },
    timingMs: { load: 250, generate: 750 },
    sets: {},
  });
  assert.deepEqual(
    rows.map((x) => [x.name, x.value, x.agg, x.increment, x.replica]),
    [
      ['perf/rollout_tokens', 5, 'sum', true, '1'],
      ['timing/rollout/load_s', 0.25, 'max', true, '1'],
      ['timing/rollout/generate_s', 0.75, 'max', true, '1'],
      ['perf/step_time_s/rollout', 1, 'max', true, '1'],
    ],
  );
  // the idle wait before a batch is logged as timing/<stage>/wait_s but is not time spent on the step
  const waited = metricRows('r', 'update', '', 3, { sums: {}, timingMs: { wait: 400, compute: 900 }, sets: {} });
  assert.deepEqual(
    waited.map((x) => [x.name, x.value]),
    [
      ['timing/update/wait_s', 0.4],
      ['timing/update/compute_s', 0.9],
      ['perf/step_time_s/update', 0.9],
    ],
  );
  assert.deepEqual(
    metricRows('r', 'update', '', 3, { sums: {}, timingMs: { wait: 400 }, sets: {} }).map((x) => x.name),
    ['timing/update/wait_s'],
    'a wait alone is no step time',
  );
});

test('the idle wait before a batch is logged once, on the first step that gets timings', async () => {
  const p = await newRun('m-wait');
  const m = new StageMetrics(p, 'rollout');
  await batch(async (ctx) => {
    m.beginBatch(300);
    m.add(2, { 'perf/rollout_tokens': 4 }); // no timings: the wait waits for a step with timings
    m.add(2, {}, { generate: 100 });
    m.add(3, {}, { generate: 50 });
    await m.flush(ctx);
  });
  const rows = await store.getMetrics('m-wait', [
    'timing/rollout/wait_s',
    'timing/rollout/generate_s',
    'perf/step_time_s/rollout',
  ]);
  assert.deepEqual(
    rows.map((r) => [r.name, r.step, r.value]),
    [
      ['perf/step_time_s/rollout', 2, 0.1],
      ['perf/step_time_s/rollout', 3, 0.05],
      ['timing/rollout/generate_s', 2, 0.1],
      ['timing/rollout/generate_s', 3, 0.05],
      ['timing/rollout/wait_s', 2, 0.3],
    ],
  );
});
