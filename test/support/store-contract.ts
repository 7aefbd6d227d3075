/**
 * The store contract: one suite every Store adapter passes (PGlite, PostgreSQL). Run ids are unique
 * per test (the PostgreSQL database is shared), and the suite deletes its runs afterwards.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { sql } from 'kysely';
import type { Database, Tx } from '../../lib/db/database.ts';
import { RlError } from '../../lib/errors.ts';
import { createStore } from '../../lib/store/index.ts';
import { unnestTrajectories } from '../../lib/store/postgres-store.ts';
import type { Store, TrajectoryRow } from '../../lib/store/port.ts';
import { assertFloat32Array, assertSameTrajectory, trajectory, uniqueRunId } from './store-fixtures.ts';

export interface StoreHarness {
  store: Store;
  database: Database;
}

function rejectsWith(code: string, pattern?: RegExp) {
  return (e: unknown) => {
    assert.ok(e instanceof RlError, `expected an RlError, got ${String(e)}`);
    assert.equal(e.code, code, `error code for: ${e.message}`);
    if (pattern) assert.match(e.message, pattern);
    return true;
  };
}

export function runStoreContract(name: string, make: () => Promise<StoreHarness>): void {
  describe(`store contract: ${name}`, () => {
    let store: Store;
    let database: Database;
    const prefix = uniqueRunId(`contract-${name}`);
    const project = `${prefix}-project`;
    let runs = 0;

    /** A fresh registered run for one test. */
    async function newRun(config: Record<string, unknown> = {}): Promise<string> {
      runs += 1;
      const runId = `${prefix}-r${runs}`;
      await store.upsertRun({ runId, project, experiment: 'contract', config: config as never });
      return runId;
    }

    before(async () => {
      ({ store, database } = await make());
      assert.equal(store.kind, database.kind);
    });

    after(async () => {
      if (!database) return;
      await sql`delete from runs where run_id like ${`${prefix}%`}`.execute(database.db);
      await sql`delete from dead_letters where stage like ${`${prefix}%`}`.execute(database.db);
      await store.close();
      await database.close();
    });

    describe('runs', () => {
      it('upserts, reads, lists newest first and filters', async () => {
        const a = await newRun({ lr: 1e-6, model: { name: 'tiny' } });
        const b = await newRun();
        const got = await store.getRun(a);
        assert.ok(got);
        assert.equal(got.project, project);
        assert.equal(got.status, 'running');
        assert.deepEqual(got.config, { lr: 1e-6, model: { name: 'tiny' } });
        assert.equal(got.parentRunId, null);
        assert.equal(got.summary, null);
        const listed = (await store.listRuns({ project })).map((r) => r.runId);
        assert.ok(
          listed.indexOf(b) < listed.indexOf(a) && listed.indexOf(a) >= 0,
          `newest first: ${listed.join(', ')}`,
        );
        assert.deepEqual(
          (await store.listRuns({ project, status: 'completed' })).filter((r) => r.runId === a),
          [],
        );
        assert.equal(await store.getRun(`${prefix}-no-such-run`), undefined);
      });

      it('a second upsert (resume) updates config, parent and status but keeps created_at', async () => {
        const runId = await newRun({ v: 1 });
        const first = (await store.getRun(runId))!;
        await store.setRunStatus(runId, 'failed');
        const again = await store.upsertRun({
          runId,
          project,
          experiment: 'contract',
          config: { v: 2, list: [1, 2, 3] },
          parentRunId: `${prefix}-parent`,
        });
        assert.equal(again.status, 'running');
        assert.deepEqual(again.config, { v: 2, list: [1, 2, 3] });
        assert.equal(again.parentRunId, `${prefix}-parent`);
        assert.equal(again.createdAt.getTime(), first.createdAt.getTime());
      });

      it('sets status with a summary; an unknown run is a clear, non-retriable error', async () => {
        const runId = await newRun();
        const done = await store.setRunStatus(runId, 'completed', { steps: 10, 'reward/mean': 0.75 });
        assert.equal(done.status, 'completed');
        assert.deepEqual(done.summary, { steps: 10, 'reward/mean': 0.75 });
        assert.deepEqual(
          (await store.listRuns({ project, status: 'completed' })).map((r) => r.runId).includes(runId),
          true,
        );
        await assert.rejects(store.setRunStatus(`${prefix}-missing`, 'stopped'), (e: unknown) => {
          assert.ok(e instanceof RlError && e.code === 'ERR_UNKNOWN_RUN' && !e.retriable);
          assert.match(e.message, /does not exist/);
          return true;
        });
        await assert.rejects(
          store.setRunStatus(runId, 'paused' as never),
          rejectsWith('ERR_BAD_ROW', /running, completed, failed, stopped/),
        );
        await assert.rejects(
          store.upsertRun({ runId, project, experiment: 'contract', config: { note: 'nul \u0000' } }),
          rejectsWith('ERR_BAD_ROW', /upsertRun/),
        );
      });
    });

    describe('trajectories', () => {
      it('round-trips every field and re-insertion is idempotent (first write wins)', async () => {
        const runId = await newRun();
        const rows = Array.from({ length: 10 }, (_, i) => trajectory(runId, i));
        assert.deepEqual(await store.insertTrajectories(rows), { inserted: 10, duplicates: 0 });
        const stored = await store.getTrajectories(runId);
        assert.equal(stored.length, 10);
        const byId = new Map(stored.map((s) => [s.id, s]));
        for (const r of rows) assertSameTrajectory(byId.get(r.id), r);

        // Re-delivery with different content: no error, no duplicate, stored row unchanged.
        const changed = rows.map((r) => ({ ...r, responseText: 'rewritten', reward: 0.5, rewardFailure: null }));
        assert.deepEqual(await store.insertTrajectories(changed), { inserted: 0, duplicates: 10 });
        assert.equal(await store.countTrajectories(runId), 10);
        assertSameTrajectory((await store.getTrajectories(runId, { ids: [rows[3]!.id] }))[0], rows[3]!);

        // Mixed batch: 2 stored, 2 new, one new row repeated in the batch.
        const fresh = [trajectory(runId, 10), trajectory(runId, 11)];
        const mixed = [rows[0]!, fresh[0]!, rows[1]!, fresh[1]!, { ...fresh[0]!, responseText: 'second copy' }];
        assert.deepEqual(await store.insertTrajectories(mixed), { inserted: 2, duplicates: 3 });
        assertSameTrajectory((await store.getTrajectories(runId, { ids: [fresh[0]!.id] }))[0], fresh[0]!);
        assert.equal(await store.countTrajectories(runId), 12);

        // Stored rows where the ingest's probe (first, middle, last id) does not look: the COPY
        // meets them and the batch goes the slow way, with the same result.
        const more = [12, 13, 14, 15].map((i) => trajectory(runId, i));
        const hidden = [more[0]!, changed[5]!, more[1]!, more[2]!, changed[6]!, more[3]!];
        assert.deepEqual(await store.insertTrajectories(hidden), { inserted: 4, duplicates: 2 });
        assertSameTrajectory((await store.getTrajectories(runId, { ids: [rows[5]!.id] }))[0], rows[5]!);
        assertSameTrajectory((await store.getTrajectories(runId, { ids: [more[3]!.id] }))[0], more[3]!);
        assert.equal(await store.countTrajectories(runId), 16);
        assert.deepEqual(await store.insertTrajectories([]), { inserted: 0, duplicates: 0 });
      });

      it('filters reads and counts by step, kind and filtered', async () => {
        const runId = await newRun();
        const rows = Array.from({ length: 16 }, (_, i) =>
          trajectory(
            runId,
            i,
            i % 4 === 0 ? { kind: 'val' } : i % 4 === 1 ? { filtered: true, filterReason: 'zero-variance group' } : {},
          ),
        );
        await store.insertTrajectories(rows);
        assert.equal(await store.countTrajectories(runId), 16);
        assert.equal(await store.countTrajectories(runId, { step: 1 }), 8);
        assert.equal(await store.countTrajectories(runId, { kind: 'val' }), 4);
        assert.equal(await store.countTrajectories(runId, { filtered: true }), 4);
        assert.equal(await store.countTrajectories(runId, { step: 0, kind: 'train', filtered: false }), 4);
        const filtered = await store.getTrajectories(runId, { filtered: true, step: 0 });
        assert.deepEqual(
          filtered.map((t) => t.filterReason),
          ['zero-variance group', 'zero-variance group'],
        );
        assert.deepEqual(await store.getTrajectories(runId, { ids: [] }), []);
        assert.equal(await store.countTrajectories(`${prefix}-nothing`), 0);
      });

      it('ingests a large batch in several COPY chunks', async () => {
        const runId = await newRun();
        // ~2.2 KB per row encoded: 5000 rows span several 4 MB chunks.
        const rows = Array.from({ length: 5000 }, (_, i) => trajectory(runId, i, {}, 256));
        assert.deepEqual(await store.insertTrajectories(rows), { inserted: 5000, duplicates: 0 });
        assert.equal(await store.countTrajectories(runId), 5000);
        const probe = [0, 1, 2499, 4096, 4999].map((i) => rows[i]!);
        const stored = await store.getTrajectories(runId, { ids: probe.map((r) => r.id) });
        const byId = new Map(stored.map((s) => [s.id, s]));
        for (const r of probe) assertSameTrajectory(byId.get(r.id), r);
        assert.deepEqual(await store.insertTrajectories(rows.slice(4000)), { inserted: 0, duplicates: 1000 });
      });

      it('round-trips text that needs escaping, unicode and odd ids', async () => {
        const runId = await newRun();
        const texts = [
          'tab\there',
          'new\nline',
          'carriage\r\nreturn',
          'back\\slash \\N \\t \\\\',
          '"double" \'single\'',
          '{1,2,"x"}',
          'NULL',
          '\\N',
          '',
          'emoji 🙂👍🏽 family 👨‍👩‍👧',
          'CJK 日本語 中文 한국어',
          'RTL עברית العربية',
          'combining é vs é',
          'zero-width \u200b joiner',
          'x'.repeat(20000),
          'control \u0001\u0007\u001b[31m',
          'lone surrogate-free 𝔘𝔫𝔦𝔠𝔬𝔡𝔢',
        ];
        const rows = texts.map((t, i) =>
          trajectory(runId, i, {
            id: `${runId}/ödd id ${i} with spaces/and\\slashes\t"quotes"`,
            promptText: t,
            responseText: `${t}|${i}`,
            groundTruth: i % 2 ? t : null,
            finishReason: i % 3 ? 'length' : null,
            groupUid: `grüp ${i % 2}`,
            rewardDetails: i % 5 === 4 ? null : { note: t.slice(0, 100), nested: { list: [1, 'two', null, true] } },
          }),
        );
        await store.insertTrajectories(rows);
        const stored = new Map((await store.getTrajectories(runId)).map((s) => [s.id, s]));
        for (const r of rows) assertSameTrajectory(stored.get(r.id), r);
      });

      it('stores decoded text holding NUL (U+0000) with ␀ in the text columns; the token ids stay exact', async () => {
        const runId = await newRun();
        const row = trajectory(runId, 0, {
          promptText: 'p\u0000q',
          responseText: '\u0000rs\u0000\u0000e',
          groundTruth: 'g\u0000',
          rewardDetails: { answer: 'a\u0000b', 'k\u0000': 1, lit: 'back\\u0000slash' },
        });
        const failed = trajectory(runId, 1, { reward: null, rewardDetails: null, rewardFailure: 'threw on "\u0000"' });
        await store.insertTrajectories([row, failed]);
        const [a, b] = await store.getTrajectories(runId);
        assert.equal(a!.promptText, 'p␀q');
        assert.equal(a!.responseText, '␀rs␀␀e');
        assert.equal(a!.groundTruth, 'g␀');
        assert.deepEqual(a!.rewardDetails, { answer: 'a␀b', 'k␀': 1, lit: 'back\\u0000slash' });
        assert.deepEqual(a!.responseTokens, Array.from(row.responseTokens));
        assert.equal(b!.rewardFailure, 'threw on "␀"');
        await store.recordValGenerations([
          {
            runId,
            step: 0,
            idx: 0,
            prompt: 'x\u0000',
            response: '\u0000',
            groundTruth: '\u0000',
            reward: 1,
            rewardFailure: null,
          },
        ]);
        const [g] = await store.getValGenerations(runId);
        assert.deepEqual([g!.prompt, g!.response, g!.groundTruth], ['x␀', '␀', '␀']);
      });

      it('stores NaN, ±Infinity, float32 extremes and plain JS arrays in real[] columns', async () => {
        const runId = await newRun();
        const special = [
          NaN,
          Infinity,
          -Infinity,
          0,
          -0.5,
          3.4028234663852886e38,
          -3.4028234663852886e38,
          1.401298464324817e-45,
          1e-40,
          0.1,
          -1 / 3,
          123456.789,
        ];
        const n = special.length;
        const tokens = Array.from({ length: n }, (_, k) => [0, 1, 2147483647, -2147483648][k % 4]!);
        const row = trajectory(runId, 0, {
          responseTokens: tokens,
          behaviourLogprobs: special, // plain array of doubles: stored as the nearest float32
          refLogprobs: Float32Array.from(special).reverse(),
          oldLogprobs: special.map((x) => x / 2),
          advantages: new Float64Array(special),
          returns: special.map(() => NaN),
          advantage: NaN,
        });
        const empty = trajectory(runId, 1, {
          responseTokens: [],
          behaviourLogprobs: [],
          refLogprobs: [],
          advantages: null,
          promptTokens: [],
        });
        await store.insertTrajectories([row, empty]);
        const [a, b] = await store.getTrajectories(runId);
        assertSameTrajectory(a, row);
        assertSameTrajectory(b, empty);
        assert.deepEqual(a!.responseTokens, tokens);
        assert.ok(Number.isNaN(a!.advantage));
        assertFloat32Array(a!.behaviourLogprobs, Float32Array.from(special), 'behaviour as float32');
      });

      it('keeps a failed reward as NULL with its reason, never as 0', async () => {
        const runId = await newRun();
        const failed = trajectory(runId, 0, {
          reward: null,
          rewardDetails: null,
          rewardFailure: 'scorer raised ValueError: bad answer format',
        });
        const zero = trajectory(runId, 1, { reward: 0, rewardFailure: null });
        await store.insertTrajectories([failed, zero]);
        const stored = await store.getTrajectories(runId);
        assert.deepEqual(
          stored.map((s) => [s.reward, s.rewardFailure]),
          [
            [null, 'scorer raised ValueError: bad answer format'],
            [0, null],
          ],
        );
        const { rows } = await sql<{
          n: number;
        }>`select count(*)::int as n from trajectories where run_id = ${runId} and reward is null and reward_failure is not null`.execute(
          database.db,
        );
        assert.equal(rows[0]!.n, 1);
      });

      it('rejects bad rows with a message naming the row and field, writing none of the batch', async () => {
        const runId = await newRun();
        const good = trajectory(runId, 0);
        const cases: [Partial<TrajectoryRow>, RegExp][] = [
          [{ reward: null, rewardFailure: null }, /reward is null but rewardFailure does not say why/],
          [{ reward: NaN }, /reward must be a finite number/],
          [{ reward: 1, rewardFailure: 'both' }, /rewardFailure must be null when a reward is given/],
          [{ behaviourLogprobs: [0.1] }, /behaviourLogprobs has 1 values but the response has 12 tokens/],
          [{ refLogprobs: [...new Array(11).fill(0), 'x' as never] }, /refLogprobs\[11\] must be a number/],
          [{ advantages: new Array(12).fill(1e39) }, /advantages\[0\] 1e\+39 is outside the range of real/],
          [{ promptTokens: [1, 2.5] }, /promptTokens\[1\] must be an int32 integer/],
          [{ responseTokens: [2 ** 31, ...new Array(11).fill(1)] }, /responseTokens\[0\] must be an int32 integer/],
          [{ groupUid: 'nul \u0000 uid' }, /groupUid contains a NUL character \(U\+0000\), which an id cannot hold/],
          [{ kind: 'test' as never }, /kind must be 'train' or 'val'/],
          [{ step: -1 }, /step must be an integer/],
          [{ filtered: true, filterReason: null }, /filterReason is required when filtered is true/],
          [{ id: '' }, /id must be a non-empty string/],
          [{ rewardDetails: { big: 1n } as never }, /rewardDetails is not JSON-serialisable/],
        ];
        for (const [over, message] of cases) {
          const bad = { ...trajectory(runId, 1), ...over };
          await assert.rejects(store.insertTrajectories([good, bad]), (e: unknown) => {
            assert.ok(e instanceof RlError && e.code === 'ERR_BAD_TRAJECTORY' && !e.retriable, String(e));
            assert.match(e.message, message);
            if (over.id !== '') assert.ok(e.message.includes(JSON.stringify(bad.id)), `names the row: ${e.message}`);
            return true;
          });
        }
        assert.equal(await store.countTrajectories(runId), 0);
      });

      it('refuses rows of an unregistered run with a clear, non-retriable error', async () => {
        const runId = `${prefix}-unregistered`;
        await assert.rejects(store.insertTrajectories([trajectory(runId, 0)]), (e: unknown) => {
          assert.ok(e instanceof RlError && e.code === 'ERR_UNKNOWN_RUN' && !e.retriable, String(e));
          assert.match(e.message, /call upsertRun first/);
          return true;
        });
      });

      it('the array-parameter (unnest) path stores exactly what the COPY path stores', async () => {
        const runId = await newRun();
        const special = [NaN, -Infinity, 0.1, -1 / 3, 1e-40, 3.4028234663852886e38];
        const base = (i: number) =>
          trajectory(runId, i, {
            promptText: 'tab\t "quote" \\ back {brace} 日本 🙂',
            responseText: 'line\nNULL',
            groundTruth: null,
            responseTokens: [1, -2, 3, 4, 5, 6],
            behaviourLogprobs: special,
            refLogprobs: special.map((x) => x / 3),
            advantages: [0, 0, 0, 0, 0, 0],
          });
        const viaCopy = base(0);
        const viaUnnest = { ...base(0), id: `${base(0).id}-unnest` };
        await store.insertTrajectories([viaCopy]);
        const inserted = await database.db
          .transaction()
          .execute((tx) => unnestTrajectories(tx, [viaUnnest, viaUnnest, viaCopy]));
        assert.equal(inserted, 1);
        const [a, b] = await store
          .getTrajectories(runId, { ids: [viaCopy.id, viaUnnest.id] })
          .then((r) => r.sort((x, y) => x.id.length - y.id.length));
        assertSameTrajectory(a, viaCopy);
        assertSameTrajectory(b, viaUnnest);
        assert.deepEqual({ ...a, id: '', createdAt: null }, { ...b, id: '', createdAt: null });
      });

      it('is SQL-friendly: per-token arrays unnest side by side', async () => {
        const runId = await newRun();
        await store.insertTrajectories([trajectory(runId, 0), trajectory(runId, 1)]);
        const { rows } = await sql<{ n: number; tokens: number; kl: number }>`
          select count(*)::int as n, count(distinct tok)::int as tokens, sum(b - r)::float8 as kl
          from trajectories t, unnest(t.response_tokens, t.behaviour_logprobs, t.ref_logprobs) as u(tok, b, r)
          where t.run_id = ${runId}`.execute(database.db);
        assert.equal(rows[0]!.n, 24);
        assert.ok(Math.abs(rows[0]!.kl - 24 * 0.125) < 1e-4, `sum of (behaviour - ref) = ${rows[0]!.kl}`);
      });
    });

    describe('metrics', () => {
      it('upserts by (run, step, name): the last write wins, NaN is kept', async () => {
        const runId = await newRun();
        await store.insertMetrics([
          { runId, step: 0, name: 'actor/pg_loss', value: 0.5, stage: 'update' },
          { runId, step: 1, name: 'actor/pg_loss', value: 0.25, stage: 'update' },
          { runId, step: 0, name: 'reward/mean', value: 0.1 },
          { runId, step: 0, name: 'reward/mean', value: 0.2 }, // repeated in one call: last wins
        ]);
        await store.insertMetrics([
          { runId, step: 1, name: 'actor/pg_loss', value: NaN, stage: 'update' },
          { runId, step: 2, name: 'critic/vf_loss', value: -Infinity },
        ]);
        const all = await store.getMetrics(runId);
        assert.deepEqual(
          all.map((m) => [m.name, m.step, m.value, m.stage]),
          [
            ['actor/pg_loss', 0, 0.5, 'update'],
            ['actor/pg_loss', 1, NaN, 'update'],
            ['critic/vf_loss', 2, -Infinity, null],
            ['reward/mean', 0, 0.2, null],
          ],
        );
        assert.deepEqual(
          (await store.getMetrics(runId, ['reward/mean'])).map((m) => m.value),
          [0.2],
        );
        assert.deepEqual(await store.getMetrics(runId, []), []);
        await assert.rejects(
          store.insertMetrics([{ runId, step: 1.5, name: 'x', value: 1 }]),
          rejectsWith('ERR_BAD_ROW', /step must be an integer/),
        );
        await assert.rejects(
          store.insertMetrics([{ runId, step: 1, name: 'x', value: 1, agg: 'median' as never }]),
          rejectsWith('ERR_BAD_ROW', /agg must be one of sum, max, min, mean, last/),
        );
        await assert.rejects(
          store.insertMetrics([{ runId, step: 1, name: 'x', value: 1, agg: 'mean', weight: -1 }]),
          rejectsWith('ERR_BAD_ROW', /weight must be a finite number ≥ 0/),
        );
      });

      it("keeps each replica's partial and combines them on read (sum, max, weighted mean)", async () => {
        const runId = await newRun();
        const r = (
          replica: string,
          name: string,
          value: number,
          extra: Partial<import('../../lib/store/port.ts').MetricRow> = {},
        ) => ({ runId, step: 3, name, value, stage: 'rollout', replica, ...extra });
        // two rollout replicas write the same names for step 3, in separate calls (separate processes)
        await store.insertMetrics([
          r('0', 'perf/rollout_tokens', 100, { agg: 'sum', increment: true }),
          r('0', 'perf/step_time_s/rollout', 2, { agg: 'max', increment: true }),
          r('0', 'timing/rollout/generate_s', 1.5, { agg: 'max', increment: true }),
          r('0', 'x/error_rate', 0.5, { agg: 'mean', weight: 3 }),
        ]);
        await store.insertMetrics([
          r('1', 'perf/rollout_tokens', 40, { agg: 'sum', increment: true }),
          r('1', 'perf/step_time_s/rollout', 5, { agg: 'max', increment: true }),
          r('1', 'timing/rollout/generate_s', 4, { agg: 'max', increment: true }),
          r('1', 'x/error_rate', 0.1, { agg: 'mean', weight: 1 }),
        ]);
        // replica 0 goes on with step 3: its increments add to its own stored partial
        await store.insertMetrics([
          r('0', 'perf/rollout_tokens', 10, { agg: 'sum', increment: true }),
          r('0', 'perf/step_time_s/rollout', 4, { agg: 'max', increment: true }),
        ]);
        const got = Object.fromEntries(
          (await store.getMetrics(runId)).map((m) => [m.name, [m.value, m.parts, m.stage]]),
        );
        assert.deepEqual(got['perf/rollout_tokens'], [150, 2, 'rollout']);
        assert.deepEqual(got['perf/step_time_s/rollout'], [6, 2, 'rollout']); // max(2 + 4, 5)
        assert.deepEqual(got['timing/rollout/generate_s'], [4, 2, 'rollout']);
        assert.ok(
          Math.abs((got['x/error_rate']![0] as number) - (0.5 * 3 + 0.1) / 4) < 1e-12,
          `weighted mean ${got['x/error_rate']![0]}`,
        );
        // the analysis views read the combined values
        const { rows: times } = await sql<{
          step_time_s: number;
          compute_s: number | null;
        }>`select step_time_s, compute_s from v_step_times where run_id = ${runId} and stage = 'rollout'`.execute(
          database.db,
        );
        assert.deepEqual(times, [{ step_time_s: 6, compute_s: null }]);
        const { rows: wide } = await sql<{
          rollout_s: number;
        }>`select rollout_s from v_step_metrics_wide where run_id = ${runId}`.execute(database.db);
        assert.deepEqual(wide, [{ rollout_s: 6 }]);
        const { rows: parts } = await sql<{
          n: number;
        }>`select count(*)::int as n from step_metric_parts where run_id = ${runId}`.execute(database.db);
        assert.equal(parts[0]!.n, 8);
      });

      it("increments in one call add up; a writer's last set value wins; disagreeing aggs fall back to the latest partial", async () => {
        const runId = await newRun();
        await store.insertMetrics([
          { runId, step: 0, name: 'reward/failures', value: 1, stage: 'reward', agg: 'sum', increment: true },
          { runId, step: 0, name: 'reward/failures', value: 2, stage: 'reward', agg: 'sum', increment: true },
          { runId, step: 0, name: 'kl/coef', value: 0.1, stage: 'advantage' },
        ]);
        await store.insertMetrics([
          { runId, step: 0, name: 'kl/coef', value: 0.3, stage: 'advantage' },
          { runId, step: 0, name: 'reward/failures', value: 4, stage: 'reward', agg: 'sum', increment: true },
        ]);
        await store.insertMetrics([{ runId, step: 1, name: 'odd', value: 1, stage: 'a', agg: 'sum' }]);
        await new Promise((r) => setTimeout(r, 5));
        await store.insertMetrics([{ runId, step: 1, name: 'odd', value: 7, stage: 'b', agg: 'max' }]);
        assert.deepEqual(
          (await store.getMetrics(runId)).map((m) => [m.name, m.step, m.value, m.stage]),
          [
            ['kl/coef', 0, 0.3, 'advantage'],
            ['odd', 1, 7, 'a,b'],
            ['reward/failures', 0, 7, 'reward'],
          ],
        );
      });
    });

    describe('checkpoints', () => {
      const sha = (c: string) => c.repeat(64);
      it('records, replaces a re-written step, lists ascending and returns the latest', async () => {
        const runId = await newRun();
        assert.equal(await store.latestCheckpoint(runId), undefined);
        const base = { runId, path: '/ckpt', policyVersion: 1, consumedOffsets: { 'rollouts/0': 10 } };
        await store.recordCheckpoint({
          ...base,
          step: 10,
          sha256: sha('a'),
          rngState: [1, 2, 3, 4],
          lrState: { lr: 1e-6, step: 10 },
          datasetPosition: { epoch: 0, index: 640 },
          klCtlState: { coef: 0.05 },
        });
        await store.recordCheckpoint({
          ...base,
          step: 20,
          sha256: sha('b'),
          policyVersion: 2,
          consumedOffsets: { 'rollouts/0': 20, 'rewards/1': 7 },
        });
        await store.recordCheckpoint({ ...base, step: 5, sha256: sha('c') });
        const latest = await store.latestCheckpoint(runId);
        assert.equal(latest?.step, 20);
        assert.equal(latest?.sha256, sha('b'));
        assert.deepEqual(latest?.consumedOffsets, { 'rollouts/0': 20, 'rewards/1': 7 });
        assert.equal(latest?.rngState, null);
        const list = await store.listCheckpoints(runId);
        assert.deepEqual(
          list.map((c) => c.step),
          [5, 10, 20],
        );
        assert.deepEqual(list[1]!.rngState, [1, 2, 3, 4]);
        assert.deepEqual(list[1]!.lrState, { lr: 1e-6, step: 10 });
        assert.deepEqual(list[1]!.datasetPosition, { epoch: 0, index: 640 });
        assert.deepEqual(list[1]!.klCtlState, { coef: 0.05 });
        // The update stage re-wrote step 20 after a crash: the row follows the file.
        await store.recordCheckpoint({ ...base, step: 20, sha256: sha('d'), policyVersion: 2, path: '/ckpt2' });
        assert.equal((await store.latestCheckpoint(runId))?.sha256, sha('d'));
        assert.equal((await store.listCheckpoints(runId)).length, 3);
        // inside a transaction the list includes the transaction's own, uncommitted row
        await database.db
          .transaction()
          .execute(async (tx) => {
            await store.recordCheckpoint({ ...base, step: 40, sha256: sha('e') }, { tx });
            assert.deepEqual(
              (await store.listCheckpoints(runId, { tx })).map((c) => c.step),
              [5, 10, 20, 40],
            );
            throw new Error('roll back');
          })
          .catch((e: Error) => assert.equal(e.message, 'roll back'));
        assert.equal((await store.listCheckpoints(runId)).length, 3);
        await assert.rejects(
          store.recordCheckpoint({ ...base, step: 30, sha256: 'ABC' }),
          rejectsWith('ERR_BAD_ROW', /sha256 must be 64 lower-case hex/),
        );
      });
    });

    describe('prompt images', () => {
      const png = (seed: number) => Buffer.from(Array.from({ length: 40 + seed }, (_, i) => (i * 31 + seed * 7) & 255));
      const img = (runId: string, seed: number) => {
        const b = png(seed);
        return {
          runId,
          hash: createHash('sha256').update(b).digest('hex'),
          width: 28 * (1 + seed),
          height: 56,
          png: b,
        };
      };

      it('stores each distinct image once per run; trajectories reference them by hash and SQL joins them', async () => {
        const runId = await newRun();
        const other = await newRun();
        const [a, b] = [img(runId, 1), img(runId, 2)];
        assert.equal(await store.insertPromptImages([a, b, a]), 2);
        // offered again (the prompt emitted at a later step), in a transaction, and for another run
        assert.equal(
          await database.db.transaction().execute((tx) => store.insertPromptImages([a, { ...b, width: 999 }], { tx })),
          0,
        );
        assert.equal(await store.insertPromptImages([{ ...a, runId: other }]), 1);
        const stored = await store.getPromptImages(runId);
        assert.deepEqual(
          stored.map(({ createdAt: _c, ...x }) => x),
          [a, b].sort((x, y) => (x.hash < y.hash ? -1 : 1)),
        );
        assert.ok(stored.every((x) => x.createdAt instanceof Date && Buffer.isBuffer(x.png)));
        assert.deepEqual(
          (await store.getPromptImages(runId, [b.hash])).map((x) => x.width),
          [b.width],
        );
        assert.deepEqual(await store.getPromptImages(runId, []), []);
        // trajectories name their prompt's images (text prompts have none) and an image policy's generated one
        const rows = [
          trajectory(runId, 0, { imageHashes: [a.hash], generatedImageHash: b.hash }),
          trajectory(runId, 1, { imageHashes: [b.hash, a.hash], generatedImageHash: a.hash }),
          trajectory(runId, 2),
        ];
        // both write paths: COPY (insertTrajectories) and the array parameters (unnest)
        await store.insertTrajectories([rows[0]!, rows[2]!]);
        await database.db.transaction().execute((tx) => unnestTrajectories(tx, [rows[1]!]));
        const back = new Map((await store.getTrajectories(runId)).map((t) => [t.id, t]));
        for (const r of rows) assertSameTrajectory(back.get(r.id), r);
        assert.deepEqual(back.get(rows[2]!.id)!.imageHashes, []);
        assert.equal(back.get(rows[2]!.id)!.generatedImageHash, null);
        const { rows: joined } = await sql<{ id: string; ord: number; width: number; bytes: number }>`
          select t.id, h.ord::int as ord, i.width, length(i.png)::int as bytes
          from trajectories t cross join lateral unnest(t.image_hashes) with ordinality as h(hash, ord)
          join prompt_images i on i.run_id = t.run_id and i.hash = h.hash
          where t.run_id = ${runId} order by t.id, h.ord`.execute(database.db);
        assert.deepEqual(
          joined.map((r) => [r.id, r.ord, r.width, r.bytes]),
          [
            [rows[0]!.id, 1, a.width, a.png.length],
            [rows[1]!.id, 1, b.width, b.png.length],
            [rows[1]!.id, 2, a.width, a.png.length],
          ],
        );
      });

      it('refuses a hash that is not the sha256 of the bytes, bad sizes and bad trajectory hashes, writing nothing', async () => {
        const runId = await newRun();
        const a = img(runId, 3);
        await assert.rejects(
          store.insertPromptImages([a, { ...img(runId, 4), hash: a.hash }]),
          rejectsWith('ERR_BAD_ROW', /its png bytes hash to/),
        );
        await assert.rejects(
          store.insertPromptImages([{ ...a, hash: 'ABC' }]),
          rejectsWith('ERR_BAD_ROW', /lower-case hex sha256/),
        );
        await assert.rejects(store.insertPromptImages([{ ...a, width: 0 }]), rejectsWith('ERR_BAD_ROW'));
        assert.deepEqual(await store.getPromptImages(runId), []);
        await assert.rejects(
          store.insertTrajectories([trajectory(runId, 0, { imageHashes: ['nothex'] })]),
          rejectsWith('ERR_BAD_TRAJECTORY', /imageHashes\[0\] must be a lower-case hex sha256, got "nothex"/),
        );
        await assert.rejects(
          store.insertTrajectories([trajectory(runId, 0, { generatedImageHash: 'nothex' })]),
          rejectsWith('ERR_BAD_TRAJECTORY', /generatedImageHash must be a lower-case hex sha256 or null, got "nothex"/),
        );
      });
    });

    describe('VPPO columns', () => {
      it('store the perturbed log-probs, token mask, scaling factor and entropies on both write paths; null without VPPO; SQL reads them', async () => {
        const runId = await newRun();
        const base = trajectory(runId, 0);
        const L = base.responseTokens.length;
        assert.ok(L >= 2);
        const lp = Float32Array.from({ length: L }, (_, t) => -0.25 * (t + 1) - 1e-3);
        const mask = Array.from({ length: L }, (_, t) => t % 2 === 1);
        const rows = [
          {
            ...base,
            vppoPerturbedLogprobs: lp,
            vppoTokenMask: mask,
            vppoScalingFactor: 1.2345678901,
            vppoEntropies: Float32Array.from({ length: L }, (_, t) => 0.5 + t / 7),
          },
          {
            ...trajectory(runId, 1),
            vppoPerturbedLogprobs: Array.from(lp),
            vppoTokenMask: Uint8Array.from(mask, (x) => (x ? 1 : 0)),
            vppoScalingFactor: 0,
            vppoEntropies: Array.from({ length: L }, () => 0),
          },
          trajectory(runId, 2),
        ];
        await store.insertTrajectories([rows[0]!, rows[2]!]);
        await database.db.transaction().execute((tx) => unnestTrajectories(tx, [rows[1]!]));
        const back = new Map((await store.getTrajectories(runId)).map((t) => [t.id, t]));
        for (const r of rows) assertSameTrajectory(back.get(r.id), r);
        const none = back.get(rows[2]!.id)!;
        assert.deepEqual(
          [none.vppoPerturbedLogprobs, none.vppoTokenMask, none.vppoScalingFactor, none.vppoEntropies],
          [null, null, null, null],
        );
        const { rows: kept } = await sql<{ id: string; kept: number; alpha: number }>`
          select id, (select count(*) from unnest(vppo_token_mask) k where k)::int as kept, vppo_scaling_factor as alpha
          from trajectories where run_id = ${runId} and vppo_token_mask is not null order by id`.execute(database.db);
        assert.deepEqual(
          kept.map((r) => [r.id, r.kept, r.alpha]),
          [
            [rows[0]!.id, Math.floor(L / 2), 1.2345678901],
            [rows[1]!.id, Math.floor(L / 2), 0],
          ],
        );
      });

      it('refuses masks and log-probs of the wrong length, non-boolean masks and bad factors, writing nothing', async () => {
        const runId = await newRun();
        const base = trajectory(runId, 0);
        const L = base.responseTokens.length;
        await assert.rejects(
          store.insertTrajectories([{ ...base, vppoTokenMask: [true] }]),
          rejectsWith('ERR_BAD_TRAJECTORY', new RegExp(`vppoTokenMask has 1 values but the response has ${L} tokens`)),
        );
        await assert.rejects(
          store.insertTrajectories([{ ...base, vppoPerturbedLogprobs: [0] }]),
          rejectsWith('ERR_BAD_TRAJECTORY', /vppoPerturbedLogprobs has 1 values/),
        );
        await assert.rejects(
          store.insertTrajectories([{ ...base, vppoEntropies: [0] }]),
          rejectsWith('ERR_BAD_TRAJECTORY', /vppoEntropies has 1 values/),
        );
        await assert.rejects(
          store.insertTrajectories([
            { ...base, vppoTokenMask: Array.from({ length: L }, () => 2) as unknown as boolean[] },
          ]),
          rejectsWith('ERR_BAD_TRAJECTORY', /vppoTokenMask\[0\] must be a boolean/),
        );
        await assert.rejects(
          store.insertTrajectories([{ ...base, vppoScalingFactor: -1 }]),
          rejectsWith('ERR_BAD_TRAJECTORY', /vppoScalingFactor must be a finite number ≥ 0/),
        );
        await assert.rejects(
          store.insertTrajectories([{ ...base, vppoScalingFactor: NaN }]),
          rejectsWith('ERR_BAD_TRAJECTORY', /vppoScalingFactor/),
        );
        assert.deepEqual(await store.getTrajectories(runId), []);
      });
    });

    describe('multi-turn episodes', () => {
      it('stores episodes and their turns once per (run, trajectory); the SQL views summarise them', async () => {
        const runId = await newRun();
        const turn = (role: string, start: number, end: number, text: string, more: Record<string, unknown> = {}) => ({
          role,
          start,
          end,
          text,
          tool_name: null,
          arguments: null,
          latency_ms: 0,
          error: null,
          reward: 0,
          ...more,
        });
        const episodes = [
          {
            runId,
            trajectoryId: `${runId}/train/s1/p0/n0`,
            step: 1,
            kind: 'train' as const,
            policyVersion: 0,
            responseTokens: 9,
            episode: {
              turns: [
                turn('assistant', 0, 4, '<tool_call>{}</tool_call>', { latency_ms: 12.5 }),
                turn('tool', 4, 6, '84', { tool_name: 'calc', arguments: '{"e": "12*7"}', latency_ms: 3 }),
                turn('assistant', 6, 8, 'it is 84 🙂'),
                turn('user', 8, 9, 'correct', { reward: 1, latency_ms: 1 }),
              ],
              assistant_turns: 2,
              reward: 1,
              done: true,
              failure: null,
              timed_out: false,
              tool_calls: 1,
              tool_errors: 0,
              metrics: {},
            },
          },
          {
            runId,
            trajectoryId: `${runId}/train/s1/p0/n1`,
            step: 1,
            kind: 'train' as const,
            policyVersion: 0,
            responseTokens: 3,
            episode: {
              turns: [
                turn('assistant', 0, 3, '<tool_call>'),
                turn('tool', 3, 3, 'malformed tool call', { tool_name: 'calc', error: 'bad JSON', latency_ms: 0 }),
                turn('system', 3, 3, '', { error: 'timeout: no answer within 10 ms', latency_ms: 10 }),
              ],
              assistant_turns: 1,
              reward: 0,
              done: false,
              failure: 'timeout: no answer within 10 ms',
              timed_out: true,
              tool_calls: 1,
              tool_errors: 1,
              metrics: {},
            },
          },
        ];
        await store.insertEpisodes(episodes);
        await store.insertEpisodes(episodes.map((e) => ({ ...e, episode: { ...e.episode, reward: 5 } })));
        const back = await store.getEpisodes(runId, 1);
        assert.deepEqual(back, episodes);
        const q = async (text: string) => (await sql.raw(text).execute(database.db)).rows as Array<Record<string, any>>;
        const eps = await q(
          `select trajectory_id, outcome, tool_calls, tool_errors, env_messages, failure from v_episodes where run_id = '${runId}' order by trajectory_id`,
        );
        assert.deepEqual(
          eps.map((r) => [r.outcome, Number(r.tool_calls), Number(r.tool_errors), Number(r.env_messages)]),
          [
            ['done', 1, 0, 2],
            ['failed', 1, 1, 2],
          ],
        );
        const tools = await q(
          `select step, tool_name, calls, errors from v_tool_usage_by_step where run_id = '${runId}'`,
        );
        assert.deepEqual(
          tools.map((r) => [r.step, r.tool_name, Number(r.calls), Number(r.errors)]),
          [[1, 'calc', 2, 1]],
        );
        const byTurns = await q(
          `select assistant_turns, episodes, reward_mean from v_reward_by_turns where run_id = '${runId}'`,
        );
        assert.deepEqual(
          byTurns.map((r) => [r.assistant_turns, Number(r.episodes), Number(r.reward_mean)]),
          [[2, 1, 1]],
        );
      });
    });

    describe('validation generations and dead letters', () => {
      it('records validation generations once per (run, step, idx)', async () => {
        const runId = await newRun();
        const gens = [
          {
            runId,
            step: 10,
            idx: 0,
            prompt: 'p0\t',
            response: 'r0 🙂',
            groundTruth: '1',
            reward: 1,
            rewardFailure: null,
          },
          {
            runId,
            step: 10,
            idx: 1,
            prompt: 'p1',
            response: 'r1',
            groundTruth: null,
            reward: null,
            rewardFailure: 'timeout',
          },
          { runId, step: 20, idx: 0, prompt: 'p0', response: 'r0b', groundTruth: '1', reward: 0, rewardFailure: null },
        ];
        await store.recordValGenerations(gens);
        await store.recordValGenerations(gens.map((g) => ({ ...g, response: 'again' })));
        const at10 = await store.getValGenerations(runId, 10);
        assert.deepEqual(
          at10.map(({ createdAt: _c, ...g }) => g),
          gens.slice(0, 2),
        );
        assert.equal((await store.getValGenerations(runId)).length, 3);
        await assert.rejects(
          store.recordValGenerations([{ ...gens[0]!, idx: 5, reward: null, rewardFailure: null }]),
          rejectsWith('ERR_BAD_ROW', /rewardFailure does not say why/),
        );
      });

      it('records a dead letter once per (stage, topic, partition, offset), payload intact', async () => {
        const runId = await newRun();
        const stage = `${prefix}-reward`;
        const payload = Uint8Array.from([0, 1, 2, 255, 0, 10, 13, 92]);
        const row = {
          stage,
          topic: 'rollouts',
          partition: 3,
          offset: 2 ** 40,
          runId,
          reason: 'undecodable Avro: unexpected end',
          errorCode: 'ERR_POISON',
          payload,
        };
        await store.recordDeadLetter(row);
        await store.recordDeadLetter({ ...row, reason: 'redelivered' });
        await store.recordDeadLetter({
          ...row,
          offset: 7,
          runId: null,
          payload: null,
          errorCode: null,
          reason: 'no run \u0000 id',
        });
        const list = await store.listDeadLetters({ stage });
        assert.equal(list.length, 2);
        const big = list.find((d) => d.offset === 2 ** 40)!;
        assert.equal(big.reason, 'undecodable Avro: unexpected end');
        assert.deepEqual([...big.payload!], [...payload]);
        const orphan = list.find((d) => d.offset === 7)!;
        assert.equal(orphan.runId, null);
        assert.equal(orphan.payload, null);
        assert.equal(orphan.reason, 'no run \\u0000 id');
        assert.equal((await store.listDeadLetters({ runId })).length, 1);
        assert.equal((await store.listDeadLetters({ stage, topic: 'other' })).length, 0);
      });
    });

    describe('transactions', () => {
      async function writeAll(runId: string, tx: Tx, i0: number): Promise<void> {
        await store.insertTrajectories([trajectory(runId, i0), trajectory(runId, i0 + 1)], { tx });
        await store.insertMetrics([{ runId, step: i0, name: 'reward/mean', value: 1 }], { tx });
        await store.recordCheckpoint(
          { runId, step: i0, path: '/c', sha256: 'e'.repeat(64), policyVersion: 0, consumedOffsets: {} },
          { tx },
        );
        await store.recordValGenerations(
          [{ runId, step: i0, idx: 0, prompt: 'p', response: 'r', groundTruth: null, reward: 1, rewardFailure: null }],
          { tx },
        );
        await store.recordDeadLetter(
          { stage: `${prefix}-tx`, topic: runId, partition: 0, offset: i0, runId, reason: 'x', payload: null },
          { tx },
        );
        await store.setRunStatus(runId, 'completed', { i0 }, { tx });
      }

      it('commits every write of a batch together', async () => {
        const runId = await newRun();
        await database.db.transaction().execute((tx) => writeAll(runId, tx, 0));
        assert.equal(await store.countTrajectories(runId), 2);
        assert.equal((await store.getMetrics(runId)).length, 1);
        assert.equal((await store.listCheckpoints(runId)).length, 1);
        assert.equal((await store.getValGenerations(runId)).length, 1);
        assert.equal((await store.listDeadLetters({ topic: runId })).length, 1);
        assert.equal((await store.getRun(runId))?.status, 'completed');
      });

      it('rolls every write back when the transaction throws', async () => {
        const runId = await newRun();
        await assert.rejects(
          database.db.transaction().execute(async (tx) => {
            await writeAll(runId, tx, 0);
            throw new Error('stage crashed before committing its offsets');
          }),
          /stage crashed/,
        );
        assert.equal(await store.countTrajectories(runId), 0);
        assert.equal((await store.getMetrics(runId)).length, 0);
        assert.equal((await store.listCheckpoints(runId)).length, 0);
        assert.equal((await store.getValGenerations(runId)).length, 0);
        assert.equal((await store.listDeadLetters({ topic: runId })).length, 0);
        assert.equal((await store.getRun(runId))?.status, 'running');
        // Re-delivery after the crash writes the batch for real.
        await database.db.transaction().execute((tx) => writeAll(runId, tx, 0));
        assert.equal(await store.countTrajectories(runId), 2);
      });

      it("a write without tx does not join another caller's open transaction", async () => {
        const runId = await newRun();
        let outside: Promise<unknown> | undefined;
        await assert.rejects(
          database.db.transaction().execute(async (tx) => {
            await store.insertTrajectories([trajectory(runId, 0)], { tx });
            outside = store.insertTrajectories([trajectory(runId, 1), trajectory(runId, 2)]);
            // Give the outside write every chance to run before the rollback.
            for (let k = 0; k < 20; k++) await new Promise((r) => setImmediate(r));
            await store.insertTrajectories([trajectory(runId, 3)], { tx });
            throw new Error('abort');
          }),
          /abort/,
        );
        assert.deepEqual(await outside, { inserted: 2, duplicates: 0 });
        assert.deepEqual(
          (await store.getTrajectories(runId)).map((t) => t.id).sort(),
          [trajectory(runId, 1).id, trajectory(runId, 2).id].sort(),
        );
      });

      it('concurrent writers of the same ids store each row once', async () => {
        const runId = await newRun();
        const rows = Array.from({ length: 300 }, (_, i) => trajectory(runId, i));
        const results = await Promise.all([
          store.insertTrajectories(rows),
          store.insertTrajectories(rows.slice(100)),
          store.insertTrajectories(rows.slice(0, 200)),
        ]);
        assert.equal(
          results.reduce((s, r) => s + r.inserted, 0),
          300,
        );
        assert.equal(
          results.reduce((s, r) => s + r.duplicates, 0),
          300 + 200 + 200 - 300,
        );
        assert.equal(await store.countTrajectories(runId), 300);
      });
    });

    describe('lifecycle', () => {
      it('closing a store that shares the database leaves the database open; a closed store says so', async () => {
        const second = createStore(database);
        const runId = await newRun();
        assert.equal((await second.getRun(runId))?.runId, runId);
        await second.close();
        await second.close();
        await assert.rejects(second.getRun(runId), rejectsWith('ERR_CLOSED', /closed/));
        await assert.rejects(second.insertTrajectories([trajectory(runId, 0)]), rejectsWith('ERR_CLOSED'));
        assert.equal((await store.getRun(runId))?.runId, runId);
      });
    });
  });
}
