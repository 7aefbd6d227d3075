/**
 * Ctrl-C while the reward servers' circuit breakers cycle: two servers answer every scoring
 * request with 500 and every health probe with 200, so each breaker opens, half-opens on the next
 * probe, fails its trial and opens again, while the reward batch retries inside a long batch
 * budget. The first SIGINT to `rlstream train` must stop it within pipeline.grace_seconds, saying
 * so at once on stderr (exit code 130), and `rlstream runs` must say `stopped`.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { killHard, spawnCli } from '../support/chaos-procs.ts';
import { listRunsInDir } from '../../lib/analysis/runs.ts';

const tmp = join(ROOT, 'test/.tmp', `ctrl-c-breakers-${process.pid}`);
const servers: Server[] = [];
after(async () => {
  for (const s of servers) await new Promise((r) => s.close(r));
  rmSync(tmp, { recursive: true, force: true });
});

/** A reward server that fails every scoring request and passes every health probe. */
async function failingServer(): Promise<{ url: string; scored: () => number }> {
  let scored = 0;
  const s = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.method === 'GET') {
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
      } else {
        scored++;
        res.writeHead(500, { 'content-type': 'text/plain' }).end('scorer crashed');
      }
    });
  });
  servers.push(s);
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(s.address() as AddressInfo).port}`, scored: () => scored };
}

test(
  'the first Ctrl-C stops a run whose reward breakers keep opening, within the grace period, saying so',
  {
    timeout: 540_000,
  },
  async () => {
    const a = await failingServer();
    const b = await failingServer();
    const GRACE_S = 12;
    const runs = join(tmp, 'runs');
    const proc = spawnCli(
      [
        'train',
        join(ROOT, 'test/e2e/fixtures/tiny.yaml'),
        `trainer.run_dir=${join(runs, 'r')}`,
        'pipeline.run_id=ctrl-c-breakers',
        `pipeline.grace_seconds=${GRACE_S}`,
        'reward.type=remote',
        'reward.reward_fn=null',
        'reward.on_failure=retry',
        `reward.remote.urls=[${a.url}, ${b.url}]`,
        'reward.remote.request_preset=text',
        'reward.remote.max_retries=1000',
        'reward.remote.backoff_initial_ms=10',
        'reward.remote.backoff_max_ms=50',
        'reward.remote.batch_budget_ms=600000',
        'reward.remote.breaker={failure_threshold: 2, reset_timeout_ms: 300, probe_interval_ms: 100}',
      ],
      { RLSTREAM_LOG_LEVEL: 'info' },
    );
    try {
      // the breakers have opened, half-opened and opened again: the batch is stuck retrying
      const cycling = await proc.waitFor(/circuit breaker half-open[\s\S]*circuit breaker open/, 420_000);
      assert.ok(cycling, `the breakers never cycled:\n${proc.output().slice(-3000)}`);
      const before = a.scored() + b.scored();
      const at = proc.output().length;
      const t0 = Date.now();
      proc.child.kill('SIGINT');
      const said = await proc.waitFor(/Ctrl-C: stopping the run/, 2_000);
      const exit = await Promise.race([
        proc.exit,
        new Promise<null>((r) => setTimeout(() => r(null), (GRACE_S + 10) * 1000).unref()),
      ]);
      const took = (Date.now() - t0) / 1000;
      const tail = proc.output().slice(at);
      assert.ok(exit, `still running ${took.toFixed(1)} s after Ctrl-C (grace ${GRACE_S} s):\n${tail.slice(-2000)}`);
      assert.ok(said, `nothing said at once after Ctrl-C:\n${tail.slice(-2000)}`);
      assert.ok(before > 0, 'the servers were asked to score');
      assert.equal(exit.code, 130, tail.slice(-2000));
      // the process exits at the grace period at the latest; the rest is this loaded machine's latency
      assert.ok(took <= GRACE_S + 6, `stopped after ${took.toFixed(1)} s (grace ${GRACE_S} s)`);
      assert.match(tail, /rlstream train: Ctrl-C: stopping the run \(at most 12 s, pipeline\.grace_seconds/);
      const [row] = await listRunsInDir(runs);
      assert.equal(row!.status, 'stopped', row!.note);
    } finally {
      await killHard(proc);
    }
  },
);
