/**
 * The dev overlay (infra/k8s/overlays/dev) with a user's own model, data and reward, run as the
 * cluster would run it — without a cluster. `kubectl kustomize` renders the dev overlay with the
 * assets component of infra/k8s/examples/own-model (every stage's init container fetches the model
 * directory and the parquet data with `rlstream fetch`, each file checked against SHA256SUMS), the
 * dev run's config pointed at those assets and at the reward module of the example's derived image
 * (image/Dockerfile: its COPY lines laid out as the image has them), and the S3 credentials
 * Secret. Every pod of its Deployments, StatefulSets and Job is started as a local process from
 * the rendered init containers' and container's command, args and env (Secret, ConfigMap and
 * downward-API values resolved from the rendered objects; test/support/k8s-local.ts), each with its
 * own volumes (no run directory is shared) and its own ports. The in-cluster Kafka and PostgreSQL
 * StatefulSets are the only workloads not started: their Services are mapped to the librdkafka
 * mock broker and a fresh database on the local PostgreSQL; the bucket is s3rver, reached as an
 * in-cluster `s3` Service (AWS_ENDPOINT_URL in the Secret).
 *
 *  The migrate Job runs first and exits 0; every stage pod's init step fetches and verifies the
 *  assets; the reward server and the stages start, every startup/liveness probe answers and every
 *  readiness probe turns ready, as the kubelet polls them. Mid-run, a stage pod chosen by a seeded
 *  draw is SIGKILLed at a seeded moment (a policy version plus a delay) and replaced by a new pod
 *  (new emptyDirs: it fetches the assets again), while `rlstream runs` still lists the run as
 *  running; after policy version 1 the update Deployment is rolled as its `Recreate` strategy does
 *  it, then the rollout StatefulSet's pod rollout-1 (SIGTERM, exit 0 within the grace period, a new
 *  pod of the same ordinal). The run completes (rlstream_run_finished 1 on every stage, which then
 *  stays up idle and unready; `rlstream runs`: finished) with the same final checkpoint sha256 as
 *  the undisturbed embedded run of the same config on the same files; SIGTERM (a `kubectl delete`)
 *  stops every pod with exit 0 within its grace period. RLSTREAM_K8S_KILL_SEED draws another kill.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { parse, stringify } from 'yaml';
import { loadConfig } from '../../lib/config/index.ts';
import { trainEmbedded } from '../../app/run.ts';
import { silentLogger } from '../../lib/log.ts';
import { Rng } from '../../lib/util/rng.ts';
import { openStore } from '../../lib/store/index.ts';
import { openDatabase } from '../../lib/db/database.ts';
import { listRunsInDatabase } from '../../lib/analysis/runs.ts';
import { freshDatabase, kafkaForRun } from '../../devkit/pipeline-procs.ts';
import { startLocalS3 } from '../../devkit/s3-local.ts';
import { K8S, ROOT, render, renderOverlay, type K8sObject } from '../support/k8s-manifests.ts';
import {
  derivedImageFiles,
  fetchSteps,
  uploadWithSums,
  writeModelDir,
  writeTrainParquet,
} from '../support/k8s-assets.ts';
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
const EXAMPLE = join(K8S, 'examples/own-model');
const IMAGE_FILES = derivedImageFiles(join(EXAMPLE, 'image/Dockerfile'));
/** The Secret the assets component's pods read their S3 credentials from, and the in-cluster S3 Service it names. */
const S3_SERVICE = 's3:9000';

/**
 * The run: the dev overlay's (its data shape, model size, wiring) on the example's asset paths —
 * the fetched model directory and parquet file, the derived image's reward module — with one epoch
 * of the 32-row parquet file (8 steps) instead of the overlay's 4, so that the seeded kill and the
 * rolling restarts (at policy versions ≤ 2) leave the replaced pods steps to sample.
 */
