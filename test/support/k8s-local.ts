/**
 * Runs the pods of rendered Kubernetes manifests as local processes — what a kubelet would start,
 * without a container engine — for test/e2e/k8s-manifests.test.ts.
 *
 * From each Deployment / StatefulSet / Job pod template it takes the init containers' and the
 * container's `command`, `args`, `envFrom` and `env` as rendered, and resolves them as Kubernetes does:
 *  - `envFrom` (every key of a Secret or ConfigMap), then `env[].value`; `valueFrom.secretKeyRef` / `configMapKeyRef` from the rendered Secret and
 *    ConfigMap objects (a missing object or key is an error, as it is for the kubelet);
 *    `valueFrom.fieldRef` for metadata.name, metadata.namespace and the StatefulSet ordinal label
 *    apps.kubernetes.io/pod-index; anything else is an error;
 *  - `$(VAR)` in command and args expanded from the container's env (`$$` escapes);
 *  - the image's entrypoint `rlstream` is this checkout's bin/rlstream.mjs (the image's
 *    /usr/local/bin/rlstream links to /app/bin/rlstream.mjs, and /app is this tree);
 *  - init containers run one after the other, each to exit 0, before the container starts.
 * The pod's filesystem: each volume mount becomes a directory of the pod's own (configMap volumes
 * hold the ConfigMap's files; emptyDirs start empty, a restarted pod gets new ones), and the
 * mount paths in args, env values and those files are rewritten to them — nothing is shared
 * between pods. Files a derived image adds (its COPY lines) are mapped the same way, from the
 * caller's local layout of them. Networking: each container port gets a free local port (the args naming it are
 * rewritten), and `<service>:<port>` addresses in args, env and config files are resolved to the
 * pod behind that Service, or to a stand-in given by the caller (the Kafka mock for the Kafka
 * Service; for the PostgreSQL Service the whole postgres:// URL, as the local server has other
 * users and databases).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import type { Container, K8sObject, PodTemplate } from './k8s-manifests.ts';
import { ROOT } from './k8s-manifests.ts';

export interface PodSpecOf {
  owner: K8sObject;
  name: string;
  ordinal: number | null;
  template: PodTemplate;
}

/** The pods a workload asks for: `replicas` of a Deployment or StatefulSet (ordinals 0…n−1), one of a Job. */
export function podsOf(objs: readonly K8sObject[]): PodSpecOf[] {
  const out: PodSpecOf[] = [];
  for (const o of objs) {
    if (!['Deployment', 'StatefulSet', 'Job'].includes(o.kind)) continue;
    const spec = o.spec as { replicas?: number; template: PodTemplate };
    const n = o.kind === 'Job' ? 1 : (spec.replicas ?? 1);
    for (let i = 0; i < n; i++) {
      out.push({
        owner: o,
        ordinal: o.kind === 'StatefulSet' ? i : null,
        template: spec.template,
        name: o.kind === 'StatefulSet' ? `${o.metadata.name}-${i}` : `${o.metadata.name}-${i}-local`,
      });
    }
  }
  return out;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => resolve(p));
    });
  });
}

/** `$(VAR)` expansion as the kubelet does it: defined names are replaced, `$$(X)` stays `$(X)`, unknown names stay as written. */
export function expandVars(s: string, env: Record<string, string>): string {
  return s.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (m, name: string | undefined) =>
    m === '$$' ? '$' : name !== undefined && name in env ? env[name] : m,
  );
}

export interface Addresses {
  /** `<service>:<port>` → `host:port` for Services backed by local pods (filled as pods start). */
  services: Map<string, string>;
  /** Replaces a whole value (e.g. a postgres:// URL whose host is the PostgreSQL Service). */
  rewrite: (text: string) => string;
}

export interface LocalPod {
  spec: PodSpecOf;
  container: Container;
  child: ChildProcess;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** container port name (or number) → local port */
  ports: Map<string, number>;
  argv: string[];
  env: Record<string, string>;
  /** The pod's init containers, as they ended (each exited 0). */
  inits: InitResult[];
  output(): string;
}

