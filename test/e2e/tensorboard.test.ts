/**
 * trainer.logger: [console, tensorboard] writes TensorBoard event files while a real run trains
 * (the tiny number game, 3 steps with validation at 0, 2 and 3), under <run_dir>/tensorboard in the
 * file `rlstream report --tensorboard` writes; with the default logger nothing is written. The
 * report of that real run directory has the reward and validation accuracy plots with data.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { readScalars, type ScalarEvent } from '../../lib/analysis/tensorboard.ts';
import { runReport } from '../../app/cli/commands/report.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const dir = join(ROOT, 'test/.tmp', `tensorboard-${process.pid}`);
after(() => rmSync(dir, { recursive: true, force: true }));

const STEPS = 3;
const tiny = (runDir: string, runId: string, extra: string[] = []) =>
  loadConfig({
    file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
    overrides: [`trainer.run_dir=${runDir}`, `pipeline.run_id=${runId}`, `trainer.max_steps=${STEPS}`, ...extra],
  });

/** Scalars of the event files in `tb`, or [] while there are none (or one is being replaced). */
function scalarsNow(tb: string): ScalarEvent[] {
  try {
    return existsSync(tb) ? readScalars(tb) : [];
  } catch {
    return [];
  }
}

test(
  "trainer.logger tensorboard: every step's train and val metrics, written while training; the report plots them",
  { timeout: 120_000 },
  async () => {
    const runDir = join(dir, 'with-tb');
    const runId = 'e2e-tensorboard';
    const cfg = tiny(runDir, runId, [
      'trainer.logger=[console, tensorboard]',
      'data.task_size.val=8',
      'trainer.val_before_train=true',
      'trainer.val_freq=2',
    ]);
    const tb = join(runDir, 'tensorboard');
    // watch the directory while the run trains: steps must appear before the run is over
    const seenDuring = new Set<number>();
    let training = true;
    const watcher = (async () => {
      while (training) {
        for (const s of scalarsNow(tb)) if (s.tag === 'reward/mean') seenDuring.add(s.step);
        await new Promise((r) => setTimeout(r, 200));
      }
    })();
    let out;
    try {
      out = await trainEmbedded(cfg, silentLogger(runId));
    } finally {
      training = false;
      await watcher;
    }
    assert.equal(out.status, 'completed', out.message);
    assert.ok(
      [...seenDuring].some((s) => s < STEPS),
      `train scalars appear while the run trains (seen before the end: ${[...seenDuring].join(',') || 'none'})`,
    );

    const files = readdirSync(tb);
    assert.equal(files.length, 1, `one event file: ${files.join(', ')}`);
    assert.match(files[0], new RegExp(`^events\\.out\\.tfevents\\.\\d+\\.rlstream-export\\.${runId}$`));
    const scalars = readScalars(tb);
    const store = await openStore({ kind: 'pglite', dir: join(runDir, 'db') });
    let metrics;
    try {
      metrics = await store.getMetrics(runId);
    } finally {
      await store.close();
    }
    // every stored (step, metric) exactly once, with its value (float32), nothing else
    const key = (step: number, tag: string) => `${step} ${tag}`;
    const written = new Map<string, number>();
    for (const s of scalars) {
      assert.ok(!written.has(key(s.step, s.tag)), `${s.tag} at step ${s.step} written once`);
      written.set(key(s.step, s.tag), s.value);
    }
    assert.equal(written.size, metrics.length);
    for (const m of metrics) {
      const v = written.get(key(m.step, m.name));
      assert.ok(v !== undefined, `${m.name} at step ${m.step} is in the event file`);
      assert.ok(Object.is(v, Math.fround(m.value)), `${m.name} at step ${m.step}: ${v} vs ${m.value}`);
    }
    const steps = (tag: string) =>
      scalars
        .filter((s) => s.tag === tag)
        .map((s) => s.step)
        .sort((a, b) => a - b);
    for (const tag of ['reward/mean', 'actor/pg_loss', 'actor/entropy']) assert.deepEqual(steps(tag), [1, 2, 3], tag);
    assert.deepEqual(steps('val/accuracy'), [0, 2, 3], 'before training, every 2 steps and at the end');

    // `rlstream report <run_dir> --tensorboard` on the real run: plots with data, and the same event file
    const out2: string[] = [];
    const code = await runReport([runDir, '--tensorboard'], {
      out: (t) => {
        out2.push(t);
      },
      err: (t) => {
        out2.push(t);
      },
    });
    assert.equal(code, 0, out2.join(''));
    const html = readFileSync(join(runDir, 'report.html'), 'utf8');
    for (const id of ['reward', 'val_accuracy']) {
      const svg = new RegExp(`<svg[^>]*data-plot="${id}"[\\s\\S]*?</svg>`).exec(html)?.[0];
      assert.ok(svg, `plot ${id}`);
      assert.doesNotMatch(svg, /no data logged/, `plot ${id} has data`);
      assert.match(
        svg,
        /<path class="series" data-series="[^"]+" d="M[\d.]+ [\d.]+( L[\d.]+ [\d.]+)+"/,
        `plot ${id} has a line`,
      );
    }
    assert.deepEqual(readdirSync(tb), files, 'the report export replaces the live file, adding none');
    assert.equal(readScalars(tb).length, scalars.length);
  },
);

test('the default trainer.logger writes no TensorBoard files', { timeout: 120_000 }, async () => {
  const runDir = join(dir, 'default');
  const cfg = tiny(runDir, 'e2e-tensorboard-off', ['trainer.max_steps=1']);
  assert.deepEqual(cfg.trainer.logger, ['console']);
  const out = await trainEmbedded(cfg, silentLogger('e2e-tensorboard-off'));
  assert.equal(out.status, 'completed', out.message);
  assert.ok(existsSync(join(runDir, 'db')), 'the run wrote its run directory');
  assert.ok(!existsSync(join(runDir, 'tensorboard')), 'no tensorboard directory');
});
