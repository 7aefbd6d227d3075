/**
 * The Kubernetes manifests under infra/k8s, rendered and checked offline (no cluster):
 *
 *  - `render(dir)`: `kubectl kustomize <dir>` (kubectl ships kustomize v5), parsed into objects.
 *    A missing kubectl is an error that says how to install it, never a skip: CI installs it.
 *  - `validateObjects(objs)`: every built-in object against the Kubernetes OpenAPI schema in two
 *    passes, both from kubernetes-models (generated from the OpenAPI spec):
 *      1. its ajv validator (`model.validate()`: types, enums, required fields, formats) — which
 *         does NOT reject unknown fields, as the OpenAPI schemas do not say additionalProperties;
 *      2. unknown fields: each object becomes a typed object literal (`const o: IDeployment = …`)
 *         that the TypeScript compiler checks against the models' generated interfaces. Object
 *         literals get excess-property checks at every depth, so a misspelt or misplaced field
 *         anywhere is an error (what `kubectl apply --validate=strict` would say on a cluster).
 *    KEDA's ScaledObject, a CRD, is checked against `scaledObjectSchema` (test/support/keda-schema.ts,
 *    written from KEDA's documented ScaledObject and kafka-trigger fields, strict at every level).
 *    Any other kind is an error: nothing unvalidated passes.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { parseAllDocuments } from 'yaml';
import { scaledObjectSchema } from './keda-schema.ts';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const K8S = join(ROOT, 'infra/k8s');
export const OVERLAYS = ['dev', 'prod'] as const;

export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [key: string]: unknown;
}

/** `kubectl kustomize <dir>`, parsed. Throws with install instructions when kubectl is missing. */
export function render(dir: string, kubectl = 'kubectl'): K8sObject[] {
  const r = spawnSync(kubectl, ['kustomize', dir], { encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.error && (r.error as NodeJS.ErrnoException).code === 'ENOENT') {
    throw new Error(
      `${kubectl} is not installed: these tests render infra/k8s with "kubectl kustomize". Install it (Debian: apt-get install kubectl; .ci/run does)`,
    );
  }
  if (r.status !== 0) throw new Error(`kubectl kustomize ${dir} failed (exit ${r.status}):\n${r.stderr}`);
  return parseAllDocuments(r.stdout)
    .map((d) => {
      if (d.errors.length) throw new Error(`kubectl kustomize ${dir} printed invalid YAML: ${d.errors[0].message}`);
      return d.toJS() as K8sObject;
    })
    .filter((o) => o !== null);
}

/** Renders an overlay of infra/k8s/overlays. */
export function renderOverlay(name: string): K8sObject[] {
  return render(join(K8S, 'overlays', name));
}

/**
 * Renders `base` (a directory relative to the repository root) with extra components, through a
 * throwaway kustomization under test/.tmp (kustomize reads only what a kustomization lists).
 */
export function renderWithComponents(base: string, components: string[]): K8sObject[] {
  const dir = join(ROOT, 'test/.tmp', `kustomize-${process.pid}-${Math.random().toString(36).slice(2)}`);
  mkdirSync(dir, { recursive: true });
  try {
    const rel = (p: string) => join('../../..', p);
    writeFileSync(
      join(dir, 'kustomization.yaml'),
      [
        'apiVersion: kustomize.config.k8s.io/v1beta1',
        'kind: Kustomization',
        'resources:',
        `  - ${rel(base)}`,
        'components:',
        ...components.map((c) => `  - ${rel(c)}`),
        '',
      ].join('\n'),
    );
    return render(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export const describeObject = (o: K8sObject) => `${o.kind}/${o.metadata?.name ?? '?'}`;

/** The kubernetes-models module and interface of a built-in kind, e.g. apps/v1 Deployment. */
function modelOf(o: K8sObject): { module: string; iface: string } | null {
  const [group, version] = o.apiVersion.includes('/') ? o.apiVersion.split('/') : ['', o.apiVersion];
  const module = group ? `kubernetes-models/${group}/${version}/${o.kind}` : `kubernetes-models/${version}/${o.kind}`;
  try {
    requireFromRoot.resolve(module);
  } catch {
    return null;
  }
  return { module, iface: `I${o.kind}` };
}
const requireFromRoot = createRequire(join(ROOT, 'package.json'));

/** Validates every object (see the file comment); returns one line per problem, [] when all are valid. */
export function validateObjects(objs: readonly K8sObject[]): string[] {
  const problems: string[] = [];
  const typed: Array<{ o: K8sObject; module: string; iface: string }> = [];
  for (const o of objs) {
    if (o.apiVersion === 'keda.sh/v1alpha1' && o.kind === 'ScaledObject') {
      const r = scaledObjectSchema.safeParse(o);
      if (!r.success)
        for (const i of r.error.issues)
          problems.push(`${describeObject(o)}: ${i.path.join('.') || '(root)'}: ${i.message}`);
      continue;
    }
    const m = modelOf(o);
    if (!m) {
      problems.push(
        `${describeObject(o)}: no schema for ${o.apiVersion} ${o.kind} (neither a built-in kind in kubernetes-models nor a CRD with a schema here)`,
      );
      continue;
    }
    const Model = (requireFromRoot(m.module) as Record<string, new (d: unknown) => { validate(): void }>)[o.kind];
    try {
      new Model(apiServerView(o)).validate();
    } catch (e) {
      problems.push(`${describeObject(o)}: ${(e as Error).message.split('\n').join('; ')}`);
    }
    typed.push({ o, ...m });
  }
  problems.push(...unknownFields(typed));
  return problems;
}

/**
 * The object as the API server decodes it: kustomize wraps a long Secret value's base64 over lines
 * (a YAML block scalar), and the server's decoder (Go's encoding/base64) skips the line breaks,
 * while the `byte` format's regular expression does not.
 */
function apiServerView(o: K8sObject): K8sObject {
  if (o.kind !== 'Secret' || typeof o.data !== 'object' || o.data === null) return o;
  const data = Object.fromEntries(
    Object.entries(o.data as Record<string, string>).map(([k, v]) => [
      k,
      typeof v === 'string' ? v.replace(/[\r\n]/g, '') : v,
    ]),
  );
  return { ...o, data };
}

/** The TypeScript pass: unknown (excess) and mistyped fields against the generated interfaces. */
function unknownFields(items: ReadonlyArray<{ o: K8sObject; module: string; iface: string }>): string[] {
  if (items.length === 0) return [];
  const dir = join(ROOT, 'test/.tmp');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `k8s-objects-${process.pid}-${Math.random().toString(36).slice(2)}.ts`);
  const imports = [...new Map(items.map((i) => [i.module, i])).values()].map(
    (i, n) => `import type { ${i.iface} as T${n} } from '${i.module}';`,
  );
  const alias = new Map([...new Map(items.map((i) => [i.module, i])).keys()].map((mod, n) => [mod, `T${n}`]));
  const lines = [...imports];
  const firstLine: number[] = [];
  items.forEach((i, n) => {
    firstLine.push(lines.length);
    lines.push(`export const o${n}: ${alias.get(i.module)} = ${JSON.stringify(i.o, null, 1)};`.replace(/\n/g, ' '));
  });
  writeFileSync(file, lines.join('\n') + '\n');
  try {
    const program = ts.createProgram([file], {
      strict: true,
      noEmit: true,
      skipLibCheck: true,
      types: [],
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
    });
    const sf = program.getSourceFile(file)!;
    const out: string[] = [];
    for (const d of ts.getPreEmitDiagnostics(program, sf)) {
      // the literal's keys are JSON strings: '"image"' → 'image'
      const msg = ts.flattenDiagnosticMessageText(d.messageText, ' ').replace(/'"([^"']+)"'/g, "'$1'");
      if (d.file !== sf || d.start === undefined) {
        out.push(`type check: ${msg}`);
        continue;
      }
      const line = sf.getLineAndCharacterOfPosition(d.start).line;
      const idx = firstLine.findLastIndex((l) => l <= line);
      out.push(idx >= 0 && line >= firstLine[0] ? `${describeObject(items[idx].o)}: ${msg}` : `type check: ${msg}`);
    }
    return out;
  } finally {
    rmSync(file, { force: true });
  }
}

/** The pod templates of the workloads (Deployment, StatefulSet, Job), with their owner. */
export function podTemplates(objs: readonly K8sObject[]): Array<{ owner: K8sObject; template: PodTemplate }> {
  return objs
    .filter((o) => ['Deployment', 'StatefulSet', 'Job'].includes(o.kind))
    .map((o) => ({ owner: o, template: (o.spec as { template: PodTemplate }).template }));
}

export interface Probe {
  httpGet?: { path: string; port: string | number };
  tcpSocket?: { port: string | number };
  exec?: { command: string[] };
}
export interface Container {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: Array<{
    name: string;
    value?: string;
    valueFrom?: {
      secretKeyRef?: { name: string; key: string };
      configMapKeyRef?: { name: string; key: string };
      fieldRef?: { fieldPath: string };
    };
  }>;
  envFrom?: Array<{ secretRef?: { name: string }; configMapRef?: { name: string } }>;
  ports?: Array<{ name?: string; containerPort: number }>;
  livenessProbe?: Probe;
  readinessProbe?: Probe;
  startupProbe?: Probe;
  resources?: { requests?: Record<string, string | number>; limits?: Record<string, string | number> };
  securityContext?: {
    allowPrivilegeEscalation?: boolean;
    readOnlyRootFilesystem?: boolean;
    runAsNonRoot?: boolean;
    capabilities?: { drop?: string[]; add?: string[] };
    seccompProfile?: { type: string };
    privileged?: boolean;
  };
  volumeMounts?: Array<{ name: string; mountPath: string; readOnly?: boolean }>;
}
export interface PodTemplate {
  metadata: { labels?: Record<string, string>; annotations?: Record<string, string> };
  spec: {
    containers: Container[];
    initContainers?: Container[];
    securityContext?: { runAsNonRoot?: boolean; runAsUser?: number; seccompProfile?: { type: string } };
    terminationGracePeriodSeconds?: number;
    serviceAccountName?: string;
    automountServiceAccountToken?: boolean;
    volumes?: Array<{
      name: string;
      emptyDir?: object;
      configMap?: { name: string };
      secret?: { secretName: string };
      persistentVolumeClaim?: object;
    }>;
  };
}