function assetsConfig(): string {
  const dev = parse(
    (
      renderOverlay('dev').find((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('rlstream-config'))!
        .data as Record<string, string>
    )['config.yaml'],
  );
  const example = parse(readFileSync(join(EXAMPLE, 'config.yaml'), 'utf8'));
  const { task: _task, task_size: _size, ...data } = dev.data;
  return stringify({
    ...dev,
    data: {
      ...data,
      train_files: example.data.train_files,
      prompt_key: example.data.prompt_key,
      answer_key: example.data.answer_key,
    },
    actor: { ...dev.actor, model: { path: example.actor.model.path, tokenizer: 'byte' } },
    reward: { type: 'function', reward_fn_path: example.reward.reward_fn_path },
    trainer: { ...dev.trainer, max_steps: 8 },
  });
}

/** The dev overlay + the example's assets component + that config + the S3 Secret, rendered. */
function renderDevWithAssets(): K8sObject[] {
  const dir = join(tmp, 'kustomize');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'config.yaml'), assetsConfig());
  const rel = (p: string) => relative(dir, p);
  writeFileSync(
    join(dir, 'kustomization.yaml'),
    stringify({
      apiVersion: 'kustomize.config.k8s.io/v1beta1',
      kind: 'Kustomization',
      resources: [rel(join(K8S, 'overlays/dev'))],
      components: [rel(join(EXAMPLE, 'assets'))],
      configMapGenerator: [{ name: 'rlstream-config', behavior: 'replace', files: ['config.yaml'] }],
      secretGenerator: [
        {
          // the name the example's Secret has (kubectl create secret generic rlstream-s3)
          name: 'rlstream-s3',
          options: { disableNameSuffixHash: true },
          literals: [
            'AWS_ACCESS_KEY_ID=S3RVER',
            'AWS_SECRET_ACCESS_KEY=S3RVER',
            `AWS_ENDPOINT_URL=http://${S3_SERVICE}`,
          ],
        },
      ],
    }),
  );
  return render(dir);
}

const objs = renderDevWithAssets();
const devConfigText = (
  objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('rlstream-config'))!.data as Record<
    string,
    string
  >
)['config.yaml'];
const ASSETS = '/var/lib/rlstream/assets';
/** The user's files, as on their disk before the upload: <source>/model/, <source>/data/train.parquet. */
const source = join(tmp, 'source');
const localPaths = (text: string) => {
  let out = text.replaceAll(ASSETS, source);
  for (const [inImage, local] of IMAGE_FILES) out = out.replaceAll(inImage, local);
  return out;
};

/** The user's model directory and parquet file, uploaded with their SHA256SUMS where the init step fetches them. */
async function bucket(): Promise<string> {
  writeModelDir(join(source, 'model'), 5);
  writeTrainParquet(join(source, 'data/train.parquet'), 32);
  const init = podsOf(objs).find((p) => p.owner.metadata.name === 'controller')!.template.spec.initContainers![0];
  const steps = fetchSteps([...(init.command ?? []), ...(init.args ?? [])]);
  assert.deepEqual(
    steps.map((x) => x.dest),
    [`${ASSETS}/model`, `${ASSETS}/data`],
  );
  const name = /^s3:\/\/([^/]+)\//.exec(steps[0].src)![1];
  const s3 = await startLocalS3(name);
  cleanups.push(() => s3.close());
  for (const st of steps) await uploadWithSums(s3.client, st.src, localPaths(st.dest));
  return new URL(s3.endpoint).host;
}
const s3Host = bucket();

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
  const services = new Map([
    [`kafka:${kafkaSvc.spec.ports[0].port}`, kafka.brokers.join(',')],
    [S3_SERVICE, await s3Host],
  ]);
  const pgUrl = new RegExp(
    `postgres(?:ql)?://[^\\s@/]+@postgres(?:\\.[a-z0-9-]+)*:${pgSvc.spec.ports[0].port}/[^\\s"']*`,
    'g',
  );
  return { addr: { services, rewrite: (t) => t.replace(pgUrl, db.url) }, dbUrl: db.url };
}

