/**
 * The number game trained with its reward computed by `rlstream reward-server` processes
 * (examples/number-game-remote): two servers on consecutive loopback ports started through the
 * CLI, short embedded runs in this process, and the example's run.sh in distributed mode.
 *
 *  - embedded: every stored trajectory carries the server's fields and exactly the reward the
 *    scorer computes for its response; both servers' logs show the requests the store says they
 *    scored; the client's per-server metrics are in the store;
 *  - one server SIGKILLed mid-run: the run completes, every trajectory scored by the other one
 *    (failover), none with a fabricated reward;
 *  - reward.on_failure: stop with every server dead: the run ends `failed`, naming the server;
 *  - debug switch: DISABLE_RL_REWARD_MODEL=true in the stage's environment → the number_game
 *    function, which the example's scorer mirrors: the same checkpoint as the servers' run;
 *  - distributed (run.sh, Kafka mock + PostgreSQL): two reward replicas, each with its own
 *    preferred server, both servers serve requests.
 * Every process started here is stopped by PID; every wait is bounded.
 */
import { sql } from 'kysely';
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { loadConfig, type Config } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore, type StoredTrajectory } from '../../lib/store/index.ts';
import { openPipeline, partitionsFor, type Pipeline } from '../../lib/pipeline/runtime.ts';
import type { ScoredGroup } from '../../lib/contracts/index.ts';
import { ConfigError } from '../../lib/errors.ts';
import { createRewardBackend } from '../../services/reward/main.ts';
import { accuracy, formatScore } from '../../examples/number-game-remote/scorer.ts';
import { ROOT, freshDatabase, kafkaForRun } from '../../devkit/pipeline-procs.ts';

const CONFIG = join(ROOT, 'examples/number-game-remote/config.yaml');
const RUN_SH = join(ROOT, 'examples/number-game-remote/run.sh');
const SCORER = join(ROOT, 'examples/number-game-remote/scorer.ts');
const tmp = join(ROOT, 'test/.tmp', `reward-remote-${process.pid}`);
const STEPS = 4;
const PER_STEP = 4 * 4; // rollout_batch_size × rollout.n
/** The example, shrunk: a tiny model, a few steps, no validation, one ORT thread. */
const TINY = [
  'data.task_size={train: 64, val: 0}',
  'data.rollout_batch_size=4',
  'data.seed=3',
  'rollout.n=4',
  'actor.model={d_model: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, ffn: 64, max_seq_len: 32, tokenizer: alphabet, init_seed: 5}',
  'actor.global_batch_size=16',
  'actor.micro_batch_size_per_device_for_update=16',
  'actor.ppo_epochs=1',
  'actor.threads=1',
  `trainer.max_steps=${STEPS}`,
  'trainer.val_before_train=false',
  'trainer.val_freq=-1',
  'trainer.save_freq=-1',
];

const cleanups: Array<() => Promise<unknown>> = [];
const savedDisable = process.env.DISABLE_RL_REWARD_MODEL;
before(() => {
  mkdirSync(tmp, { recursive: true });
  delete process.env.DISABLE_RL_REWARD_MODEL; // the stage reads it: these runs must call the servers
});
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  if (savedDisable === undefined) delete process.env.DISABLE_RL_REWARD_MODEL;
  else process.env.DISABLE_RL_REWARD_MODEL = savedDisable;
  rmSync(tmp, { recursive: true, force: true });
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `p`, or 'timeout' after `ms` (the timer is cleared either way, so it never keeps the process alive). */
async function within<T>(p: Promise<T>, ms: number): Promise<T | 'timeout'> {
  let t: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<'timeout'>((r) => {
        t = setTimeout(() => r('timeout'), ms);
      }),
    ]);
  } finally {
    clearTimeout(t);
  }
}

function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

/** A port P such that P and P+1 are free on 127.0.0.1 (bounded tries). */
async function freePortPair(): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const p = 20_000 + Math.floor(Math.random() * 40_000);
    if ((await canListen(p)) && (await canListen(p + 1))) return p;
  }
  throw new Error('no two consecutive free loopback ports found in 50 tries');
}

interface Servers {
  port: number;
  pids: number[];
  logs: string[];
  launcher: ChildProcess;
  output(): string;
  stop(): Promise<void>;
}

