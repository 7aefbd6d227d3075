/**
 * Multi-turn agents end to end: guess-the-number against the standard-library Python HTTP
 * environment (examples/guess-number/env_server.py). The stored trajectories are token-exact
 * episodes (policy tokens sampled, environment tokens the answers, mask and behaviour log-probs
 * over policy tokens only), every episode and turn is in SQL with the env/* metrics, and replay
 * — with the environment server stopped — retrains from the recorded episodes to the same
 * checkpoint sha256.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { replayRun } from '../../app/replay.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { tokenizerFor } from '../../lib/pipeline/policy.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';

const tmp = join(ROOT, 'test/.tmp', `agents-${process.pid}`);
let server: ChildProcess | null = null;
after(() => {
  server?.kill('SIGKILL');
  rmSync(tmp, { recursive: true, force: true });
});

async function startServer(): Promise<string> {
  server = spawn('/usr/bin/python3', [join(ROOT, 'examples/guess-number/env_server.py'), '--port', '0'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const [line] = (await once(server.stdout!, 'data')) as [Buffer];
  return /listening on (\S+)/.exec(line.toString())![1];
}

test(
  'guess-number over the HTTP environment: token-exact episodes in the log and SQL; replay without the environment gives the same sha256',
  { timeout: 240_000 },
  async () => {
    const url = await startServer();
    const dir = join(tmp, 'src');
    const runId = 'agents-src';
    const cfg = loadConfig({
      file: join(ROOT, 'examples/guess-number.yaml'),
      overrides: [
        `trainer.run_dir=${dir}`,
        `pipeline.run_id=${runId}`,
        'rollout.multi_turn.interaction.type=http',
        `rollout.multi_turn.interaction.url=${url}`,
        'data.task_size.train=64',
        'data.task_size.val=0',
        'trainer.val_freq=-1',
        'data.rollout_batch_size=4',
        'rollout.n=4',
        'actor.global_batch_size=16',
        'actor.micro_batch_size_per_device_for_update=16',
        'actor.micro_batch_size_per_device_for_experience=16',
        'actor.ppo_epochs=1',
        'trainer.max_steps=2',
        'trainer.save_freq=2',
        'trainer.val_before_train=false',
      ],
    });
    const r = await trainEmbedded(cfg, silentLogger(runId));
    assert.equal(r.status, 'completed', r.message);

    const tok = tokenizerFor(cfg);
    const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
    let sha: string;
    try {
      const db = store.database.db;
      const trajs = await store.getTrajectories(runId, { kind: 'train' });
      assert.equal(trajs.length, 2 * 4 * 4);
      const eps = new Map((await store.getEpisodes(runId)).map((e) => [e.trajectoryId, e]));
      assert.equal(
        [...eps.values()].filter((e) => e.kind === 'train').length,
        trajs.length,
        'one stored episode per trajectory',
      );
      let envTokens = 0;
      for (const t of trajs) {
        const e = eps.get(t.id)!.episode;
        // the turns tile the response: assistant spans are sampled tokens (a log-prob < 0 each),
        // every environment span holds exactly its answer's tokens (log-prob 0, no advantage)
        let at = 0;
        for (const turn of e.turns) {
          assert.equal(turn.start, at);
          at = turn.end;
          const ids = Array.from(t.responseTokens).slice(turn.start, turn.end);
          if (turn.role === 'assistant') {
            assert.ok(ids.length > 0);
            for (let k = turn.start; k < turn.end; k++) assert.ok(Number(t.behaviourLogprobs[k]) < 0);
          } else if (turn.end > turn.start) {
            assert.deepEqual(ids, [...tok.encode(turn.text)]);
            for (let k = turn.start; k < turn.end; k++) {
              assert.equal(t.behaviourLogprobs[k], 0);
              assert.equal(t.advantages![k], 0, 'environment tokens get no advantage');
            }
            envTokens += ids.length;
          }
        }
        assert.equal(at, t.responseTokens.length);
        if (e.done) assert.equal(t.reward, 0.8 ** (e.assistant_turns - 1));
        else assert.equal(t.reward, 0);
      }
      assert.ok(envTokens > 0, 'the episodes have environment tokens');
      const views = (
        await sql<{
          outcome: string;
          n: number;
        }>`select outcome, count(*)::int as n from v_episodes where run_id = ${runId} group by outcome`.execute(db)
      ).rows;
      assert.equal(
        views.reduce((a, v) => a + v.n, 0),
        eps.size,
      );
      const metrics = await store.getMetrics(runId, [
        'env/turns_mean',
        'env/latency_p50_ms',
        'env/episode_tokens_mean',
        'env/timeouts',
      ]);
      assert.deepEqual([...new Set(metrics.map((m) => m.name))].sort(), [
        'env/episode_tokens_mean',
        'env/latency_p50_ms',
        'env/timeouts',
        'env/turns_mean',
      ]);
      assert.ok(metrics.filter((m) => m.name === 'env/turns_mean').every((m) => m.value >= 1 && m.value <= 6));
      const ck = await store.latestCheckpoint(runId);
      sha = ck!.sha256;
    } finally {
      await store.close();
    }

    // replay with the environment gone: the recorded episodes are the input, nothing is asked
    server!.kill('SIGTERM');
    await once(server!, 'exit');
    server = null;
    const same = await replayRun({ from: dir, overrides: [], log: silentLogger('replay') });
    assert.equal(same.status, 'completed', same.message);
    assert.equal(same.finalSha256, sha);
  },
);