function decodeSecret(o: K8sObject, key: string): string | undefined {
  const data = o.data as Record<string, string> | undefined;
  const str = o.stringData as Record<string, string> | undefined;
  if (str && key in str) return str[key];
  if (data && key in data) return Buffer.from(data[key].replace(/\s+/g, ''), 'base64').toString('utf8');
  return undefined;
}

function find(objs: readonly K8sObject[], kind: string, name: string): K8sObject {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  if (!o) throw new Error(`${kind} ${name} is referenced but not rendered`);
  return o;
}

/** Rewrites Service addresses (and the caller's whole-value stand-ins) in a text. */
function resolveAddresses(text: string, addr: Addresses): string {
  let out = addr.rewrite(text);
  for (const [from, to] of addr.services) {
    const [name, port] = from.split(':');
    out = out.replace(
      new RegExp(`(?<![\\w.-])${name}(?:\\.[a-z0-9-]+)*(?:\\.svc(?:\\.cluster\\.local)?)?:${port}(?!\\d)`, 'g'),
      to,
    );
  }
  return out;
}

export interface PodOptions {
  extraEnv?: Record<string, string>;
  /**
   * Paths a derived image adds to the rlstream image (its COPY lines): path in the image → local
   * file or directory. Mapped in args, env and config files like volume mounts (read-only: the
   * pods run with a read-only root filesystem).
   */
  imageFiles?: ReadonlyMap<string, string>;
}

/** How an init container ended. */
export interface InitResult {
  name: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

interface Spawned {
  child: ChildProcess;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  output(): string;
}

/** Spawns one container's process; it is SIGKILLed if the test process exits first. */
function spawnContainer(file: string, args: string[], env: NodeJS.ProcessEnv): Spawned {
  const child = spawn(file, args, { cwd: ROOT /* the image's WORKDIR /app */, stdio: ['ignore', 'pipe', 'pipe'], env });
  let out = '';
  const keep = (d: Buffer) => {
    out = (out + d.toString()).slice(-40_000);
  };
  child.stdout!.on('data', keep);
  child.stderr!.on('data', keep);
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
    child.on('exit', (code, signal) => r({ code, signal })),
  );
  const kill = () => {
    try {
      child.kill('SIGKILL');
    } catch {
      /* gone */
    }
  };
  process.once('exit', kill);
  void exit.then(() => process.removeListener('exit', kill));
  return { child, exit, output: () => out };
}

/**
 * Starts one pod as a local process: its init containers one after the other, each to exit 0
 * (else an error with its output), then its (single) container. `root` is the directory the
 * pod's volumes live under (a new one per pod start: emptyDirs are not kept across restarts);
 * the init containers and the container share them, as in a pod.
 */
export async function startPod(
  objs: readonly K8sObject[],
  pod: PodSpecOf,
  root: string,
  addr: Addresses,
  opts: PodOptions = {},
): Promise<LocalPod> {
  const { template } = pod;
  if (template.spec.containers.length !== 1) throw new Error(`${pod.name}: this runner starts pods of one container`);
  const inits: InitResult[] = [];
  for (const c of template.spec.initContainers ?? []) {
    const p = await prepare(objs, pod, c, root, addr, opts);
    const s = spawnContainer(p.file, p.args, p.env);
    const r = await s.exit;
    inits.push({ name: c.name, ...r, output: s.output() });
    if (r.code !== 0)
      throw new Error(
        `${pod.name}: init container ${c.name} exited ${r.code ?? r.signal}:\n${s.output().slice(-3000)}`,
      );
  }
  const c = template.spec.containers[0];
  const p = await prepare(objs, pod, c, root, addr, opts);
  const s = spawnContainer(p.file, p.args, p.env);
  return { spec: pod, container: c, ports: p.ports, argv: p.argv, env: p.containerEnv, inits, ...s };
}