/** `rlstream reward-server --count 2 --port P` (the CLI command), debug logs: one line per scored request. */
async function startServers(name: string): Promise<Servers> {
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePortPair();
    const logDir = join(tmp, `${name}-logs`);
    const launcher = spawn(
      process.execPath,
      [
        join(ROOT, 'bin/rlstream.mjs'),
        'reward-server',
        '--scorer',
        SCORER,
        '--count',
        '2',
        '--port',
        String(port),
        '--log-dir',
        logDir,
        '--shutdown-grace-ms',
        '1000',
      ],
      {
        cwd: ROOT,
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, RLSTREAM_LOG_LEVEL: 'debug' },
      },
    );
    let out = '';
    launcher.stdout!.on('data', (d) => {
      out += d;
    });
    launcher.stderr!.on('data', (d) => {
      out += d;
    });
    let exited = false;
    const exit = new Promise<void>((r) =>
      launcher.on('exit', () => {
        exited = true;
        r();
      }),
    );
    let pids: number[] = [];
    const stop = async () => {
      if (!exited) {
        launcher.kill('SIGTERM'); // forwarded to both servers, which drain and exit
        await within(exit, 10_000);
        if (!exited) launcher.kill('SIGKILL');
      }
      for (const pid of pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
      }
    };
    const re = /reward-server listening on http:\/\/127\.0\.0\.1:(\d+) pid=(\d+) log=(\S+)/g;
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline && !exited) {
      const found = [...out.matchAll(re)]
        .map((m) => ({ port: Number(m[1]), pid: Number(m[2]), log: m[3] }))
        .sort((a, b) => a.port - b.port);
      pids = found.map((f) => f.pid);
      if (found.length === 2) {
        const s: Servers = { port, pids, logs: found.map((f) => f.log), launcher, output: () => out, stop };
        cleanups.push(stop);
        for (const f of found) {
          const h = await fetch(`http://127.0.0.1:${f.port}/healthz`);
          assert.equal(h.status, 200, `server on ${f.port} is healthy`);
        }
        assert.deepEqual(
          found.map((f) => f.port),
          [port, port + 1],
        );
        return s;
      }
      await sleep(50);
    }
    await stop();
    if (!/already in use/.test(out)) throw new Error(`reward servers did not start:\n${out.slice(-2000)}`);
  }
  throw new Error('reward servers did not start: ports kept being taken');
}

/** Requests each server logged as scored (debug line `scored`, one per request). */
function scoredLines(logFile: string): number {
  if (!existsSync(logFile)) return 0;
  return readFileSync(logFile, 'utf8')
    .split('\n')
    .filter((l) => l.includes('"msg":"scored"')).length;
}

function config(name: string, port: number, extra: string[] = []): Config {
  return loadConfig({
    file: CONFIG,
    env: {},
    onWarning: () => undefined,
    overrides: [
      ...TINY,
      `trainer.run_dir=${join(tmp, name)}`,
      `pipeline.run_id=rr-${name}`,
      `reward.remote.start_port=${port}`,
      ...extra,
    ],
  });
}

const checkpointSha = (summary: string) => /sha256 ([0-9a-f]{64})/.exec(summary)?.[1];
/** Final checkpoint of the first test's run (scored by the servers), for the debug-mode run to match. */
let remoteSha: string | undefined;

async function trajectories(cfg: Config): Promise<StoredTrajectory[]> {
  const store = await openStore({ kind: 'pglite', dir: join(cfg.trainer.run_dir!, 'db') });
  try {
    return await store.getTrajectories(cfg.pipeline.run_id!);
  } finally {
    await store.close();
  }
}

async function metricsOf(cfg: Config, prefix: string): Promise<Map<string, number>> {
  const store = await openStore({ kind: 'pglite', dir: join(cfg.trainer.run_dir!, 'db') });
  try {
    const last = new Map<string, number>();
    for (const m of await store.getMetrics(cfg.pipeline.run_id!))
      if (m.name.startsWith(prefix)) last.set(m.name, m.value); // ordered by step
    return last;
  } finally {
    await store.close();
  }
}

