/**
 * Static checks over the rendered overlays: every pod is hardened (non-root, read-only root
 * filesystem with writable emptyDirs, ALL capabilities dropped, RuntimeDefault seccomp, no
 * privilege escalation), has requests and limits, probes on the stage's HTTP endpoints, scrape
 * annotations that match, and a grace period above the app's; the stages' wiring matches the
 * run config (single-writer stages, replicas and partitions, PDBs, Secret and ConfigMap
 * references, the KEDA triggers' topics and consumer groups). And compose.yaml's app profile.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { parse } from 'yaml';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { topicName } from '../../../lib/contracts/index.ts';
import {
  ROOT,
  OVERLAYS,
  podTemplates,
  renderOverlay,
  renderWithComponents,
  describeObject,
  type K8sObject,
  type Container,
} from '../../support/k8s-manifests.ts';

const STAGES = ['controller', 'rollout', 'reward', 'advantage', 'update'];
/** Third-party dev-only pods allowed a writable root filesystem, each saying why in this annotation. */
const WRITABLE_ROOT = 'rlstream.io/writable-root-filesystem';

function configOf(objs: readonly K8sObject[], env: Record<string, string> = {}) {
  const cm = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name.startsWith('rlstream-config'));
  assert.ok(cm, 'a rlstream-config ConfigMap');
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-k8s-config-'));
  try {
    const file = join(dir, 'config.yaml');
    writeFileSync(file, (cm!.data as Record<string, string>)['config.yaml']);
    return loadConfig({
      file,
      env: { RLSTREAM_PIPELINE__DATABASE_URL: 'postgres://u@h/d', RLSTREAM_PIPELINE__BROKERS: '[k:9092]', ...env },
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const stageOf = (c: Container) => (c.args?.[0] === 'serve' ? c.args[1] : undefined);

for (const overlay of OVERLAYS) {
  const objs = renderOverlay(overlay);
  const cfg = configOf(objs);
  const pods = podTemplates(objs);

  test(`${overlay}: every pod is hardened and has requests and limits`, () => {
    assert.ok(pods.length >= 7, `${pods.length} pod templates`);
    for (const { owner, template } of pods) {
      const where = describeObject(owner);
      const spec = template.spec;
      assert.equal(spec.securityContext?.runAsNonRoot, true, `${where}: pod runAsNonRoot`);
      assert.ok((spec.securityContext?.runAsUser ?? 0) > 0, `${where}: pod runAsUser is a non-zero uid`);
      assert.equal(
        spec.securityContext?.seccompProfile?.type,
        'RuntimeDefault',
        `${where}: pod seccompProfile RuntimeDefault`,
      );
      assert.equal(
        spec.automountServiceAccountToken,
        false,
        `${where}: no service account token (nothing here talks to the API server)`,
      );
      assert.ok(
        spec.serviceAccountName &&
          objs.some((o) => o.kind === 'ServiceAccount' && o.metadata.name === spec.serviceAccountName),
        `${where}: its own ServiceAccount`,
      );
      assert.ok(typeof spec.terminationGracePeriodSeconds === 'number', `${where}: terminationGracePeriodSeconds`);
      const writable = template.metadata.annotations?.[WRITABLE_ROOT];
      for (const c of [...spec.containers, ...(spec.initContainers ?? [])]) {
        const at = `${where} container ${c.name}`;
        const sc = c.securityContext ?? {};
        assert.equal(sc.allowPrivilegeEscalation, false, `${at}: allowPrivilegeEscalation false`);
        assert.equal(sc.runAsNonRoot, true, `${at}: runAsNonRoot`);
        assert.deepEqual(sc.capabilities?.drop, ['ALL'], `${at}: drops ALL capabilities`);
        assert.equal(sc.capabilities?.add, undefined, `${at}: adds no capability`);
        assert.notEqual(sc.privileged, true, `${at}: not privileged`);
        assert.equal(sc.seccompProfile?.type, 'RuntimeDefault', `${at}: seccompProfile RuntimeDefault`);
        if (writable === undefined) assert.equal(sc.readOnlyRootFilesystem, true, `${at}: readOnlyRootFilesystem`);
        else
          assert.ok(
            writable.length > 20 && !(template.metadata.labels?.['app.kubernetes.io/name'] === 'rlstream'),
            `${at}: only a third-party dev pod may keep a writable root, saying why`,
          );
        for (const k of ['cpu', 'memory']) {
          assert.ok(c.resources?.requests?.[k] !== undefined, `${at}: requests.${k}`);
          assert.ok(c.resources?.limits?.[k] !== undefined, `${at}: limits.${k}`);
        }
        // every writable mount is an emptyDir or a claim; /tmp is writable
        const volumes = new Map((spec.volumes ?? []).map((v) => [v.name, v]));
        for (const m of c.volumeMounts ?? []) {
          const v = volumes.get(m.name);
          const claimed = (
            owner.spec as { volumeClaimTemplates?: Array<{ metadata: { name: string } }> }
          ).volumeClaimTemplates?.some((t) => t.metadata.name === m.name);
          assert.ok(v || claimed, `${at}: mount ${m.name} has a volume`);
          if (v?.configMap || v?.secret)
            assert.equal(m.readOnly, true, `${at}: ${m.mountPath} (config) is mounted read-only`);
        }
        assert.ok(
          (c.volumeMounts ?? []).some((m) => m.mountPath === '/tmp' && volumes.get(m.name)?.emptyDir),
          `${at}: an emptyDir at /tmp`,
        );
        assert.ok(!/:latest$/.test(c.image) && /:[^/]+$/.test(c.image), `${at}: image ${c.image} has a pinned tag`);
      }
    }
  });

  test(`${overlay}: every long-running pod has probes, and scrape annotations that match its endpoints`, () => {
    for (const { owner, template } of pods) {
      const where = describeObject(owner);
      const scrape = template.metadata.annotations?.['prometheus.io/scrape'];
      assert.ok(
        scrape === 'true' || scrape === 'false',
        `${where}: prometheus.io/scrape is "true" or "false", got ${scrape}`,
      );
      if (owner.kind === 'Job') continue; // runs to completion: no probes
      for (const c of template.spec.containers) {
        for (const p of ['livenessProbe', 'readinessProbe'] as const) assert.ok(c[p], `${where} ${c.name}: ${p}`);
        const stage = stageOf(c);
        if (stage) {
          assert.ok(c.command?.[0] === 'rlstream', `${where}: runs the rlstream entrypoint`);
          const port = c.ports?.find((p) => p.name === 'metrics');
          assert.equal(port?.containerPort, cfg.pipeline.http_port, `${where}: port "metrics" is pipeline.http_port`);
          assert.ok(
            c.args!.includes('--http-port') &&
              c.args![c.args!.indexOf('--http-port') + 1] === String(port!.containerPort),
            `${where}: --http-port matches the container port`,
          );
          assert.equal(c.livenessProbe!.httpGet?.path, '/healthz', `${where}: liveness on /healthz`);
          assert.equal(c.readinessProbe!.httpGet?.path, '/readyz', `${where}: readiness on /readyz`);
          assert.equal(c.startupProbe?.httpGet?.path, '/healthz', `${where}: startup on /healthz`);
          for (const p of [c.livenessProbe!, c.readinessProbe!]) assert.equal(p.httpGet!.port, 'metrics');
          assert.equal(scrape, 'true', `${where}: scraped`);
          assert.equal(
            template.metadata.annotations?.['prometheus.io/port'],
            String(port!.containerPort),
            `${where}: prometheus.io/port`,
          );
          assert.equal(
            template.metadata.annotations?.['prometheus.io/path'],
            '/metrics',
            `${where}: prometheus.io/path`,
          );
          // the app's SIGTERM deadline must end before the kubelet's SIGKILL
          assert.ok(
            template.spec.terminationGracePeriodSeconds! > cfg.pipeline.grace_seconds,
            `${where}: terminationGracePeriodSeconds ${template.spec.terminationGracePeriodSeconds} > pipeline.grace_seconds ${cfg.pipeline.grace_seconds}`,
          );
        }
      }
    }
  });

  test(`${overlay}: the stages, their replicas and disruption budgets fit the run config`, () => {
    const byStage = new Map<string, K8sObject>();
    for (const { owner, template } of pods)
      for (const c of template.spec.containers) {
        const s = stageOf(c);
        if (s) byStage.set(s, owner);
      }
    assert.deepEqual([...byStage.keys()].sort(), [...STAGES].sort(), 'one workload per stage');
    for (const s of ['controller', 'advantage', 'update']) {
      const w = byStage.get(s)!;
      const spec = w.spec as { replicas: number; strategy?: { type: string } };
      assert.equal(w.kind, 'Deployment', `${s} is a Deployment`);
      assert.equal(spec.replicas, 1, `${s}: one replica`);
      assert.equal(spec.strategy?.type, 'Recreate', `${s}: strategy Recreate (never two at once)`);
    }
    for (const s of ['rollout', 'reward']) {
      const w = byStage.get(s)!;
      const spec = w.spec as { replicas: number; serviceName: string; template: { spec: { containers: Container[] } } };
      assert.equal(w.kind, 'StatefulSet', `${s}: a StatefulSet (each pod its own --replica ordinal)`);
      assert.ok(
        objs.some((o) => o.kind === 'Service' && o.metadata.name === spec.serviceName),
        `${s}: its governing Service exists`,
      );
      const c = spec.template.spec.containers[0];
      assert.equal(
        c.args![c.args!.indexOf('--replica') + 1],
        '$(RLSTREAM_REPLICA)',
        `${s}: --replica from the pod's ordinal`,
      );
      assert.equal(
        c.env!.find((e) => e.name === 'RLSTREAM_REPLICA')?.valueFrom?.fieldRef?.fieldPath,
        "metadata.labels['apps.kubernetes.io/pod-index']",
      );
      assert.ok(
        spec.replicas <= cfg.pipeline.partitions,
        `${s}: ${spec.replicas} replicas <= pipeline.partitions ${cfg.pipeline.partitions} (an extra replica would stay unready)`,
      );
      const pdb = objs.find(
        (o) =>
          o.kind === 'PodDisruptionBudget' &&
          JSON.stringify((o.spec as { selector: unknown }).selector) ===
            JSON.stringify({ matchLabels: (w.spec as { selector: { matchLabels: unknown } }).selector.matchLabels }),
      );
      assert.ok(pdb, `${s}: a PodDisruptionBudget selects its pods`);
    }
    assert.equal(cfg.pipeline.bus, 'kafka');
    assert.equal(cfg.pipeline.store, 'postgres');
    assert.equal(cfg.pipeline.policy_store, 'postgres', 'no shared volume: policy versions in PostgreSQL');
    for (const kind of ['PersistentVolumeClaim'])
      assert.ok(!objs.some((o) => o.kind === kind), 'no shared volume claim');
    for (const w of byStage.values()) {
      const vols = (
        w.spec as {
          template: { spec: { volumes: Array<{ name: string; emptyDir?: object; persistentVolumeClaim?: object }> } };
        }
      ).template.spec.volumes;
      assert.ok(!vols.some((v) => v.persistentVolumeClaim), `${describeObject(w)}: no persistent volume`);
    }
    assert.ok(
      cfg.trainer.run_dir?.startsWith('/var/lib/rlstream/') &&
        cfg.pipeline.policy_cache_dir?.startsWith('/var/lib/rlstream/'),
      'run_dir and the policy cache are on the "run" emptyDir',
    );
  });

  test(`${overlay}: every Secret and ConfigMap a pod reads is rendered or is the documented external Secret`, () => {
    const names = new Set(
      objs.filter((o) => o.kind === 'Secret' || o.kind === 'ConfigMap').map((o) => `${o.kind}/${o.metadata.name}`),
    );
    for (const { owner, template } of pods) {
      for (const c of template.spec.containers) {
        for (const e of c.env ?? []) {
          const ref = e.valueFrom?.secretKeyRef;
          if (!ref) continue;
          const rendered = objs.find((o) => o.kind === 'Secret' && o.metadata.name === ref.name);
          if (rendered)
            assert.ok(
              ref.key in (rendered.data as object),
              `${describeObject(owner)}: Secret ${ref.name} has key ${ref.key}`,
            );
          else {
            assert.equal(overlay, 'prod', `${describeObject(owner)}: Secret ${ref.name} is not rendered`);
            assert.equal(ref.name, 'rlstream-credentials', 'prod reads the documented external Secret');
            assert.ok(['database-url', 'kafka-brokers'].includes(ref.key), `documented key ${ref.key}`);
          }
        }
      }
      for (const v of template.spec.volumes ?? [])
        if (v.configMap)
          assert.ok(
            names.has(`ConfigMap/${v.configMap.name}`),
            `${describeObject(owner)}: ConfigMap ${v.configMap.name} is rendered`,
          );
    }
  });
}

test('dev: the in-cluster Secret wires the stages to the in-cluster Kafka and PostgreSQL Services', () => {
  const objs = renderOverlay('dev');
  const secret = objs.find((o) => o.kind === 'Secret' && o.metadata.name.startsWith('rlstream-credentials'))!;
  const data = Object.fromEntries(
    Object.entries(secret.data as Record<string, string>).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]),
  );
  const cfg = configOf(objs, {
    RLSTREAM_PIPELINE__DATABASE_URL: data['database-url'],
    RLSTREAM_PIPELINE__BROKERS: data['kafka-brokers'],
  });
  const svc = (name: string, port: number) =>
    objs.some(
      (o) =>
        o.kind === 'Service' &&
        o.metadata.name === name &&
        (o.spec as { ports: Array<{ port: number }> }).ports.some((p) => p.port === port),
    );
  for (const b of cfg.pipeline.brokers) {
    const [h, p] = b.split(':');
    assert.ok(svc(h, Number(p)), `broker ${b} is a Service`);
  }
  const db = new URL(cfg.pipeline.database_url!);
  assert.ok(svc(db.hostname, Number(db.port)), `database ${db.host} is a Service`);
  assert.equal(
    decodeURIComponent(db.password),
    data['postgres-password'],
    'the database URL carries the password PostgreSQL is started with',
  );
  for (const u of cfg.reward.remote.urls ?? []) {
    const url = new URL(u);
    assert.ok(svc(url.hostname, Number(url.port)), `reward server ${u} is a Service`);
  }
});

test('dev: the KRaft Kafka is configured as kafka-storage needs (a 16-byte cluster id) and advertises its Service', () => {
  const kafka = renderOverlay('dev').find((o) => o.kind === 'StatefulSet' && o.metadata.name === 'kafka')!;
  const env = Object.fromEntries(
    podTemplates([kafka])[0].template.spec.containers[0].env!.map((e) => [e.name, e.value]),
  );
  assert.equal(Buffer.from(env.CLUSTER_ID!, 'base64url').length, 16, 'CLUSTER_ID is a base64url UUID');
  assert.match(env.KAFKA_ADVERTISED_LISTENERS!, /^PLAINTEXT:\/\/kafka:9092$/);
  assert.equal(
    env.KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR,
    '1',
    'one broker: replication factor 1 for the internal topics',
  );
});

test('keda: the ScaledObjects scale the rollout and reward StatefulSets on their own topics and consumer groups', () => {
  const objs = renderWithComponents('infra/k8s/overlays/prod', ['infra/k8s/components/keda']);
  const cfg = configOf(objs);
  const runId = cfg.pipeline.run_id!;
  for (const [stage, topic] of [
    ['rollout', 'prompts'],
    ['reward', 'trajectories'],
  ] as const) {
    const so = objs.find((o) => o.kind === 'ScaledObject' && o.metadata.name === stage)!;
    const spec = so.spec as {
      scaleTargetRef: { kind: string; name: string };
      maxReplicaCount: number;
      triggers: Array<{ metadata: Record<string, string> }>;
    };
    assert.ok(
      objs.some((o) => o.kind === spec.scaleTargetRef.kind && o.metadata.name === spec.scaleTargetRef.name),
      `${stage}: the target ${spec.scaleTargetRef.kind}/${spec.scaleTargetRef.name} exists`,
    );
    assert.equal(spec.triggers[0].metadata.topic, topicName(cfg.pipeline.topic_prefix, runId, topic));
    assert.equal(
      spec.triggers[0].metadata.consumerGroup,
      `${runId}.${stage}`,
      "the stage's consumer group (lib/pipeline/runtime.ts)",
    );
    assert.ok(spec.maxReplicaCount <= cfg.pipeline.partitions, 'never more replicas than partitions');
  }
});

test('compose.yaml: the app profile runs migrate, a reward server and the five stages, hardened, against its own Kafka and PostgreSQL', () => {
  const compose = parse(readFileSync(join(ROOT, 'compose.yaml'), 'utf8'), { merge: true }) as {
    services: Record<
      string,
      {
        image?: string;
        profiles?: string[];
        command?: string[];
        environment?: Record<string, string>;
        volumes?: string[];
        user?: string;
        read_only?: boolean;
        cap_drop?: string[];
        healthcheck?: object;
        depends_on?: Record<string, { condition: string }>;
      }
    >;
  };
  const app = Object.entries(compose.services).filter(([, s]) => s.profiles?.includes('app'));
  const stages = app
    .filter(([, s]) => s.command?.[0] === 'serve')
    .map(([, s]) => s.command![1])
    .sort();
  assert.deepEqual(stages, ['advantage', 'controller', 'reward', 'rollout', 'rollout', 'update']);
  assert.ok(
    app.some(([, s]) => s.command?.[0] === 'migrate') && app.some(([, s]) => s.command?.[0] === 'reward-server'),
  );
  for (const [name, s] of app) {
    assert.equal(s.image, 'rlstream:dev', `${name}: the image the Dockerfile builds`);
    assert.ok(s.user && !s.user.startsWith('0'), `${name}: non-root`);
    assert.equal(s.read_only, true, `${name}: read-only root`);
    assert.deepEqual(s.cap_drop, ['ALL'], `${name}: no capabilities`);
    if (s.command?.[0] !== 'migrate') assert.ok(s.healthcheck, `${name}: a healthcheck`);
    if (s.command?.[0] === 'serve')
      assert.equal(
        s.depends_on?.migrate?.condition,
        'service_completed_successfully',
        `${name}: starts after the migration`,
      );
  }
  for (const [name, s] of Object.entries(compose.services).filter(([, x]) => !x.profiles))
    assert.ok(s.healthcheck && /:\d/.test(s.image ?? ''), `${name}: pinned image with a healthcheck`);
  // the config it mounts loads with its environment, and names its services
  const [stageName, stage] = app.find(([, s]) => s.command?.[0] === 'serve')!;
  const mount = stage.volumes!.find((v) => v.includes(':/etc/rlstream/config.yaml'))!;
  const cfg = loadConfig({ file: join(ROOT, mount.split(':')[0]), env: stage.environment as Record<string, string> });
  const host = (a: string) => a.replace(/^\w+:\/\/([^@/]*@)?/, '').split(/[:/]/)[0];
  for (const a of [...cfg.pipeline.brokers, cfg.pipeline.database_url!, ...(cfg.reward.remote.urls ?? [])])
    assert.ok(host(a) in compose.services, `${stageName}: ${a} is a compose service`);
});

test('GPU placement is opt-in: no overlay asks for GPU nodes; components/gpu-nodes puts the policy stages there', () => {
  const gpuAsk = (t: { spec: Record<string, unknown> }) =>
    JSON.stringify([t.spec.nodeSelector ?? null, t.spec.tolerations ?? null, t.spec.affinity ?? null]).includes(
      'gpu',
    ) || JSON.stringify(t.spec.containers).includes('nvidia.com/gpu');
  for (const overlay of OVERLAYS)
    for (const { owner, template } of podTemplates(renderOverlay(overlay)))
      assert.ok(!gpuAsk(template as never), `${overlay}: ${describeObject(owner)} asks for a GPU node by default`);
  const placed = podTemplates(renderWithComponents('infra/k8s/overlays/prod', ['infra/k8s/components/gpu-nodes']))
    .filter(({ template }) => gpuAsk(template as never))
    .map(({ owner }) => owner.metadata.name)
    .sort();
  assert.deepEqual(placed, ['advantage', 'rollout', 'update']);
});

test('examples/own-model: every stage fetches the model and data before it starts; the config loads', () => {
  const objs = renderWithComponents('infra/k8s/examples/own-model', []);
  const stages = podTemplates(objs).filter(({ owner }) => STAGES.includes(owner.metadata.name));
  assert.equal(stages.length, STAGES.length);
  for (const { owner, template } of stages) {
    const spec = template.spec as unknown as {
      initContainers?: Container[];
      containers: Array<Container & { envFrom?: unknown[] }>;
      volumes: Array<{ name: string; emptyDir?: unknown }>;
    };
    const init = spec.initContainers?.find((c) => c.name === 'fetch-assets');
    assert.ok(init, `${describeObject(owner)}: the fetch-assets init container`);
    assert.match(
      [...(init!.command ?? []), ...(init!.args ?? [])].join(' '),
      /^rlstream fetch s3:\/\/\S+ \/var\/lib\/rlstream\/assets\/model s3:\/\/\S+ \/var\/lib\/rlstream\/assets\/data$/,
    );
    assert.ok(spec.volumes.some((v) => v.name === 'assets' && v.emptyDir));
    assert.ok(
      spec.containers[0].volumeMounts!.some((m) => m.name === 'assets' && m.mountPath === '/var/lib/rlstream/assets'),
    );
    assert.deepEqual(spec.containers[0].envFrom, [{ secretRef: { name: 'rlstream-s3' } }]);
  }
  const cfg = configOf(objs);
  assert.equal(cfg.actor.model.path, '/var/lib/rlstream/assets/model');
  assert.equal(cfg.pipeline.policy_store, 's3');
  assert.equal(cfg.reward.reward_fn_path, '/opt/rlstream-ext/reward.ts');
});
