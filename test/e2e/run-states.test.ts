/**
 * `rlstream runs` for every way a run ends: finished, failed (with its reason), stopped (SIGTERM;
 * Ctrl-C in ctrl-c-breakers.test.ts), stale (SIGKILL: still marked running, its lock holder gone) — never "running" for a run that is
 * not. A start refused by the checks before it (an incomplete model directory) creates nothing; a
 * start that failed before its first step does not lock its config: the fixed rerun needs no
 * trainer.resume_with_changed_config.
 *
 * The same over PostgreSQL (`rlstream runs --db`), judged by the stages' leases (stage_heartbeats):
 * the five stages as `rlstream serve` processes, every one SIGKILLed after step 1 → stale once the
 * leases ran out; started again → running; every one SIGTERMed → stopped. `rlstream train` over
 * PostgreSQL failing at start → failed with its reason. Finished over PostgreSQL, with stage
 * processes that were killed and rolled on the way: k8s-manifests.test.ts.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { listRunsInDatabase, listRunsInDir, stagesText, type RunSummary } from '../../lib/analysis/runs.ts';
import { openDatabase } from '../../lib/db/database.ts';
import { ROOT, freshDatabase, serveStage, type StageProc } from '../../devkit/pipeline-procs.ts';
import { STAGES } from '../../services/index.ts';

const root = join(ROOT, 'test/.tmp', `run-states-${process.pid}`);
const cleanups: Array<() => Promise<void>> = [];
const procs: StageProc[] = [];
after(async () => {
  for (const p of procs) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(root, { recursive: true, force: true });
});
const FIXTURE = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const tiny = (dir: string, runId: string, extra: string[] = []) =>
  loadConfig({
    file: FIXTURE,
    overrides: [`trainer.run_dir=${dir}`, `pipeline.run_id=${runId}`, ...extra],
    onWarning: () => undefined,
  });

test('an incomplete model directory is refused before anything is created, one line per problem', async () => {
  const model = join(root, 'partial-model');
  mkdirSync(model, { recursive: true });
  writeFileSync(join(model, 'config.json'), '{}');
  writeFileSync(
    join(model, 'model.safetensors.index.json'),
    '{"weight_map": {"a": "model-00001-of-00002.safetensors"}}',
  );
  const dir = join(root, 'refused', 'run');
  const err = await trainEmbedded(
    tiny(dir, 'refused', [
      `actor.model.path=${model}`,
      'data.task=null',
      'actor.model.tokenizer=byte',
      `data.train_files=${join(root, 'nope.parquet')}`,
    ]),
    silentLogger('refused'),
  ).then(
    () => null,
    (e: unknown) => e as Error,
  );
  assert.ok(err);
  const lines = err.message.split('\n');
  assert.ok(
    lines.some((l) => /^actor\.model\.path: .* lacks 1 of the shards .*model-00001-of-00002/.test(l)),
    err.message,
  );
  assert.ok(
    lines.some((l) => /^data\.train_files: .*nope\.parquet does not exist/.test(l)),
    err.message,
  );
  assert.equal(existsSync(join(root, 'refused')), false, 'no run directory was created');
});

test(
  'failed with its reason, then the fixed rerun (another model path) is finished without resume_with_changed_config',
  { timeout: 120_000 },
  async () => {
    const runs = join(root, 'runs-f');
    const bad = join(root, 'bad-weights');
    mkdirSync(bad, { recursive: true });
    writeFileSync(join(bad, 'config.json'), '{"model_type": "llama"}');
    writeFileSync(join(bad, 'model.safetensors'), Buffer.alloc(64, 7));
    const err = await trainEmbedded(
      tiny(join(runs, 'a'), 'fail-then-fix', [`actor.model.path=${bad}`]),
      silentLogger('f'),
    ).then(
      () => null,
      (e: unknown) => e as Error,
    );
    assert.ok(err, 'the run fails at start');
    let [row] = await listRunsInDir(runs);
    assert.equal(row!.status, 'failed');
    assert.equal(row!.error, err.message);
    const out = await trainEmbedded(
      tiny(join(runs, 'a'), 'fail-then-fix', ['actor.model.path=null', 'trainer.max_steps=1']),
      silentLogger('f'),
    );
    assert.equal(out.status, 'completed', out.message);
    [row] = await listRunsInDir(runs);
    assert.equal(row!.status, 'finished');
    assert.equal(row!.error, null);
  },
);

/** `rlstream train` as a process, signalled once it has trained its first step. */
async function trainThenSignal(dir: string, runId: string, signal: NodeJS.Signals): Promise<number | null> {
  const child = spawn(
    process.execPath,
    [
      join(ROOT, 'bin/rlstream.mjs'),
      'train',
      FIXTURE,
      `trainer.run_dir=${dir}`,
      `pipeline.run_id=${runId}`,
      'trainer.max_steps=3',
    ],
    { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, RLSTREAM_LOG_LEVEL: 'info' } },
  );
  const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
  let err = '';
  await new Promise<void>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`no step within 150 s:\n${err.slice(-2000)}`)), 150_000);
    child.stderr!.on('data', (b: Buffer) => {
      err += b.toString();
      if (err.includes('"step 1 trained"')) {
        clearTimeout(t);
        resolve();
      }
    });
    child.once('exit', () => reject(new Error(`exited before its first step:\n${err.slice(-2000)}`)));
  });
  child.kill(signal);
  return exited;
}

