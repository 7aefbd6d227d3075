/**
 * `rlstream check env [config]`: whether this machine can run the config, before the run. Node;
 * onnxruntime-node's version and which execution providers start here (a one-node session on
 * each); CPU threads against actor.threads; free memory and disk against the configured policy's
 * size (fp32 weights, gradients and AdamW moments: 16 bytes a parameter; a checkpoint: weights and
 * moments, 12); PostgreSQL (pipeline.store = postgres) and Kafka brokers (pipeline.bus = kafka)
 * reachable; the Python interpreter, module and function of a Python reward. Each check is one
 * line: ok, warn, fail (the command exits 1) or skip.
 */
import { readdirSync, statSync, statfsSync, existsSync } from 'node:fs';
import { availableParallelism, freemem, totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { connect } from 'node:net';
import { spawnSync } from 'node:child_process';
import type { Config } from '../config/index.ts';
import { errorMessage } from '../errors.ts';
import { DEVICES, type Device } from '../onnx/devices.ts';
import { PythonRewardPool, isPythonRewardPath } from '../reward-fns/python-pool.ts';
import { cgroupMemoryLimit } from './stage-memory.ts';

export type CheckStatus = 'ok' | 'warn' | 'fail' | 'skip';
export interface EnvCheck {
  name: string;
  status: CheckStatus;
  detail: string;
}

const GiB = 1024 ** 3;
const gib = (b: number) =>
  b >= GiB
    ? `${(b / GiB).toFixed(b < 10 * GiB ? 2 : 1)} GiB`
    : b >= 1024 ** 2
      ? `${(b / 1024 ** 2).toFixed(1)} MiB`
      : `${(b / 1024).toFixed(1)} KiB`;

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t: NodeJS.Timeout;
  return Promise.race([
    p.finally(() => clearTimeout(t)),
    new Promise<T>((_, rej) => {
      t = setTimeout(() => rej(new Error(`${what}: no answer within ${ms / 1000} s`)), ms);
    }),
  ]);
}

/** The nearest existing directory at or above `p`. */
function existingAncestor(p: string): string {
  let cur = resolve(p);
  while (!existsSync(cur) && dirname(cur) !== cur) cur = dirname(cur);
  return cur;
}

function dirBytes(dir: string): number {
  let n = 0;
  for (const f of readdirSync(dir)) {
    const s = statSync(join(dir, f));
    if (s.isFile()) n += s.size;
  }
  return n;
}

export function tcpReachable(host: string, port: number, ms = 3000): Promise<void> {
  return new Promise((res, rej) => {
    const s = connect({ host, port, timeout: ms });
    s.once('connect', () => {
      s.destroy();
      res();
    });
    s.once('timeout', () => {
      s.destroy();
      rej(new Error(`no answer within ${ms / 1000} s`));
    });
    s.once('error', (e) => rej(e));
  });
}

async function providers(cfg: Config | null): Promise<EnvCheck[]> {
  const out: EnvCheck[] = [];
  const { ort, checkDevice } = await import('../onnx/runtime.ts');
  out.push({ name: 'onnxruntime', status: 'ok', detail: `onnxruntime-node ${ort.env.versions.node}` });
  const wanted = new Set<Device>(cfg ? [cfg.actor.device, cfg.rollout.device ?? cfg.actor.device] : ['cpu']);
  for (const d of DEVICES) {
    const setting = cfg && cfg.rollout.device === d && cfg.actor.device !== d ? 'rollout.device' : 'actor.device';
    try {
      await withTimeout(checkDevice(d, setting), 30_000, `${d} session`);
      out.push({ name: `provider ${d}`, status: 'ok', detail: `starts${wanted.has(d) ? ' (configured)' : ''}` });
    } catch (e) {
      out.push({
        name: `provider ${d}`,
        status: wanted.has(d) ? 'fail' : 'skip',
        detail: `${wanted.has(d) ? '' : 'not configured; '}cannot start: ${errorMessage(e)}`,
      });
    }
  }
  return out;
}

async function modelSize(cfg: Config): Promise<{ params: number; what: string } | { error: string }> {
  try {
    const { tokenizerFor, policyModelConfig } = await import('../pipeline/policy.ts');
    const { paramCount } = await import('../model/params.ts');
    const c = policyModelConfig(cfg, tokenizerFor(cfg));
    const params = paramCount(c);
    const m = cfg.actor.model.path;
    return {
      params,
      what: m ? `${m} (${gib(dirBytes(m))} on disk)` : 'a fresh model from actor.model',
    };
  } catch (e) {
    return { error: errorMessage(e) };
  }
}

