/**
 * The dev overlay (infra/k8s/overlays/dev), run as the cluster would run it — without a cluster.
 * `kubectl kustomize` renders it; every pod of its Deployments, StatefulSets and Job is started as
 * a local process from the rendered container command, args and env (Secret, ConfigMap and
 * downward-API values resolved from the rendered objects; test/support/k8s-local.ts), each with
 * its own volumes (no run directory is shared) and its own ports. The in-cluster Kafka and
 * PostgreSQL StatefulSets are the only workloads not started: their Services are mapped to the
 * librdkafka mock broker and a fresh database on the local PostgreSQL.
 *
 *  1. The migrate Job runs first and exits 0; the stages and the reward server start, every
 *     startup/liveness probe answers and every readiness probe turns ready, as the kubelet polls
 *     them; the run completes (rlstream_run_finished 1 on every stage, which then stays up idle
 *     and unready) with the same final checkpoint sha256 as the embedded run of the same config;
 *     SIGTERM (a `kubectl delete`) then stops every pod with exit 0 within its grace period.
 *  2. The same from scratch, and mid-run (after policy version 1) the update Deployment is rolled
 *     as its `Recreate` strategy does it, then the rollout StatefulSet's pod rollout-1: SIGTERM,
 *     exit 0 within the grace period, a new pod (same ordinal) with new, empty emptyDirs; the run
 *     completes with the same checkpoint.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { openStore } from '../../lib/store/index.ts';
import { freshDatabase, kafkaForRun } from '../../devkit/pipeline-procs.ts';
import { ROOT, renderOverlay, type K8sObject } from '../support/k8s-manifests.ts';
import {
  podsOf,
  probe,
  startPod,
  terminate,
  type Addresses,
  type LocalPod,
  type PodSpecOf,
} from '../support/k8s-local.ts';

const tmp = join(ROOT, 'test/.tmp', `k8s-manifests-${process.pid}`);
const live: LocalPod[] = [];
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const p of live)
    if (p.child.exitCode === null && p.child.signalCode === null) {
      try {
        p.child.kill('SIGKILL');
      } catch {
        /* gone */
      }
    }
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const objs = renderOverlay('dev');
const devConfigText = (
  objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('rlstream-config'))!.data as Record<
    string,
    string
  >
)['config.yaml'];
const runIdOf = () => /^\s*run_id:\s*(\S+)/m.exec(devConfigText)![1];
const isApp = (p: PodSpecOf) => p.template.spec.containers[0].image.startsWith('rlstream:');
const stageOf = (p: LocalPod) => (p.container.args?.[0] === 'serve' ? p.container.args[1] : null);
const outputs = (pods: readonly LocalPod[]) =>
  pods.map((p) => `--- ${p.spec.name} (${p.argv.slice(1).join(' ')})\n${p.output().slice(-2500)}`).join('\n');

async function until(
  what: string,
  ms: number,
  check: () => Promise<boolean>,
  pods: readonly LocalPod[] = [],
): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check().catch(() => false)) return;
    for (const p of pods)
      if (p.child.exitCode !== null || p.child.signalCode !== null)
        assert.fail(
          `${p.spec.name} exited (${p.child.exitCode ?? p.child.signalCode}) while waiting for ${what}:\n${outputs([p])}`,
        );
    await sleep(250);
  }
  assert.fail(`timed out after ${ms} ms waiting for ${what}\n${outputs(pods)}`);
}

async function metric(p: LocalPod, name: string): Promise<number | null> {
  const port = p.ports.get('metrics');
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(3000) })).text();
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : null;
}

/** One "cluster": the mock broker and a fresh database behind the Kafka and PostgreSQL Services. */
async function cluster(name: string): Promise<{ addr: Addresses; dbUrl: string }> {
  const runId = runIdOf();
  const partitions = Number(/^\s*partitions:\s*(\d+)/m.exec(devConfigText)![1]);
  const kafka = await kafkaForRun('rlstream', runId, partitions);
  cleanups.push(() => kafka.stop());
  const db = await freshDatabase(`rl_k8s_e2e_${name}_${process.pid}`);
  cleanups.push(db.drop);
  // the Services the dev overlay runs in-cluster, by name and port
  const svc = (n: string) =>
    objs.find((o) => o.kind === 'Service' && o.metadata.name === n) as K8sObject & {
      spec: { ports: Array<{ port: number }> };
    };
  const kafkaSvc = svc('kafka'),
    pgSvc = svc('postgres');
  assert.ok(kafkaSvc && pgSvc, 'the dev overlay runs Kafka and PostgreSQL Services');
  const services = new Map([[`kafka:${kafkaSvc.spec.ports[0].port}`, kafka.brokers.join(',')]]);
  const pgUrl = new RegExp(
    `postgres(?:ql)?://[^\\s@/]+@postgres(?:\\.[a-z0-9-]+)*:${pgSvc.spec.ports[0].port}/[^\\s"']*`,
    'g',
  );
  return { addr: { services, rewrite: (t) => t.replace(pgUrl, db.url) }, dbUrl: db.url };
}