test('SIGTERM: stopped; SIGKILL: stale once its lock holder is gone', { timeout: 240_000 }, async () => {
  const runs = join(root, 'runs-s');
  // both at once (each mostly waits on its own start)
  const [code] = await Promise.all([
    trainThenSignal(join(runs, 'term'), 'term', 'SIGTERM'),
    trainThenSignal(join(runs, 'kill'), 'kill', 'SIGKILL'),
  ]);
  assert.equal(code, 143);
  const rows = await listRunsInDir(runs);
  const by = Object.fromEntries(rows.map((r) => [r.runId, r]));
  assert.equal(by.term!.status, 'stopped');
  assert.equal(by.kill!.status, 'stale');
  assert.match(by.kill!.note!, /its process \(PID \d+.*\) is gone/);
});

/** The run as `rlstream runs --db` lists it. */
async function pgRun(url: string, runId: string): Promise<RunSummary | undefined> {
  const database = await openDatabase({ kind: 'postgres', url, poolSize: 1 }, { migrate: false });
  try {
    return (await listRunsInDatabase(database, null, runId))[0];
  } finally {
    await database.close();
  }
}

async function until<T>(what: string, ms: number, probe: () => Promise<T | undefined>, out: () => string): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await probe().catch(() => undefined);
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`no ${what} within ${ms / 1000} s:\n${out()}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

test(
  'over PostgreSQL, stages as processes: SIGKILL → stale, started again → running, SIGTERM → stopped; a failed start → failed',
  { timeout: 300_000 },
  async () => {
    const db = await freshDatabase(`rl_e2e_runstates_${process.pid}`);
    cleanups.push(db.drop);
    const runId = 'pg-states';
    const overrides = [
      `trainer.run_dir=${join(root, 'pg')}`,
      `pipeline.run_id=${runId}`,
      'trainer.max_steps=3',
      'pipeline.bus=embedded',
      'pipeline.store=postgres',
      `pipeline.database_url=${db.url}`,
      // tiny leases, so a killed run is stale within a second
      'pipeline.heartbeat_seconds=0.2',
      'pipeline.lease_seconds=0.8',
    ];
    const startAll = () => {
      const now = STAGES.map((s) => serveStage(s, 0, FIXTURE, overrides));
      procs.push(...now);
      return now;
    };
    const outputs = (ps: StageProc[]) => ps.map((p) => `--- ${p.stage}\n${p.output().slice(-1500)}`).join('\n');

    // every stage SIGKILLed after step 1: stale once every lease ran out
    let ps = startAll();
    await until(
      'step 1',
      150_000,
      async () => ((await pgRun(db.url, runId))?.lastStep ?? 0) >= 1 || undefined,
      () => outputs(ps),
    );
    for (const p of ps) p.child.kill('SIGKILL');
    await Promise.all(ps.map((p) => p.exit));
    const stale = await until(
      'stale',
      10_000,
      async () => {
        const r = await pgRun(db.url, runId);
        return r?.status === 'stale' ? r : undefined;
      },
      () => '',
    );
    assert.match(stale.note!, /no stage holds its lease: .*update \(.+:\d+\) last heartbeat \d+ s ago/);
    assert.equal(stale.stages.length, 5);
    assert.ok(
      stale.stages.every((s) => s.liveness === 'lost'),
      stagesText(stale.stages)!,
    );

    // started again: running (the stages hold their leases); every one SIGTERMed: stopped
    ps = startAll();
    await until(
      'running',
      60_000,
      async () => {
        const r = await pgRun(db.url, runId);
        return r?.status === 'running' && r.stages.filter((s) => s.liveness === 'live').length === 5 ? r : undefined;
      },
      () => outputs(ps),
    );
    for (const p of ps) p.child.kill('SIGTERM');
    const codes = await Promise.all(ps.map((p) => p.exit));
    assert.deepEqual(codes, [0, 0, 0, 0, 0], outputs(ps));
    const row = await pgRun(db.url, runId);
    assert.equal(row?.status, 'stopped', stagesText(row?.stages ?? []) ?? 'no heartbeat rows');
    assert.equal(
      stagesText(row!.stages),
      STAGES.map((s) => `${s} stopped`)
        .sort()
        .join(', '),
    );

    // rlstream train over PostgreSQL that fails at start (bad weights): failed, with the reason
    const bad = join(root, 'pg-bad-weights');
    mkdirSync(bad, { recursive: true });
    writeFileSync(join(bad, 'config.json'), '{"model_type": "llama"}');
    writeFileSync(join(bad, 'model.safetensors'), Buffer.alloc(64, 7));
    const err = await trainEmbedded(
      tiny(join(root, 'pg-fail'), 'pg-fail', [
        `actor.model.path=${bad}`,
        'pipeline.store=postgres',
        `pipeline.database_url=${db.url}`,
      ]),
      silentLogger('pg-fail'),
    ).then(
      () => null,
      (e: unknown) => e as Error,
    );
    assert.ok(err, 'the run fails at start');
    const failed = await pgRun(db.url, 'pg-fail');
    assert.equal(failed?.status, 'failed');
    assert.equal(failed?.error, err.message);
  },
);