/** Every scored group in the run's event log (the embedded bus), and the run's dead letters. */
async function eventLog(cfg: Config): Promise<{ scored: ScoredGroup[]; deadLetters: number }> {
  const p = await openPipeline(cfg, { log: silentLogger() });
  try {
    const scored: ScoredGroup[] = [];
    for (let part = 0; part < partitionsFor(cfg, 'scored'); part++) {
      let offset = 0;
      for (let i = 0; i < 1000; i++) {
        const ms = await p.bus.read(p.topic('scored'), part, offset, 500);
        if (ms.length === 0) break;
        for (const m of ms) {
          offset = m.offset + 1;
          scored.push((await p.codecs.scored.decode(m.value, m.headers)) as ScoredGroup);
        }
      }
    }
    return { scored, deadLetters: (await p.store.listDeadLetters({ runId: p.runId })).length };
  } finally {
    await p.close();
  }
}

/** Runs trainEmbedded, aborted (status `stopped`) if it has not ended after `ms`, so a hung run cannot outlive its test. */
async function train(cfg: Config, ms = 90_000) {
  const ac = new AbortController();
  const t = setTimeout(() => ac.abort(), ms);
  try {
    return await trainEmbedded(cfg, silentLogger(cfg.pipeline.run_id!), { signal: ac.signal });
  } finally {
    clearTimeout(t);
  }
}

/** What the scorer (and the config's weights: accuracy 1.0, format 0.1) give this response. */
function expectedReward(t: StoredTrajectory): number {
  return 1.0 * accuracy(t.responseText, t.groundTruth!) + 0.1 * formatScore(t.responseText);
}

/** Every trajectory scored by one of `pids`, with the scorer's fields and exactly its reward. */
function assertScoredByServers(trajs: StoredTrajectory[], pids: number[]): void {
  assert.equal(trajs.length, STEPS * PER_STEP, 'one stored row per (step, prompt, sample)');
  for (const t of trajs) {
    assert.equal(t.rewardFailure, null, `${t.id} has no failure`);
    assert.notEqual(t.reward, null, `${t.id} has a reward`);
    const d = t.rewardDetails as Record<string, number>;
    assert.ok(
      pids.includes(d.server_pid),
      `${t.id} scored by a reward server (server_pid ${d.server_pid}, servers ${pids.join(', ')})`,
    );
    assert.equal(d.accuracy, accuracy(t.responseText, t.groundTruth!), `${t.id} accuracy`);
    assert.equal(d.format, formatScore(t.responseText), `${t.id} format`);
    assert.ok(
      Math.abs(t.reward! - expectedReward(t)) < 1e-12,
      `${t.id}: reward ${t.reward} = scorer's ${expectedReward(t)} for ${JSON.stringify(t.responseText)}`,
    );
  }
}

const countBy = (trajs: StoredTrajectory[], pid: number) =>
  trajs.filter((t) => (t.rewardDetails as Record<string, number>).server_pid === pid).length;

let dead: { port: number } | null = null;

test(
  "embedded: every trajectory is scored by the reward servers, with the scorer's reward; both servers serve",
  { timeout: 120_000 },
  async () => {
    const s = await startServers('a');
    // 2 requests per server in flight: the batch spills from the preferred server (replica 0 → server 0) to the other
    const cfg = config('embedded', s.port, [
      'reward.remote.concurrency_per_server=2',
      'pipeline.run_id=rr-number-game',
    ]);
    const out = await train(cfg);
    assert.equal(out.status, 'completed', out.message);
    remoteSha = checkpointSha(out.summary);
    assert.ok(remoteSha, out.summary);
    const trajs = await trajectories(cfg);
    assertScoredByServers(trajs, s.pids);
    // the servers' own logs agree with the store, request for request (no retries on this path)
    const logged = s.logs.map(scoredLines);
    assert.deepEqual(
      logged,
      s.pids.map((pid) => countBy(trajs, pid)),
      `server logs ${logged.join('/')} vs store`,
    );
    assert.ok(logged[0] > 0 && logged[1] > 0, `both servers served requests (${logged.join(', ')})`);
    // per-server client metrics are in the store
    const m = await metricsOf(cfg, 'reward');
    for (const p of [s.port, s.port + 1]) {
      assert.equal(m.get(`reward_server/127.0.0.1:${p}/errors_total`), 0);
      assert.ok(m.has(`reward_server/127.0.0.1:${p}/latency_p99_ms`), `latency of :${p} recorded`);
    }
    assert.equal(
      m.get(`reward_server/127.0.0.1:${s.port}/requests_total`)! +
        m.get(`reward_server/127.0.0.1:${s.port + 1}/requests_total`)!,
      STEPS * PER_STEP,
    );
    assert.equal(m.get('reward/failures'), 0);
    await s.stop();
  },
);