const podDir = new Map<LocalPod, string>();
async function start(pod: PodSpecOf, addr: Addresses, tag: string): Promise<LocalPod> {
  const dir = join(tmp, tag, pod.name);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const p = await startPod(objs, pod, dir, addr, { imageFiles: IMAGE_FILES });
  live.push(p);
  podDir.set(p, dir);
  // a stage pod's init step fetched the model and the data, every file sha256-verified
  if (pod.template.spec.initContainers?.length) {
    assert.deepEqual(
      p.inits.map((i) => i.name),
      ['fetch-assets'],
    );
    assert.equal(
      p.inits[0].output.match(/\d+ file\(s\) fetched .* all sha256-verified/g)?.length,
      2,
      p.inits[0].output,
    );
  }
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

  // the stage pods start together, as a cluster starts them (each fetching its assets first)
  const stages = await Promise.all(
    pods
      .filter((x) => isApp(x) && x.template.spec.containers[0].args?.includes('serve'))
      .map((p) => start(p, addr, tag)),
  );
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
      await noteReady(stages);
      return r.every((x) => x.ok);
    },
    stages,
  );
  return { stages, servers };
}

/** Stages (by pod name) whose readiness probe answered 200 while the run went on. */
const wasReady = new Set<string>();
async function noteReady(stages: readonly LocalPod[]): Promise<void> {
  const r = await Promise.all(stages.map((s) => probe(s, 'readinessProbe')));
  r.forEach((x, i) => x.ok && wasReady.add(stages[i].spec.name));
}