async function start(pod: PodSpecOf, addr: Addresses, tag: string): Promise<LocalPod> {
  const dir = join(tmp, tag, pod.name);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const p = await startPod(objs, pod, dir, addr);
  live.push(p);
  return p;
}

/** Starts the overlay: the migrate Job to completion, then the reward server, then every stage pod; waits for every probe. */
async function startAll(addr: Addresses, tag: string): Promise<{ stages: LocalPod[]; servers: LocalPod[] }> {
  const pods = podsOf(objs);
  const notStarted = pods
    .filter((p) => !isApp(p))
    .map((p) => p.owner.metadata.name)
    .sort();
  assert.deepEqual(notStarted, ['kafka', 'postgres'], 'only Kafka and PostgreSQL are stood in for');
  const jobs = pods.filter((p) => isApp(p) && p.owner.kind === 'Job');
  assert.deepEqual(
    jobs.map((j) => j.owner.metadata.name),
    ['migrate'],
  );
  const job = await start(jobs[0], addr, tag);
  const done = await Promise.race([job.exit, sleep(120_000).then(() => null)]);
  assert.deepEqual(done, { code: 0, signal: null }, `the migrate Job completes:\n${outputs([job])}`);

  const servers: LocalPod[] = [];
  for (const p of pods.filter(
    (x) => isApp(x) && x.owner.kind !== 'Job' && !x.template.spec.containers[0].args?.includes('serve'),
  )) {
    const s = await start(p, addr, tag);
    servers.push(s);
    // the Service in front of it: `<service>:<port>` → this pod's local port
    for (const o of objs.filter((x) => x.kind === 'Service')) {
      const sel = (o.spec as { selector?: Record<string, string> }).selector ?? {};
      if (!Object.entries(sel).every(([k, v]) => p.template.metadata.labels?.[k] === v)) continue;
      for (const port of (o.spec as { ports: Array<{ port: number; targetPort: string | number }> }).ports) {
        addr.services.set(`${o.metadata.name}:${port.port}`, `127.0.0.1:${s.ports.get(String(port.targetPort))}`);
      }
    }
  }
  await until(
    'the reward server to be ready',
    60_000,
    async () => (await Promise.all(servers.map((s) => probe(s, 'readinessProbe')))).every((r) => r.ok),
    servers,
  );

  const stages: LocalPod[] = [];
  for (const p of pods.filter((x) => isApp(x) && x.template.spec.containers[0].args?.includes('serve')))
    stages.push(await start(p, addr, tag));
  assert.deepEqual(stages.map(stageOf).sort(), ['advantage', 'controller', 'reward', 'rollout', 'rollout', 'update']);
  // the StatefulSet pods got their ordinals as --replica
  assert.deepEqual(
    stages
      .filter((s) => stageOf(s) === 'rollout')
      .map((s) => s.argv[s.argv.indexOf('--replica') + 1])
      .sort(),
    ['0', '1'],
  );
  await until(
    'every stage to pass its startup and liveness probes',
    90_000,
    async () => {
      const r = await Promise.all(stages.flatMap((s) => [probe(s, 'startupProbe'), probe(s, 'livenessProbe')]));
      return r.every((x) => x.ok);
    },
    stages,
  );
  return { stages, servers };
}

/** Polls every stage's readiness probe until the run is finished; returns which stages were ever ready. */
async function waitForRunEnd(stages: LocalPod[], ms: number, whileWaiting?: () => Promise<void>): Promise<Set<string>> {
  const wasReady = new Set<string>();
  await until(
    'the run to finish on every stage',
    ms,
    async () => {
      await whileWaiting?.();
      for (const s of stages) if ((await probe(s, 'readinessProbe')).ok) wasReady.add(s.spec.name);
      const fin = await Promise.all(stages.map((s) => metric(s, 'rlstream_run_finished')));
      return fin.every((v) => v === 1);
    },
    stages,
  );
  return wasReady;
}

async function finalSha(url: string): Promise<string> {
  const store = await openStore({ kind: 'postgres', url });
  try {
    const run = await store.getRun(runIdOf());
    assert.equal(run?.status, 'completed', `run status ${run?.status}`);
    const ck = await store.latestCheckpoint(runIdOf());
    assert.ok(ck, 'the run recorded a checkpoint');
    return ck!.sha256;
  } finally {
    await store.close();
  }
}