test(
  'embedded: one server SIGKILLed mid-run → the run completes, every later trajectory scored by the other (failover)',
  { timeout: 120_000 },
  async () => {
    const s = await startServers('b');
    // with room for a whole step on one server, replica 0 sends everything to its preferred server 0
    const cfg = config('failover', s.port, [
      'reward.remote.concurrency_per_server=32',
      'reward.remote.backoff_initial_ms=20',
      'reward.remote.backoff_max_ms=200',
    ]);
    const run = train(cfg);
    // kill server 0 once it has scored the first step (bounded wait)
    let killedAfter = -1;
    for (let i = 0; i < 1200 && killedAfter < 0; i++) {
      if (scoredLines(s.logs[0]) >= PER_STEP) {
        process.kill(s.pids[0], 'SIGKILL');
        killedAfter = scoredLines(s.logs[0]);
      } else await sleep(25);
    }
    assert.ok(killedAfter >= PER_STEP, 'server 0 scored the first step before it was killed');
    const out = await run;
    assert.equal(out.status, 'completed', out.message);
    const trajs = await trajectories(cfg);
    assertScoredByServers(trajs, s.pids);
    assert.equal(countBy(trajs, s.pids[0]), killedAfter, 'server 0 scored exactly what it logged before it died');
    assert.equal(scoredLines(s.logs[1]), countBy(trajs, s.pids[1]), 'server 1 scored the rest');
    assert.equal(countBy(trajs, s.pids[0]) + countBy(trajs, s.pids[1]), STEPS * PER_STEP);
    for (const t of trajs.filter((x) => x.step >= 3))
      assert.equal(
        (t.rewardDetails as Record<string, number>).server_pid,
        s.pids[1],
        `${t.id} (step ${t.step}) failed over to server 1`,
      );
    const m = await metricsOf(cfg, 'reward');
    assert.ok(m.get(`reward_server/127.0.0.1:${s.port}/errors_total`)! >= 1, 'the client saw server 0 fail');
    assert.ok(m.get('reward/retries')! >= 1, 'and retried elsewhere');
    // the event log holds no failed sample either: failover happened inside the client's retries
    const log = await eventLog(cfg);
    assert.equal(log.deadLetters, 0);
    assert.equal(log.scored.flatMap((g) => g.samples).filter((x) => x.reward === null || x.failure !== null).length, 0);
    await s.stop();
    dead = { port: s.port };
  },
);

test(
  'reward.on_failure = stop with every server dead → the run fails naming the server; nothing recorded with a reward',
  { timeout: 120_000 },
  async () => {
    assert.ok(dead, 'runs after the failover test (its ports are now closed)');
    assert.ok(
      (await canListen(dead!.port)) && (await canListen(dead!.port + 1)),
      "nothing listens on the dead servers' ports",
    );
    const cfg = config('stop', dead!.port, [
      'reward.on_failure=stop',
      'reward.remote.max_retries=2',
      'reward.remote.backoff_initial_ms=10',
      'reward.remote.backoff_max_ms=50',
      'reward.remote.timeout_ms=2000',
      'reward.remote.batch_budget_ms=10000',
      'reward.remote.breaker={failure_threshold: 100, reset_timeout_ms: 1000, probe_interval_ms: 500}',
    ]);
    const out = await train(cfg);
    assert.equal(out.status, 'failed');
    assert.match(out.message ?? '', /reward/);
    assert.match(out.message ?? '', /on_failure/);
    assert.match(
      out.message ?? '',
      new RegExp(`127\\.0\\.0\\.1:(${dead!.port}|${dead!.port + 1})`),
      `names the server: ${out.message}`,
    );
    assert.match(out.message ?? '', /ECONNREFUSED|refused/i);
    // recorded in the event log: the groups with their failures, never a reward
    const log = await eventLog(cfg);
    assert.equal(log.deadLetters, 0, 'the stop is a run_failed event, not a dead-lettered batch');
    assert.ok(log.scored.length > 0, 'the failed groups are kept in the log');
    for (const g of log.scored)
      for (const x of g.samples) {
        assert.equal(x.reward, null, `${x.id} must not carry a reward`);
        assert.ok(x.failure && x.failure.retriable, `${x.id} records why it has none`);
        assert.match(x.failure!.message, /127\.0\.0\.1:\d+/);
      }
    for (const t of await trajectories(cfg)) assert.equal(t.reward, null, `stored ${t.id} must not carry a reward`);
    const store = await openStore({ kind: 'pglite', dir: join(cfg.trainer.run_dir!, 'db') });
    try {
      assert.equal((await store.getRun(cfg.pipeline.run_id!))?.status, 'failed');
    } finally {
      await store.close();
    }
  },
);