/** Polls every stage's readiness probe until the run is finished. */
async function waitForRunEnd(stages: LocalPod[], ms: number, whileWaiting?: () => Promise<void>): Promise<void> {
  await until(
    'the run to finish on every stage',
    ms,
    async () => {
      await whileWaiting?.();
      await noteReady(stages);
      const fin = await Promise.all(stages.map((s) => metric(s, 'rlstream_run_finished')));
      return fin.every((v) => v === 1);
    },
    stages,
  );
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

/** The run's status as `rlstream runs --db` lists it. */
async function runsStatus(url: string): Promise<string> {
  const database = await openDatabase({ kind: 'postgres', url, poolSize: 1 }, { migrate: false });
  try {
    const [row] = await listRunsInDatabase(database, null, runIdOf());
    return row?.status ?? 'no row';
  } finally {
    await database.close();
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
  "the dev overlay with its own model, data and reward as local pods: init fetch, migrate, probes; a seeded SIGKILL and rolling restarts mid-run; the undisturbed embedded run's checkpoint; graceful SIGTERM",
  { timeout: 600_000 },
  async (t) => {
    const c = await cluster('a');
    const { stages, servers } = await startAll(c.addr, 'a');
    const find = (stage: string, name?: string) =>
      stages.find((s) => stageOf(s) === stage && (name === undefined || s.spec.name === name))!;
    assert.equal((find('update').spec.owner.spec as { strategy: { type: string } }).strategy.type, 'Recreate');
    assert.equal(
      (find('rollout').spec.owner.spec as { updateStrategy: { type: string } }).updateStrategy.type,
      'RollingUpdate',
    );
    // the disturbance: a seeded draw picks a stage pod, a policy version and a delay after it;
    // that pod is SIGKILLed then and replaced by a new pod (new emptyDirs: its init step fetches
    // the assets again). After policy version 1 the update Deployment (strategy Recreate) and then
    // rollout-1 (StatefulSet RollingUpdate: the pod with that ordinal is stopped, then recreated)
    // are rolled.
    const seed = process.env.RLSTREAM_K8S_KILL_SEED ?? 'k8s-kill-1';
    const rng = Rng.fromSeed(seed);
    const names = stages.map((s) => s.spec.name).sort();
    const kill = { pod: names[rng.int(names.length)], version: rng.int(3), delayMs: rng.int(2000) };
    const drawn = `seed ${seed}: SIGKILL ${kill.pod} ${kill.delayMs} ms after policy version ${kill.version}`;
    const ran = [...stages]; // every stage pod of this run, the replaced ones too
    const replace = async (old: LocalPod, tag: string) => {
      stages.splice(stages.indexOf(old), 1);
      stages.push(await start(old.spec, c.addr, `a-${tag}`)); // new pod: new, empty emptyDirs
      ran.push(stages.at(-1)!);
    };
    const rolled: string[] = [];
    let killAt: number | undefined;
    let killed: { atVersion: number; runsWhileGone: string } | undefined;
    await waitForRunEnd(stages, 300_000, async () => {
      const version = (await metric(find('update'), 'rlstream_policy_version')) ?? 0;
      if (!killed && version >= kill.version) {
        killAt ??= Date.now() + kill.delayMs;
        if (Date.now() >= killAt) {
          const victim = stages.find((s) => s.spec.name === kill.pod)!;
          victim.child.kill('SIGKILL');
          killed = { atVersion: version, runsWhileGone: '' };
          assert.deepEqual(await victim.exit, { code: null, signal: 'SIGKILL' });
          killed.runsWhileGone = await runsStatus(c.dbUrl);
          await replace(victim, 'killed');
        }
      }
      if (rolled.length || version < 1) return;
      assert.notEqual(await metric(find('update'), 'rlstream_run_finished'), 1, 'rolled before the run finished');
      for (const old of [find('update'), find('rollout', 'rollout-1')]) {
        rolled.push(old.spec.name);
        const r = await terminate(old);
        assert.equal(r.killed, false, `the old ${old.spec.name} stopped within its grace period`);
        assert.equal(r.code, 0, `the old ${old.spec.name} exits 0 on SIGTERM mid-run:\n${outputs([old])}`);
        await replace(old, 'rolled');
      }
    });
    assert.ok(killed, `the run finished before the drawn kill (${drawn})`);
    assert.equal(killed!.runsWhileGone, 'running', `rlstream runs while ${kill.pod} was gone (${drawn})`);
    assert.deepEqual(rolled, ['update-0-local', 'rollout-1'], 'update and rollout-1 were rolled mid-run');
    assert.deepEqual([...wasReady].sort(), names, 'every stage pod was ready (readiness probe 200) during the run');
    for (const s of stages) {
      const r = await probe(s, 'readinessProbe');
      assert.equal(r.status, 503, `${s.spec.name}: unready once the run finished, and still up (${r.body})`);
      assert.ok((await probe(s, 'livenessProbe')).ok, `${s.spec.name}: alive while idle`);
    }
    // no shared run directory: the rollout pods read the policy versions from PostgreSQL into their
    // own emptyDirs. Every rollout pod of the run counts, the replaced ones too: a pod started late
    // in the run may have had no prompt left to sample.
    const cached = ran
      .filter((x) => stageOf(x) === 'rollout')
      .map((s) => join(podDir.get(s)!, 'volumes/run/policy-cache'))
      .filter(
        (d) =>
          existsSync(d) && readdirSync(d, { recursive: true }).some((f) => String(f).endsWith('model.safetensors')),
      );
    t.diagnostic(`rollout pods with cached versions: ${cached.map((d) => relative(tmp, d)).join(', ')}`);
    assert.ok(cached.length >= 1, 'a rollout pod cached policy versions in its own emptyDir');
    const sha = await finalSha(c.dbUrl);
    assert.equal(await runsStatus(c.dbUrl), 'finished', 'rlstream runs shows the run finished');
    await stopAll([...stages, ...servers]);
    assert.equal(await runsStatus(c.dbUrl), 'finished', 'still finished once every stage was stopped');

    // the undisturbed reference: the embedded run of the same config (the ConfigMap's file) on the
    // user's own files (the model directory and parquet file before the upload, the image's module)
    const cfgFile = join(tmp, 'embedded.yaml');
    writeFileSync(cfgFile, localPaths(c.addr.rewrite(devConfigText)));
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
    assert.equal(
      sha,
      m![1],
      `after the kill (${drawn}) and the rolling restarts the manifests' run ends with the undisturbed embedded run's checkpoint`,
    );
  },
);