export async function checkEnv(cfg: Config | null, opts: { env?: NodeJS.ProcessEnv } = {}): Promise<EnvCheck[]> {
  const checks: EnvCheck[] = [];
  const [maj, min] = process.versions.node.split('.').map(Number);
  checks.push({
    name: 'node',
    status: maj! > 20 || (maj === 20 && min! >= 10) ? 'ok' : 'fail',
    detail: `Node ${process.version} on ${process.platform}/${process.arch}${maj! > 20 || (maj === 20 && min! >= 10) ? '' : ' (needs ≥ 20.10)'}`,
  });
  checks.push(...(await providers(cfg)));

  const cores = availableParallelism();
  const threads = cfg?.actor.threads ?? null;
  checks.push({
    name: 'threads',
    status: threads !== null && threads > cores ? 'warn' : 'ok',
    detail: `${cores} CPU cores available${threads !== null ? `; actor.threads = ${threads}${threads > cores ? ' (more than the cores: threads will contend)' : ''}` : ''}`,
  });

  const limit = cgroupMemoryLimit();
  const free = Math.min(freemem(), limit ?? Infinity);
  const size = cfg ? await modelSize(cfg) : null;
  if (size && 'error' in size) checks.push({ name: 'model', status: 'fail', detail: size.error });
  const params = size && 'params' in size ? size.params : null;
  const trainBytes = params !== null ? params * 16 : null;
  checks.push({
    name: 'memory',
    status:
      trainBytes !== null && trainBytes > free ? 'fail' : trainBytes !== null && trainBytes * 2 > free ? 'warn' : 'ok',
    detail: `${gib(free)} free of ${gib(limit !== null ? Math.min(limit, totalmem()) : totalmem())}${limit !== null ? ' (cgroup limit)' : ''}${
      params !== null && size && 'what' in size
        ? `; the policy, ${size.what}, has ${(params / 1e6).toFixed(2)} M parameters: ${gib(trainBytes!)} to train (fp32 weights, gradients, AdamW moments; activations come on top)`
        : ''
    }`,
  });

  const runDir = cfg?.trainer.run_dir ?? '.';
  const at = existingAncestor(runDir);
  try {
    const fs = statfsSync(at);
    const avail = fs.bavail * fs.bsize;
    const ckpt = params !== null ? params * 12 : null;
    checks.push({
      name: 'disk',
      status: ckpt !== null && ckpt > avail ? 'fail' : ckpt !== null && ckpt * 4 > avail ? 'warn' : 'ok',
      detail: `${gib(avail)} free at ${at}${cfg ? ` (trainer.run_dir ${runDir})` : ''}${ckpt !== null ? `; a checkpoint or policy version takes about ${gib(ckpt)}` : ''}`,
    });
  } catch (e) {
    checks.push({ name: 'disk', status: 'warn', detail: `cannot read free space at ${at}: ${errorMessage(e)}` });
  }

  if (cfg?.pipeline.store === 'postgres') {
    const url = cfg.pipeline.database_url;
    if (!url)
      checks.push({
        name: 'postgres',
        status: 'fail',
        detail: 'pipeline.store = postgres needs pipeline.database_url',
      });
    else {
      const { default: pg } = await import('pg');
      const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5000 });
      const safe = url.replace(/\/\/([^:@/]+):[^@/]*@/, '//$1:***@');
      try {
        await client.connect();
        const v = await client.query<{ v: string }>("select current_setting('server_version') as v");
        checks.push({ name: 'postgres', status: 'ok', detail: `${safe}: PostgreSQL ${v.rows[0]?.v ?? '?'}` });
      } catch (e) {
        checks.push({ name: 'postgres', status: 'fail', detail: `${safe}: ${errorMessage(e)}` });
      } finally {
        await client.end().catch(() => undefined);
      }
    }
  } else if (cfg) checks.push({ name: 'postgres', status: 'skip', detail: 'pipeline.store = embedded (PGlite)' });

  if (cfg?.pipeline.bus === 'kafka') {
    if (cfg.pipeline.brokers.length === 0)
      checks.push({ name: 'kafka', status: 'fail', detail: 'pipeline.bus = kafka needs pipeline.brokers' });
    for (const b of cfg.pipeline.brokers) {
      const i = b.lastIndexOf(':');
      const host = i > 0 ? b.slice(0, i).replace(/^\[|\]$/g, '') : b;
      const port = i > 0 ? Number(b.slice(i + 1)) : 9092;
      try {
        await tcpReachable(host, port);
        checks.push({ name: 'kafka', status: 'ok', detail: `broker ${b} reachable` });
      } catch (e) {
        checks.push({ name: 'kafka', status: 'fail', detail: `broker ${b}: ${errorMessage(e)}` });
      }
    }
  } else if (cfg) checks.push({ name: 'kafka', status: 'skip', detail: 'pipeline.bus = embedded' });

  const r = cfg?.reward;
  if (r && r.reward_fn_path && isPythonRewardPath(r.reward_fn_path)) {
    const pool = new PythonRewardPool({
      path: r.reward_fn_path,
      name: r.reward_fn_name,
      form: r.reward_fn_form,
      python: r.python,
      workers: 1,
      timeoutS: r.timeout_s,
      stderr: () => undefined,
    });
    try {
      await pool.start();
      checks.push({
        name: 'python',
        status: 'ok',
        detail: `${r.python ?? 'python3'} (Python ${pool.pythonVersion}) imports ${r.reward_fn_path} and finds ${r.reward_fn_name ?? 'compute_score'}`,
      });
    } catch (e) {
      checks.push({ name: 'python', status: 'fail', detail: errorMessage(e) });
    } finally {
      await pool.close();
    }
  } else {
    const py = r?.python ?? 'python3';
    const v = spawnSync(py, ['--version'], { encoding: 'utf8', timeout: 10_000, env: opts.env ?? process.env });
    checks.push({
      name: 'python',
      status: 'skip',
      detail: `no Python reward configured; ${v.error ? `${py} not found` : `${py}: ${(v.stdout || v.stderr).trim()}`}`,
    });
  }
  return checks;
}

export function formatEnvReport(checks: EnvCheck[]): string {
  const w = Math.max(...checks.map((c) => c.name.length));
  const lines = checks.map((c) => `${c.status.toUpperCase().padEnd(4)}  ${c.name.padEnd(w)}  ${c.detail}`);
  const failed = checks.filter((c) => c.status === 'fail').length;
  lines.push(failed ? `check env: ${failed} check(s) failed` : 'check env: ok');
  return `${lines.join('\n')}\n`;
}