test(
  'reward.on_failure = drop_group with every server dead: the run fails naming the servers, not online filtering, and every failed train sample is stored',
  { timeout: 120_000 },
  async () => {
    assert.ok(dead, 'runs after the failover test (its ports are now closed)');
    const cfg = config('drop-group', dead!.port, [
      'reward.on_failure=drop_group',
      'algorithm.online_filtering=false',
      'algorithm.max_try_make_batch=2',
      'reward.remote.max_retries=1',
      'reward.remote.backoff_initial_ms=10',
      'reward.remote.backoff_max_ms=50',
      'reward.remote.timeout_ms=2000',
      'reward.remote.batch_budget_ms=10000',
    ]);
    const out = await train(cfg);
    assert.equal(out.status, 'failed');
    const msg = out.message ?? '';
    assert.doesNotMatch(msg, /online filtering|filter_low/, msg);
    assert.match(msg, new RegExp(`127\\.0\\.0\\.1:(${dead!.port}|${dead!.port + 1})`), `names a server: ${msg}`);
    assert.match(msg, /ECONNREFUSED|refused/i, msg);
    const store = await openStore({ kind: 'pglite', dir: join(cfg.trainer.run_dir!, 'db') });
    try {
      const runId = cfg.pipeline.run_id!;
      const failed = (
        await sql<{
          n: number;
        }>`select count(*)::int as n from v_reward_failures where run_id = ${runId} and kind = 'train'`.execute(
          store.database.db,
        )
      ).rows[0]!.n;
      // the first draw and both refills (3 × rollout_batch_size groups × n samples): every one stored with its failure
      assert.equal(failed, 3 * cfg.data.rollout_batch_size * cfg.rollout.n, 'train failures stored');
      assert.match(msg, new RegExp(`reward failed for ${failed} samples`), msg);
      assert.equal((await store.getRun(runId))?.status, 'failed');
    } finally {
      await store.close();
    }
  },
);

test(
  'debug switch: DISABLE_RL_REWARD_MODEL=true in the stage → the number_game function, and the very same training',
  { timeout: 120_000 },
  async () => {
    assert.ok(dead);
    // loaded without the switch (enabled = true, reward_fn null): the stage itself must honour it
    const cfg = config('debug', dead!.port, ['pipeline.run_id=rr-number-game']);
    assert.equal(cfg.reward.remote.enabled, true);
    process.env.DISABLE_RL_REWARD_MODEL = 'true';
    let sha: string | undefined;
    try {
      const out = await train(cfg);
      assert.equal(out.status, 'completed', out.message);
      sha = checkpointSha(out.summary);
    } finally {
      delete process.env.DISABLE_RL_REWARD_MODEL;
    }
    const trajs = await trajectories(cfg);
    assert.equal(trajs.length, STEPS * PER_STEP);
    // the example's scorer + weights are the number_game function, out of process: same rewards,
    // same updates, bit for bit (the first test trained the same run id with the servers)
    assert.ok(remoteSha, 'the first test ran');
    assert.equal(
      sha,
      remoteSha,
      'the run scored by the function ends with the checkpoint of the run scored by the servers',
    );
    for (const t of trajs) {
      const d = t.rewardDetails as Record<string, number>;
      assert.equal(d.server_pid, undefined, 'not scored by a server');
      assert.equal(t.reward, d.accuracy + 0.1 * d.format, 'the number_game function: accuracy + 0.1 · format');
    }

    // the backend choice itself, and the error when no function is available
    const p = (c: Config) => ({ cfg: c, log: silentLogger() }) as unknown as Pipeline;
    const remote = await createRewardBackend(p(cfg), 0, {});
    assert.equal(remote.name, 'http:remote');
    await remote.close();
    assert.equal((await createRewardBackend(p(cfg), 0, { DISABLE_RL_REWARD_MODEL: 'true' })).name, 'fn:number_game');
    const noFn = structuredClone(cfg);
    noFn.data.task = null;
    await assert.rejects(
      createRewardBackend(p(noFn), 0, { DISABLE_RL_REWARD_MODEL: '1' }),
      (e: unknown) =>
        e instanceof ConfigError &&
        /DISABLE_RL_REWARD_MODEL=true/.test(e.message) &&
        /reward\.reward_fn/.test(e.message),
    );
    noFn.reward.remote.enabled = false;
    await assert.rejects(createRewardBackend(p(noFn), 0, {}), /reward\.remote\.enabled: false.*reward\.reward_fn/);
  },
);

