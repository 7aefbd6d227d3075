/**
 * A replay validates like training (val_before_train, val_freq, the last step), so it can be
 * compared with its source, and every log line carries the replay's own run id.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { replayRun } from '../../app/replay.ts';
import { createLogger, silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `replay-val-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

async function valAccuracy(dir: string, runId: string): Promise<Array<[number, number]>> {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    return (await store.getMetrics(runId, ['val/accuracy']))
      .map((m) => [m.step, m.value] as [number, number])
      .sort((a, b) => a[0] - b[0]);
  } finally {
    await store.close();
  }
}

test(
  'a replay runs the validation rounds of its source config and logs under its own run id',
  { timeout: 300_000 },
  async () => {
    mkdirSync(tmp, { recursive: true });
    const src = join(tmp, 'src');
    const val = ['data.task_size.val=4', 'trainer.val_before_train=true', 'trainer.val_freq=2', 'trainer.max_steps=4'];
    const r = await trainEmbedded(
      loadConfig({
        file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
        overrides: [`trainer.run_dir=${src}`, 'pipeline.run_id=rvsrc', ...val],
      }),
      silentLogger('rvsrc'),
    );
    assert.equal(r.status, 'completed', r.message);
    const want = await valAccuracy(src, 'rvsrc');
    assert.deepEqual(
      want.map(([s]) => s),
      [0, 2, 4],
    );

    const logFile = join(tmp, 'replay.log');
    let logged: string | null = null;
    const out = await replayRun({
      from: src,
      overrides: [],
      log: (runId) => {
        logged = runId;
        return createLogger({ runId, pretty: false, destination: logFile });
      },
    });
    assert.equal(out.status, 'completed', out.message);
    assert.equal(logged, out.runId);
    const lines = readFileSync(logFile, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { run_id: string });
    assert.ok(lines.length > 0);
    assert.deepEqual([...new Set(lines.map((l) => l.run_id))], [out.runId], "every line carries the replay's run id");
    // the original config reproduces the weights exactly, so validation gives the source's numbers
    assert.deepEqual(await valAccuracy(out.runDir, out.runId), want);
  },
);