/** One container's process as the kubelet would start it: its filesystem, env, ports and command line. */
async function prepare(
  objs: readonly K8sObject[],
  pod: PodSpecOf,
  c: Container,
  root: string,
  addr: Addresses,
  opts: PodOptions,
): Promise<{
  file: string;
  args: string[];
  argv: string[];
  env: NodeJS.ProcessEnv;
  containerEnv: Record<string, string>;
  ports: Map<string, number>;
}> {
  const { template } = pod;
  const namespace = pod.owner.metadata.namespace ?? 'default';
  const labels: Record<string, string> = {
    ...(template.metadata.labels ?? {}),
    ...(pod.ordinal !== null ? { 'apps.kubernetes.io/pod-index': String(pod.ordinal) } : {}),
  };

  // the container's filesystem: a directory per volume mount (shared by the pod's containers),
  // and the files a derived image adds
  const mounts: Array<[string, string]> = [...(opts.imageFiles ?? new Map<string, string>())].map(([from, to]) => [
    from.replace(/\/$/, ''),
    to,
  ]);
  const volumes = new Map((template.spec.volumes ?? []).map((v) => [v.name, v]));
  for (const m of c.volumeMounts ?? []) {
    const v = volumes.get(m.name);
    if (!v) throw new Error(`${pod.name}: volume ${m.name} is not defined`);
    const dir = join(root, 'volumes', m.name);
    mkdirSync(dir, { recursive: true });
    mounts.push([m.mountPath.replace(/\/$/, ''), dir]);
    if (!v.emptyDir && !v.configMap)
      throw new Error(
        `${pod.name}: volume ${m.name} is neither an emptyDir nor a ConfigMap (a shared or persistent volume would need more than this runner)`,
      );
  }
  mounts.sort((a, b) => b[0].length - a[0].length);
  // one pass over all mount paths (longest first), so a replaced path is never mapped again (the
  // checkout itself may live under /tmp, a mount path)
  const mountRe = new RegExp(
    `(?<![\\w./-])(${mounts.map(([from]) => from.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|')})(?=/|\\b|$)`,
    'g',
  );
  const mountDir = new Map(mounts);
  const mapPaths = (s: string) => (mounts.length ? s.replace(mountRe, (m) => mountDir.get(m)!) : s);
  for (const m of c.volumeMounts ?? []) {
    const v = volumes.get(m.name)!;
    if (!v.configMap) continue;
    const cm = find(objs, 'ConfigMap', v.configMap.name);
    for (const [file, text] of Object.entries((cm.data ?? {}) as Record<string, string>)) {
      writeFileSync(join(root, 'volumes', m.name, file), mapPaths(resolveAddresses(text, addr)));
    }
  }

  // env, as the kubelet resolves it: envFrom's keys first, then env in order (later entries may
  // refer to earlier ones, and override envFrom's)
  const env: Record<string, string> = {};
  for (const from of c.envFrom ?? []) {
    if (from.secretRef) {
      const o = find(objs, 'Secret', from.secretRef.name);
      for (const key of new Set([
        ...Object.keys((o.data ?? {}) as object),
        ...Object.keys((o.stringData ?? {}) as object),
      ]))
        env[key] = mapPaths(resolveAddresses(decodeSecret(o, key)!, addr));
    } else if (from.configMapRef) {
      for (const [key, v] of Object.entries((find(objs, 'ConfigMap', from.configMapRef.name).data ?? {}) as object))
        env[key] = mapPaths(resolveAddresses(String(v), addr));
    } else throw new Error(`${pod.name}: an envFrom entry this runner cannot resolve`);
  }
  for (const e of c.env ?? []) {
    let value: string;
    if (e.value !== undefined) value = expandVars(e.value, env);
    else if (e.valueFrom?.secretKeyRef) {
      const v = decodeSecret(find(objs, 'Secret', e.valueFrom.secretKeyRef.name), e.valueFrom.secretKeyRef.key);
      if (v === undefined)
        throw new Error(
          `${pod.name}: Secret ${e.valueFrom.secretKeyRef.name} has no key ${e.valueFrom.secretKeyRef.key}`,
        );
      value = v;
    } else if (e.valueFrom?.configMapKeyRef) {
      const v = ((find(objs, 'ConfigMap', e.valueFrom.configMapKeyRef.name).data ?? {}) as Record<string, string>)[
        e.valueFrom.configMapKeyRef.key
      ];
      if (v === undefined)
        throw new Error(
          `${pod.name}: ConfigMap ${e.valueFrom.configMapKeyRef.name} has no key ${e.valueFrom.configMapKeyRef.key}`,
        );
      value = v;
    } else if (e.valueFrom?.fieldRef) {
      const f = e.valueFrom.fieldRef.fieldPath;
      const label = /^metadata\.labels\['([^']+)'\]$/.exec(f);
      if (f === 'metadata.name') value = pod.name;
      else if (f === 'metadata.namespace') value = namespace;
      else if (label && label[1] in labels) value = labels[label[1]];
      else throw new Error(`${pod.name}: fieldRef ${f} is not known to this runner`);
    } else throw new Error(`${pod.name}: env ${e.name} has no value this runner can resolve`);
    env[e.name] = mapPaths(resolveAddresses(value, addr));
  }

  // ports: every container port gets a free local port; args naming it are rewritten
  const ports = new Map<string, number>();
  const portMap = new Map<string, string>();
  for (const p of c.ports ?? []) {
    const local = await freePort();
    ports.set(p.name ?? String(p.containerPort), local);
    ports.set(String(p.containerPort), local);
    portMap.set(String(p.containerPort), String(local));
  }

  const cmd = [...(c.command ?? []), ...(c.args ?? [])]
    .map((a) => expandVars(a, env))
    .map((a) => portMap.get(a) ?? a)
    .map((a) => mapPaths(resolveAddresses(a, addr)));
  const tmp = mounts.find(([from]) => from === '/tmp')?.[1];
  const processEnv: NodeJS.ProcessEnv = {
    PATH: process.env.PATH ?? '',
    NODE_ENV: 'production',
    RLSTREAM_LOG_JSON: '1',
    ...(tmp ? { TMPDIR: tmp } : {}),
    HOSTNAME: pod.name,
    ...env,
    ...opts.extraEnv,
  };
  if (cmd[0] !== 'rlstream') throw new Error(`${pod.name}: command ${cmd[0]} is not the rlstream image's entrypoint`);
  const argv = [join(ROOT, 'bin/rlstream.mjs'), ...cmd.slice(1)];
  return { file: process.execPath, args: argv, argv, env: processEnv, containerEnv: env, ports };
}

