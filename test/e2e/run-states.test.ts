/**
 * `rlstream runs` for every way a run ends: finished, failed (with its reason), stopped (SIGTERM;
 * Ctrl-C in ctrl-c-breakers.test.ts), stale (SIGKILL: still marked running, its lock holder gone) — never "running" for a run that is
 * not. A start refused by the checks before it (an incomplete model directory) creates nothing; a
 * start that failed before its first step does not lock its config: the fixed rerun needs no
 * trainer.resume_with_changed_config.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { listRunsInDir } from '../../lib/analysis/runs.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const root = join(ROOT, 'test/.tmp', `run-states-${process.pid}`);
after(() => rmSync(root, { recursive: true, force: true }));
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
