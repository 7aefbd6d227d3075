/**
 * A message a stage's handler fails on (a non-retriable error of the stage's own, e.g. a row the
 * store refuses) is dead-lettered by the delivery policy. It is findable where
 * the run's message says it is kept (`v_dead_letters`, the store's `dead_letters`), and the
 * message must name the stage's failure — not hint at a damaged run directory or another version.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { openPipeline, runStage } from '../../../lib/pipeline/runtime.ts';
import { controlEvent, parseTopicName, type DeadLetter } from '../../../lib/contracts/index.ts';
import { deadLetterFailure } from '../../../app/run.ts';
import { RlError } from '../../../lib/errors.ts';
import { ROOT } from '../../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `dl-truth-${process.pid}`);
after(() => rmSync(tmp, { recursive: true, force: true }));

test(
  "a handler failure is dead-lettered into dead_letters and reported as the stage's failure",
  { timeout: 60_000 },
  async () => {
    const cfg = loadConfig({
      file: join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
      overrides: [`trainer.run_dir=${tmp}`, 'pipeline.run_id=dltruth'],
    });
    const p = await openPipeline(cfg);
    try {
      await p.bus.produce([
        p.message(
          'control',
          controlEvent(
            'run_failed',
            { stage: 'x', code: 'E', message: 'y' },
            { run_id: p.runId, id: 'dltruth/c1', step: 0, policy_version: 0, time_ms: 1 },
          ),
        ),
      ]);
      const run = runStage(p, 'probe', ['control'], async () => {
        throw new RlError('responseText contains a NUL character', { code: 'ERR_BAD_ROW' });
      });
      let dl: DeadLetter | undefined;
      for (let i = 0; i < 200 && !dl; i++) {
        const got = await p.bus.read(p.topic('deadletter'), 0, 0, 10);
        if (got.length) dl = (await p.codecs.deadletter.decode(got[0].value, got[0].headers)) as DeadLetter;
        else await new Promise((r) => setTimeout(r, 50));
      }
      await run.consumer.stop();
      await run.done.catch(() => undefined);
      assert.ok(dl, 'the message was dead-lettered');
      const rows = await p.store.listDeadLetters({ runId: p.runId });
      assert.equal(rows.length, 1, 'kept in dead_letters, where the message says');
      assert.match(rows[0].reason, /NUL character/);
      assert.equal(rows[0].stage, 'probe');
      const text = deadLetterFailure(dl, parseTopicName(cfg.pipeline.topic_prefix, p.runId, dl.source_topic), p.runDir);
      assert.match(text, /^probe failed on a control message .*NUL character/);
      assert.doesNotMatch(text, /another rlstream version|damaged/);
      assert.match(text, /v_dead_letters/);
    } finally {
      await p.close();
    }
  },
);