/** GET on a pod's probe the way the kubelet does: 200–399 succeeds. */
export async function probe(
  pod: LocalPod,
  which: 'readinessProbe' | 'livenessProbe' | 'startupProbe',
): Promise<{ ok: boolean; status: number; body: string }> {
  const p = pod.container[which];
  if (!p?.httpGet) throw new Error(`${pod.spec.name}: no httpGet ${which}`);
  const port = pod.ports.get(String(p.httpGet.port));
  if (!port) throw new Error(`${pod.spec.name}: ${which} port ${p.httpGet.port} is not a container port`);
  try {
    const r = await fetch(`http://127.0.0.1:${port}${p.httpGet.path}`, { signal: AbortSignal.timeout(3000) });
    return { ok: r.status >= 200 && r.status < 400, status: r.status, body: await r.text() };
  } catch (e) {
    return { ok: false, status: 0, body: (e as Error).message };
  }
}

/** Stops a pod as the kubelet does: SIGTERM, SIGKILL after terminationGracePeriodSeconds. Returns how it ended and how long it took. */
export async function terminate(
  pod: LocalPod,
): Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number; killed: boolean }> {
  const t0 = Date.now();
  if (pod.child.exitCode !== null || pod.child.signalCode !== null)
    return { ...(await pod.exit), ms: 0, killed: false };
  pod.child.kill('SIGTERM');
  const graceMs = (pod.spec.template.spec.terminationGracePeriodSeconds ?? 30) * 1000;
  let killed = false;
  const timer = setTimeout(() => {
    killed = true;
    pod.child.kill('SIGKILL');
  }, graceMs);
  const r = await pod.exit;
  clearTimeout(timer);
  return { ...r, ms: Date.now() - t0, killed };
}