test(
  'distributed (run.sh): stages over Kafka + PostgreSQL, two reward replicas each served by its own server',
  { timeout: 180_000 },
  async () => {
    const runId = 'rr-distributed';
    const prefix = `rrd${process.pid}`;
    const db = await freshDatabase(`rl_e2e_reward_remote_${process.pid}`);
    cleanups.push(db.drop);
    const kafka = await kafkaForRun(prefix, runId, 2);
    cleanups.push(() => kafka.stop());
    const port = await freePortPair();
    const logDir = join(tmp, 'distributed-logs');
    const overrides = [
      ...TINY,
      `trainer.run_dir=${join(tmp, 'distributed')}`,
      `pipeline.run_id=${runId}`,
      `pipeline.topic_prefix=${prefix}`,
      // room for a whole batch on one server: each replica only uses its preferred server
      'reward.remote.concurrency_per_server=32',
      ...(kafka.controllerFixed ? [] : ['pipeline.kafka.idempotent=false']),
    ];
    const child = spawn('bash', [RUN_SH, 'distributed', ...overrides], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
      env: {
        ...process.env,
        KAFKA_BROKERS: kafka.brokers.join(','),
        DATABASE_URL: db.url,
        REWARD_PORT: String(port),
        LOG_DIR: logDir,
        TIMEOUT_S: '150',
        REWARD_SERVER_LOG_LEVEL: 'debug',
        RLSTREAM_LOG_JSON: '1',
      },
    });
    let out = '';
    child.stdout!.on('data', (d) => {
      out = (out + d).slice(-20000);
    });
    child.stderr!.on('data', (d) => {
      out = (out + d).slice(-20000);
    });
    const exit = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    // run.sh stops its servers and stages itself (trap); if it hangs, SIGTERM its group, then SIGKILL
    cleanups.push(async () => {
      try {
        process.kill(-child.pid!, 'SIGTERM');
        await within(exit, 20_000);
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        /* gone */
      }
      // run.sh starts the servers in their own process group: make sure none survives it
      for (const m of out.matchAll(/ pid=(\d+) /g)) {
        try {
          process.kill(Number(m[1]), 'SIGKILL');
        } catch {
          /* gone */
        }
      }
    });
    const code = await within(exit, 170_000);
    assert.equal(code, 0, `run.sh distributed exited ${code}:\n${out.slice(-4000)}`);

    const pids = [...out.matchAll(/reward-server listening on http:\/\/127\.0\.0\.1:(\d+) pid=(\d+)/g)]
      .sort((a, b) => Number(a[1]) - Number(b[1]))
      .map((m) => Number(m[2]));
    assert.equal(pids.length, 2);
    for (const pid of pids) assert.throws(() => process.kill(pid, 0), 'run.sh stopped the reward server ' + pid);
    const store = await openStore({ kind: 'postgres', url: db.url });
    try {
      assert.equal((await store.getRun(runId))?.status, 'completed');
      const trajs = await store.getTrajectories(runId);
      assertScoredByServers(trajs, pids);
      const logged = [port, port + 1].map((p) => scoredLines(join(logDir, `reward-server-${p}.log`)));
      // every stored reward was logged by its server (a batch redelivered after a rebalance may be scored twice)
      pids.forEach((pid, i) =>
        assert.ok(
          logged[i] >= countBy(trajs, pid),
          `server ${i} logged ${logged[i]} requests, the store has ${countBy(trajs, pid)} of its rewards`,
        ),
      );
      // one replica alone would send everything to its preferred server (previous test); two
      // replicas with affinity i → server i both get work
      assert.ok(logged[0] > 0 && logged[1] > 0, `both affinity targets served requests (${logged.join(', ')})`);
    } finally {
      await store.close();
    }
  },
);
