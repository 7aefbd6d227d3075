/**
 * `rlstream replay`: re-running reward → advantage → update over a run's recorded trajectories
 * into a new run. With the original config it reproduces every checkpoint of the source exactly;
 * with algorithm.adv_estimator=rloo it trains on the identical rollouts to a different policy;
 * it generates nothing (no prompts, no rollouts); --until-step stops early.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { replayRun } from '../../app/replay.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { ROOT } from '../../devkit/pipeline-procs.ts';
import { deadline, killHard, spawnCli } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const SRC = 'replaysrc';
const tmp = join(ROOT, 'test/.tmp', `replay-${process.pid}`);
const procs: ReturnType<typeof spawnCli>[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  rmSync(tmp, { recursive: true, force: true });
});

interface Row {
  step: number;
  prompt_index: number;
  sample_index: number;
  response_tokens: number[];
  behaviour_logprobs: number[];
  reward: number;
  advantages: number[];
  policy_version: number;
}

async function inspect(dir: string, runId: string) {
  const store = await openStore({ kind: 'pglite', dir: join(dir, 'db') });
  try {
    const rows = (
      await sql<Row>`select step, prompt_index, sample_index, response_tokens, behaviour_logprobs, reward, advantages, policy_version
      from trajectories where run_id = ${runId} order by step, prompt_index, sample_index`.execute(store.database.db)
    ).rows;
    const topics = (
      await sql<{
        topic: string;
        n: number;
      }>`select topic, sum(next_offset)::int as n from bus_partitions group by topic`.execute(store.database.db)
    ).rows;
    const rollout = await store.getMetrics(runId, ['perf/rollout_tokens']);
    return {
      run: await store.getRun(runId),
      checkpoints: await store.listCheckpoints(runId),
      rows,
      topics: Object.fromEntries(topics.map((t) => [t.topic.split('.').pop(), Number(t.n)])),
      rolloutMetrics: rollout.length,
    };
  } finally {
    await store.close();
  }
}

test(
  "replay reproduces the source run's checkpoints with its config, differs with rloo, and generates nothing",
  { timeout: 300_000 },
  async () => {
    const src = join(tmp, 'src');
    const r = await trainEmbedded(
      loadConfig({
        file: CONFIG,
        overrides: [`trainer.run_dir=${src}`, `pipeline.run_id=${SRC}`, 'trainer.max_steps=4', 'trainer.save_freq=2'],
      }),
      silentLogger(SRC),
    );
    assert.equal(r.status, 'completed', r.message);
    const want = await inspect(src, SRC);
    assert.deepEqual(
      want.checkpoints.map((c) => c.step),
      [2, 4],
    );
    // versions 1 and 3 were handed to the rollout in memory only (policy.version_files: auto, no
    // checkpoint after them within max_staleness): the replay needs none of the source's version files
    assert.deepEqual(
      [0, 1, 2, 3, 4].filter((v) => existsSync(join(src, 'policy', `v${String(v).padStart(6, '0')}`))),
      [0, 2, 4],
    );

    // the original config: the same checkpoints, byte for byte
    const same = await replayRun({ from: src, overrides: [], log: silentLogger('replay') });
    assert.equal(same.status, 'completed', same.message);
    assert.equal(same.sourceRunId, SRC);
    assert.equal(same.copied, 4 * 4, 'every training group of the 4 steps is copied');
    const a = await inspect(same.runDir, same.runId);
    assert.equal(a.run?.parentRunId, SRC);
    assert.deepEqual(
      a.checkpoints.map((c) => [c.step, c.sha256]),
      want.checkpoints.map((c) => [c.step, c.sha256]),
      "every checkpoint equals the source's",
    );
    assert.equal(same.finalSha256, want.checkpoints[1].sha256);
    // nothing generated: no prompts, no rollouts; the trajectories are the source's samples, rescored
    assert.equal(a.topics.prompts ?? 0, 0, 'no prompt batches');
    assert.equal(a.rolloutMetrics, 0, 'no rollout ran');
    assert.equal(a.topics.trajectories, 16);
    assert.deepEqual(a.rows, want.rows, 'same samples, rewards, advantages and behaviour versions as the source');

    // another estimator on the identical rollouts: a different policy
    const rloo = await replayRun({
      from: src,
      overrides: ['algorithm.adv_estimator=rloo'],
      log: silentLogger('replay'),
    });
    assert.equal(rloo.status, 'completed', rloo.message);
    assert.notEqual(rloo.runId, same.runId, 'another override, another replay run');
    const b = await inspect(rloo.runDir, rloo.runId);
    assert.equal(b.checkpoints.length, 2);
    assert.notEqual(b.checkpoints[1].sha256, want.checkpoints[1].sha256, 'RLOO ends with another policy');
    assert.equal(b.topics.prompts ?? 0, 0, 'no prompt batches');
    assert.equal(b.rolloutMetrics, 0, 'no rollout ran');
    const key = (x: Row) => ({
      step: x.step,
      p: x.prompt_index,
      n: x.sample_index,
      tokens: x.response_tokens,
      lp: x.behaviour_logprobs,
      reward: x.reward,
      v: x.policy_version,
    });
    assert.deepEqual(b.rows.map(key), want.rows.map(key), 'identical rollouts');
    assert.notDeepEqual(
      b.rows.map((x) => x.advantages),
      want.rows.map((x) => x.advantages),
      "RLOO advantages differ from GRPO's",
    );

    // the CLI, stopping early: the checkpoint of step 2 equals the source's
    const p = spawnCli(['replay', '--from', src, '--until-step', '2', `pipeline.run_id=${SRC}-until2`]);
    procs.push(p);
    const ex = await Promise.race([p.exit, deadline(120_000)]);
    if (!ex) {
      await killHard(p);
      assert.fail(`replay did not finish:\n${p.output().slice(-3000)}`);
    }
    assert.equal(ex.code, 0, p.output().slice(-3000));
    assert.match(
      p.output(),
      new RegExp(`replay ${SRC}-until2 of ${SRC}: completed, step 2, policy sha256 ${want.checkpoints[0].sha256}`),
    );
    // running the same command again resumes the same replay (nothing copied twice)
    const again = await replayRun({ from: src, overrides: [], log: silentLogger('replay') });
    assert.equal(again.runId, same.runId);
    assert.equal(again.copied, 0);
    assert.equal(again.finalSha256, want.checkpoints[1].sha256);
  },
);

test(
  'a GAE run (critic values scored with the version that generated each step) replays to the same checkpoints',
  { timeout: 300_000 },
  async () => {
    // the replay's recorded groups all arrive at once: the advantage stage waits for the replay's
    // own policy (and critic) versions instead of retrying the whole batch forever
    const src = join(tmp, 'gae');
    const r = await trainEmbedded(
      loadConfig({
        file: CONFIG,
        overrides: [
          `trainer.run_dir=${src}`,
          'pipeline.run_id=replaygae',
          'trainer.max_steps=3',
          'trainer.save_freq=1',
          'algorithm.adv_estimator=gae',
          'critic.enable=true',
        ],
      }),
      silentLogger('replaygae'),
    );
    assert.equal(r.status, 'completed', r.message);
    const want = await inspect(src, 'replaygae');
    const rep = await replayRun({ from: src, overrides: [], log: silentLogger('replay'), stallMs: 60_000 });
    assert.equal(rep.status, 'completed', rep.message);
    const got = await inspect(rep.runDir, rep.runId);
    assert.deepEqual(
      got.checkpoints.map((c) => [c.step, c.sha256]),
      want.checkpoints.map((c) => [c.step, c.sha256]),
      "every checkpoint equals the source's",
    );
    assert.deepEqual(
      got.rows.map((x) => x.advantages),
      want.rows.map((x) => x.advantages),
      'the same GAE advantages',
    );
  },
);