async function stopAll(pods: LocalPod[]): Promise<void> {
  const ends = await Promise.all(pods.map(async (p) => ({ p, r: await terminate(p) })));
  for (const { p, r } of ends) {
    assert.equal(r.killed, false, `${p.spec.name} stopped within terminationGracePeriodSeconds`);
    assert.equal(r.code, 0, `${p.spec.name} exits 0 on SIGTERM (got ${r.code ?? r.signal}):\n${outputs([p])}`);
  }
}

test(
  'the dev overlay runs as local pods: migrate, probes, a completed run with the embedded checkpoint, graceful SIGTERM; and rolling restarts of update and rollout-1 mid-run',
  { timeout: 600_000 },
  async () => {
    // 1. the cluster run
    const a = await cluster('a');
    const { stages, servers } = await startAll(a.addr, 'a');
    const wasReady = await waitForRunEnd(stages, 240_000);
    assert.deepEqual(
      [...wasReady].sort(),
      stages.map((s) => s.spec.name).sort(),
      'every stage was ready (readiness probe 200) during the run',
    );
    for (const s of stages) {
      const r = await probe(s, 'readinessProbe');
      assert.equal(r.status, 503, `${s.spec.name}: unready once the run finished, and still up (${r.body})`);
      assert.ok((await probe(s, 'livenessProbe')).ok, `${s.spec.name}: alive while idle`);
    }
    const sha = await finalSha(a.dbUrl);
    // no shared run directory: each rollout pod read the policy versions from PostgreSQL into its own emptyDir
    for (const s of stages.filter((x) => stageOf(x) === 'rollout')) {
      const cache = join(tmp, 'a', s.spec.name, 'volumes/run/policy-cache');
      assert.ok(
        existsSync(cache) &&
          readdirSync(cache, { recursive: true }).some((f) => String(f).endsWith('model.safetensors')),
        `${s.spec.name} cached policy versions in its own ${cache}`,
      );
    }

    // the embedded run of the same config (the ConfigMap's file), scored by the same reward server
    const cfgFile = join(tmp, 'embedded.yaml');
    writeFileSync(
      cfgFile,
      a.addr
        .rewrite(devConfigText)
        .replace(/http:\/\/reward-server:8000/g, `http://${a.addr.services.get('reward-server:8000')}`),
    );
    const cfg = loadConfig({
      file: cfgFile,
      env: {},
      overrides: [
        'pipeline.bus=embedded',
        'pipeline.store=embedded',
        'pipeline.policy_store=filesystem',
        `trainer.run_dir=${join(tmp, 'embedded')}`,
      ],
    });
    const emb = await trainEmbedded(cfg, silentLogger(cfg.pipeline.run_id!));
    assert.equal(emb.status, 'completed', emb.message);
    const m = /sha256 ([0-9a-f]{64})/.exec(emb.summary);
    assert.ok(m, emb.summary);
    assert.equal(sha, m![1], "the manifests' run ends with the embedded run's checkpoint");
    await stopAll([...stages, ...servers]);

    // 2. again, and roll the update Deployment (strategy Recreate) and then rollout-1 (StatefulSet
    // RollingUpdate: the pod with that ordinal is stopped, then recreated) after policy version 1
    const b = await cluster('b');
    const second = await startAll(b.addr, 'b');
    const find = (stage: string, name?: string) =>
      second.stages.find((s) => stageOf(s) === stage && (name === undefined || s.spec.name === name))!;
    assert.equal((find('update').spec.owner.spec as { strategy: { type: string } }).strategy.type, 'Recreate');
    assert.equal(
      (find('rollout').spec.owner.spec as { updateStrategy: { type: string } }).updateStrategy.type,
      'RollingUpdate',
    );
    const roll = async (old: LocalPod) => {
      const r = await terminate(old);
      assert.equal(r.killed, false, `the old ${old.spec.name} stopped within its grace period`);
      assert.equal(r.code, 0, `the old ${old.spec.name} exits 0 on SIGTERM mid-run:\n${outputs([old])}`);
      second.stages.splice(second.stages.indexOf(old), 1);
      second.stages.push(await start(old.spec, b.addr, `b-rolled-${old.spec.name}`)); // new pod: new, empty emptyDirs
    };
    const rolled: string[] = [];
    await waitForRunEnd(second.stages, 300_000, async () => {
      if (rolled.length || ((await metric(find('update'), 'rlstream_policy_version')) ?? 0) < 1) return;
      assert.notEqual(await metric(find('update'), 'rlstream_run_finished'), 1, 'rolled before the run finished');
      for (const old of [find('update'), find('rollout', 'rollout-1')]) {
        await roll(old);
        rolled.push(old.spec.name);
      }
    });
    assert.deepEqual(rolled, ['update-0-local', 'rollout-1'], 'update and rollout-1 were rolled mid-run');
    assert.equal(await finalSha(b.dbUrl), sha, 'after the rolling restarts the run ends with the same checkpoint');
    await stopAll([...second.stages, ...second.servers]);
  },
);
