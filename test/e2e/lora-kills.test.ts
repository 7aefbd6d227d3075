/**
 * A LoRA run (actor.model.lora over a tiny base model directory; every policy version is an
 * adapter written as files) SIGKILLed at exact crash points of the update stage's phases and
 * started again, embedded (`rlstream train`: killed mid-update, mid-prune of an old version and
 * half-way through a checkpoint write) and distributed (the five stages as `rlstream serve`
 * processes over Kafka (librdkafka mock) and PostgreSQL: the rollout killed after generating, the
 * update stage half-way through an adapter version's write, mid-prune and half-way through a
 * checkpoint write). Both end with the undisturbed run's checkpoints (sha256) and exactly its
 * trajectories: one row per (step, prompt, sample). 4 steps, save_freq 2: step 3 lies between
 * checkpoints, so a restart there re-trains it from global_step_2 and the log. `rlstream replay`
 * of the undisturbed run (its v1 pruned) ends on the same checkpoints.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { sql } from 'kysely';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { replayRun } from '../../app/replay.ts';
import { silentLogger } from '../../lib/log.ts';
import { initWeights } from '../../lib/model/init.ts';
import { saveCheckpoint } from '../../lib/model/checkpoint.ts';
import { openStore } from '../../lib/store/index.ts';
import { policyModelConfig, tokenizerFor } from '../../lib/pipeline/policy.ts';
import { ROOT, freshDatabase, kafkaForRun } from '../../devkit/pipeline-procs.ts';
import { ChaosHarness, deadline, killHard, selfKilledAt, spawnCli, type CliProc } from '../support/chaos-procs.ts';

const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const RUN_ID = 'lorakills';
const STEPS = 4,
  BATCH = 4,
  N = 4;
const tmp = join(ROOT, 'test/.tmp', `lora-kills-${process.pid}`);
const base = join(tmp, 'base');
const cleanups: Array<() => Promise<void>> = [];
const procs: CliProc[] = [];
after(async () => {
  for (const p of procs) await killHard(p);
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

const common = [
  `pipeline.run_id=${RUN_ID}`,
  `actor.model.path=${base}`,
  'actor.model.lora={rank: 2, alpha: 4}',
  'actor.optim.lr=5e-2',
  `trainer.max_steps=${STEPS}`,
  'trainer.save_freq=2',
];

interface TrajRow {
  step: number;
  prompt_index: number;
  sample_index: number;
  response_tokens: number[];
  reward: number | null;
  advantages: number[] | null;
  policy_version: number;
}

async function runState(target: { kind: 'pglite'; dir: string } | { kind: 'postgres'; url: string }, runId = RUN_ID) {
  const store = await openStore(target);
  try {
    const rows = (
      await sql<TrajRow>`select step, prompt_index, sample_index, response_tokens, reward, advantages, policy_version
      from trajectories where run_id = ${runId} and kind = 'train' order by step, prompt_index, sample_index`.execute(
        store.database.db,
      )
    ).rows;
    const checkpoints = (await store.listCheckpoints(runId)).map((c) => [c.step, c.sha256]);
    return { checkpoints, rows };
  } finally {
    await store.close();
  }
}

function assertSameRun(got: Awaited<ReturnType<typeof runState>>, want: Awaited<ReturnType<typeof runState>>) {
  assert.deepEqual(got.checkpoints, want.checkpoints, "every checkpoint equals the undisturbed run's");
  assert.equal(got.rows.length, STEPS * BATCH * N, 'one trajectory row per (step, prompt, sample)');
  assert.equal(new Set(got.rows.map((r) => `${r.step}/${r.prompt_index}/${r.sample_index}`)).size, got.rows.length);
  assert.deepEqual(got.rows, want.rows, "the trajectories equal the undisturbed run's");
}

test(
  'a LoRA run killed mid-update, mid-version-write, mid-prune and mid-checkpoint, embedded and distributed, ends as the undisturbed run',
  { timeout: 300_000 },
  async () => {
    const t0 = Date.now();
    // the base model directory the adapters are trained on (the tiny fixture's shape and tokenizer)
    const baseCfg = loadConfig({ file: CONFIG, overrides: [`trainer.run_dir=${join(tmp, 'unused')}`] });
    const model = policyModelConfig(baseCfg, tokenizerFor(baseCfg));
    mkdirSync(tmp, { recursive: true });
    await saveCheckpoint(base, model, initWeights(model, 5));

    const refDir = join(tmp, 'reference');
    const ref = await trainEmbedded(
      loadConfig({ file: CONFIG, overrides: [...common, `trainer.run_dir=${refDir}`] }),
      silentLogger(RUN_ID),
    );
    assert.equal(ref.status, 'completed', ref.message);
    const want = await runState({ kind: 'pglite', dir: join(refDir, 'db') });
    assert.deepEqual(
      want.checkpoints.map((c) => c[0]),
      [2, 4],
    );
    // a LoRA policy writes every version; v1 was pruned at step 3 (retention: v0, the newest two, checkpoints)
    assert.deepEqual(readdirSync(join(refDir, 'policy')).sort(), ['v000000', 'v000002', 'v000003', 'v000004']);
    const tRef = Date.now();

    // ── a replay of it (v1 pruned: replay needs only v0, the adapter, and the recorded sha256s)
    const cpu0 = process.cpuUsage();
    const rep = await replayRun({ from: refDir, overrides: [], log: silentLogger(RUN_ID) });
    assert.equal(rep.status, 'completed', rep.message);
    assert.equal(rep.copied, STEPS * BATCH);
    const replayed = await runState({ kind: 'pglite', dir: join(rep.runDir, 'db') }, rep.runId);
    assert.deepEqual(replayed.checkpoints, want.checkpoints, "the replay's checkpoints equal the source's");
    assert.equal(rep.finalSha256, want.checkpoints.at(-1)![1]);
    const tReplay = Date.now();
    const cpu = process.cpuUsage(cpu0);

    // ── embedded: the same command after each kill
    const dir = join(tmp, 'embedded');
    const args = ['train', CONFIG, ...common, `trainer.run_dir=${dir}`];
    // step 1 trained, uncommitted; the prune of v1 at step 3 (between checkpoints); global_step_4 half-written
    const kills = ['update:trained@1', 'update:pruning@1', 'checkpoint:half-written@1'];
    for (const spec of [...kills, null]) {
      const p = spawnCli(args, spec ? { RLSTREAM_CRASH_AT: spec } : {});
      procs.push(p);
      const done = await Promise.race([p.exit, deadline(120_000)]);
      if (!done) assert.fail(`${spec ?? 'the final run'} did not end:\n${p.output().slice(-3000)}`);
      if (spec) {
        assert.equal(done.signal, 'SIGKILL', `killed at ${spec}:\n${p.output().slice(-3000)}`);
        assert.equal(selfKilledAt(p.output()), spec);
      } else assert.equal(done.code, 0, p.output().slice(-3000));
    }
    assertSameRun(await runState({ kind: 'pglite', dir: join(dir, 'db') }), want);
    const tEmb = Date.now();

    // ── distributed: five stage processes; the k-th process of a stage dies at the k-th point of its list
    const db = await freshDatabase(`rl_e2e_lora_kills_${process.pid}`);
    cleanups.push(db.drop);
    const kafka = await kafkaForRun('lorakills', RUN_ID, 2);
    cleanups.push(() => kafka.stop());
    const hooks = {
      rollout: ['rollout:generated@2'],
      // hit 1 is v0's write: @2 is step 1's adapter version in its temporary directory
      update: ['update:version-half-written@2', 'update:pruning@1', 'checkpoint:half-written@1'],
    };
    const harness = new ChaosHarness({
      configFile: CONFIG,
      overrides: [
        ...common,
        `trainer.run_dir=${join(tmp, 'distributed')}`,
        'pipeline.topic_prefix=lorakills',
        'pipeline.bus=kafka',
        `pipeline.brokers=[${kafka.brokers.join(',')}]`,
        'pipeline.store=postgres',
        `pipeline.database_url=${db.url}`,
      ],
      stages: ['update', 'controller', 'advantage', 'reward', 'rollout'],
      seed: 1,
      maxKills: 4,
      // no kills from outside: only the crash points
      intervalMs: [1e9, 1e9],
      minUptimeMs: 0,
      restartDelayMs: 100,
      timeoutMs: 180_000,
      hooks,
    });
    cleanups.push(() => harness.stop());
    await harness.run();
    assert.deepEqual(
      harness.kills.map((k) => `${k.stage} ${k.point}`).sort(),
      [
        'rollout rollout:generated',
        'update checkpoint:half-written',
        'update update:pruning',
        'update update:version-half-written',
      ],
      'every crash point was reached',
    );
    assertSameRun(await runState({ kind: 'postgres', url: db.url }), want);
    console.log(
      `  reference ${((tRef - t0) / 1000).toFixed(1)} s, replay ${((tReplay - tRef) / 1000).toFixed(1)} s (${((cpu.user + cpu.system) / 1e6).toFixed(1)} CPU-s), embedded (${kills.length} kills) ${((tEmb - tReplay) / 1000).toFixed(1)} s, distributed (${harness.kills.length} kills) ${((Date.now() - tEmb) / 1000).toFixed(1)} s`,
    );
  },
);
