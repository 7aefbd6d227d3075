/**
 * Spawns real `rlstream reward-server` processes (lib/reward/server-cli.ts) for the reward tests
 * and benchmark: own process group, listening URLs read from stdout (bounded wait), stopped by
 * PID (SIGTERM to the group, SIGKILL if still there after a bounded wait).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const SERVER_CLI = fileURLToPath(new URL('../lib/reward/server-cli.ts', import.meta.url));
export const EXAMPLE_SCORER = fileURLToPath(new URL('../examples/reward-server/overlap-scorer.ts', import.meta.url));
export const FAULTY_SCORER = fileURLToPath(new URL('../test/support/reward-faulty-scorer.ts', import.meta.url));

export interface ServerInfo {
  url: string;
  key: string;
  pid: number;
  log: string;
}

export interface ServerGroup {
  proc: ChildProcess;
  servers: ServerInfo[];
  /** Everything the process wrote to stdout/stderr so far. */
  output(): string;
  /** Resolves the exit code (or signal name) once the process has exited. */
  exited: Promise<number | string>;
  /** SIGTERM the process group, wait (bounded), SIGKILL what is left. Returns the exit status. */
  stop(signal?: NodeJS.Signals): Promise<number | string>;
}

export async function startRewardServers(opts: {
  count?: number;
  scorer?: string;
  port?: number;
  logDir: string;
  env?: Record<string, string>;
  args?: string[];
  startTimeoutMs?: number;
}): Promise<ServerGroup> {
  const count = opts.count ?? 1;
  const args = [
    '--import',
    'tsx',
    SERVER_CLI,
    '--scorer',
    opts.scorer ?? EXAMPLE_SCORER,
    '--count',
    String(count),
    '--port',
    String(opts.port ?? 0),
    '--log-dir',
    opts.logDir,
    ...(opts.args ?? []),
  ];
  const proc = spawn(process.execPath, args, {
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...(opts.env ?? {}) },
  });
  let out = '';
  proc.stdout!.on('data', (c: Buffer) => {
    out += c.toString();
  });
  proc.stderr!.on('data', (c: Buffer) => {
    out += c.toString();
  });
  const exited = new Promise<number | string>((r) => proc.on('exit', (code, sig) => r(code ?? sig ?? 'unknown')));
  let done = false;
  void exited.then(() => {
    done = true;
  });
  let serverPids: number[] = [];
  const killGroup = (sig: NodeJS.Signals) => {
    try {
      process.kill(-proc.pid!, sig);
    } catch {
      /* already gone */
    }
  };
  /** Launched servers run in their own process groups: kill those too (by the PIDs they printed). */
  const killServers = () => {
    for (const pid of serverPids) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        /* gone */
      }
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
  };
  const stop = async (signal: NodeJS.Signals = 'SIGTERM') => {
    if (!done) {
      killGroup(signal);
      const t = setTimeout(() => killGroup('SIGKILL'), 15_000);
      const code = await exited;
      clearTimeout(t);
      killGroup('SIGKILL'); // anything left behind
      killServers();
      return code;
    }
    killGroup('SIGKILL');
    killServers();
    return exited;
  };
  const deadline = Date.now() + (opts.startTimeoutMs ?? 30_000);
  const re = /reward-server listening on (http:\/\/([^\s]+)) pid=(\d+) log=(\S+)/g;
  while (true) {
    const servers = [...out.matchAll(re)].map((m) => ({ url: m[1], key: m[2], pid: Number(m[3]), log: m[4] }));
    serverPids = servers.map((x) => x.pid);
    if (servers.length >= count) return { proc, servers, output: () => out, exited, stop };
    if (done || Date.now() > deadline) {
      await stop('SIGKILL');
      throw new Error(`reward servers did not start (${servers.length}/${count} listening): ${out.slice(-2000)}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}
