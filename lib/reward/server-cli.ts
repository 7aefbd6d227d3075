/**
 * `rlstream reward-server`: runs reward servers speaking the `/score` protocol
 * (`POST /score {image, prompt}` → `{vlm_score, ocr_confidence}`, lib/reward/server.ts).
 *
 *   rlstream reward-server --scorer <module.js|module.ts|model.onnx> [--count N] [--port P]
 *                          [--host 127.0.0.1] [--log-dir runs/reward-server] …
 *
 * With `--count 1` the server runs in this process. With `--count N > 1` this process is a
 * launcher: it starts N server processes on ports P, P+1, …, P+N−1 (or N
 * ephemeral ports with `--port 0`), each in its own process group, forwards SIGTERM/SIGINT to
 * them and exits when all have exited (0 only if every server exited cleanly). Each server logs to its own file,
 * `<log-dir>/reward-server-<port>.log`, and prints one line to stdout once it is listening:
 *
 *   reward-server listening on http://127.0.0.1:8000 pid=1234 log=runs/reward-server/reward-server-8000.log
 *
 * SIGTERM/SIGINT: stop accepting, finish in-flight requests (up to --shutdown-grace-ms), exit 0
 * (1 if requests had to be cut off).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { createLogger } from '../log.ts';
import { loadScorer } from './scorer.ts';
import { startRewardServer, type RewardServer } from './server.ts';
import type { Logger } from 'pino';

export const REWARD_SERVER_USAGE =
  'rlstream reward-server --scorer <module.js|module.ts|model.onnx> [--count N] [--port P] [--host H] [--log-dir D]';

export const REWARD_SERVER_HELP = `Serves POST /score ({"image": "<base64 PNG>", "prompt": "...", "response"?, "ground_truth"?} →
{"vlm_score": …, "ocr_confidence": …}; batch form {"items": [...]} → {"results": [...]}) and GET /healthz.

options:
  --scorer PATH            scorer: a JS/TS module whose default export is (req) => ({vlm_score, …})
                           (example: examples/reward-server/overlap-scorer.ts), or an ONNX sequence
                           scorer (.onnx; inputs input_ids + attention_mask, one score per sequence)
  --count N                number of servers on consecutive ports (default 1); N > 1 starts N processes
  --port P                 first port (default 8000; 0 = ephemeral ports)
  --host H                 bind address (default 127.0.0.1)
  --log-dir D              log directory, one file per server: D/reward-server-<port>.log
                           (default runs/reward-server)
  --max-body-bytes B       request body limit, larger bodies get 413 (default 16777216)
  --max-batch K            most requests in one batch body (default 64)
  --shutdown-grace-ms MS   on SIGTERM, wait this long for in-flight requests (default 10000)
ONNX scorers:
  --score-field NAME       response field holding the score (default score)
  --transform none|sigmoid applied to the raw model output (default none)
  --scale S                score = S · transform(raw) (default 1)
  --threshold T            if set, score = 1 when S · transform(raw) ≥ T, else 0
  --max-length L           longest token sequence; longer texts keep their last L tokens (default 1024)
  --threads K              onnxruntime intra-op threads (default 1)`;

interface Flags {
  scorer: string;
  count: number;
  port: number;
  host: string;
  logDir: string;
  maxBodyBytes: number;
  maxBatch: number;
  graceMs: number;
  scoreField: string;
  transform: 'none' | 'sigmoid';
  scale: number;
  threshold: number | null;
  maxLength: number;
  threads: number;
}

class UsageProblem extends Error {}

function parseFlags(argv: string[]): Flags {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        scorer: { type: 'string' },
        count: { type: 'string' },
        port: { type: 'string' },
        host: { type: 'string' },
        'log-dir': { type: 'string' },
        'max-body-bytes': { type: 'string' },
        'max-batch': { type: 'string' },
        'shutdown-grace-ms': { type: 'string' },
        'score-field': { type: 'string' },
        transform: { type: 'string' },
        scale: { type: 'string' },
        threshold: { type: 'string' },
        'max-length': { type: 'string' },
        threads: { type: 'string' },
      },
    }));
  } catch (e) {
    throw new UsageProblem((e as Error).message);
  }
  const str = (k: string) => values[k] as string | undefined;
  const int = (k: string, def: number, min: number, max = Number.MAX_SAFE_INTEGER) => {
    const v = str(k);
    if (v === undefined) return def;
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max)
      throw new UsageProblem(`--${k} ${v}: expected an integer in [${min}, ${max}]`);
    return n;
  };
  const num = (k: string, def: number | null) => {
    const v = str(k);
    if (v === undefined) return def;
    const n = Number(v);
    if (!Number.isFinite(n)) throw new UsageProblem(`--${k} ${v}: expected a number`);
    return n;
  };
  const scorer = str('scorer');
  if (!scorer)
    throw new UsageProblem(
      '--scorer is required: a scorer module (e.g. examples/reward-server/overlap-scorer.ts) or an .onnx model',
    );
  const transform = str('transform') ?? 'none';
  if (transform !== 'none' && transform !== 'sigmoid')
    throw new UsageProblem(`--transform ${transform}: valid values are none, sigmoid`);
  const count = int('count', 1, 1, 1024);
  const port = int('port', 8000, 0, 65535);
  if (port !== 0 && port + count - 1 > 65535)
    throw new UsageProblem(`--port ${port} with --count ${count} runs past port 65535`);
  return {
    scorer,
    count,
    port,
    host: str('host') ?? '127.0.0.1',
    logDir: str('log-dir') ?? 'runs/reward-server',
    maxBodyBytes: int('max-body-bytes', 16 * 1024 * 1024, 1024),
    maxBatch: int('max-batch', 64, 1),
    graceMs: int('shutdown-grace-ms', 10_000, 0),
    scoreField: str('score-field') ?? 'score',
    transform,
    scale: num('scale', 1)!,
    threshold: num('threshold', null),
    maxLength: int('max-length', 1024, 1),
    threads: int('threads', 1, 1, 256),
  };
}

/** Runs one server in this process until SIGTERM/SIGINT; resolves the exit code. */
async function serveOne(f: Flags): Promise<number> {
  const scorer = await loadScorer(f.scorer, {
    transform: f.transform,
    scale: f.scale,
    threshold: f.threshold,
    scoreField: f.scoreField,
    maxLength: f.maxLength,
    threads: f.threads,
  });
  mkdirSync(f.logDir, { recursive: true });
  let logFile = '';
  let log!: Logger;
  let live: RewardServer;
  try {
    live = await startRewardServer({
      scorer,
      host: f.host,
      port: f.port,
      maxBodyBytes: f.maxBodyBytes,
      maxBatch: f.maxBatch,
      log: (port) => {
        logFile = join(f.logDir, `reward-server-${port}.log`);
        log = createLogger({
          runId: process.env.RLSTREAM_RUN_ID ?? 'reward-server',
          stage: 'reward-server',
          destination: logFile,
          pretty: false,
        });
        return log;
      },
    });
  } catch (e) {
    await scorer.close?.();
    const err = e as NodeJS.ErrnoException;
    if (err.code === 'EADDRINUSE')
      throw new Error(`port ${f.port} on ${f.host} is already in use — pick another --port`);
    if (err.code === 'EACCES') throw new Error(`no permission to listen on ${f.host}:${f.port} — use a port ≥ 1024`);
    throw e;
  }
  log.info(
    { url: live.url, scorer: scorer.name, pid: process.pid, max_body_bytes: f.maxBodyBytes, max_batch: f.maxBatch },
    'reward server listening',
  );
  process.stdout.write(`reward-server listening on ${live.url} pid=${process.pid} log=${logFile}\n`);
  let stopping = false;
  let onSignal: (sig: NodeJS.Signals) => void = () => {};
  try {
    return await new Promise<number>((resolveExit) => {
      onSignal = (sig) => {
        // A repeated signal (e.g. to the whole process group and forwarded by the launcher) is not a second request.
        if (stopping) {
          log.info({ signal: sig }, 'already shutting down');
          return;
        }
        stopping = true;
        log.info({ signal: sig }, 'shutting down: no new connections, finishing in-flight requests');
        live.close(f.graceMs).then(
          (clean) => {
            log.info({ clean }, 'reward server stopped');
            resolveExit(clean ? 0 : 1);
          },
          (e) => {
            log.error({ err: e }, 'error while shutting down');
            resolveExit(1);
          },
        );
      };
      process.on('SIGTERM', onSignal);
      process.on('SIGINT', onSignal);
    });
  } finally {
    process.off('SIGTERM', onSignal);
    process.off('SIGINT', onSignal);
  }
}

/** Node arguments that let a child run this TypeScript file (tsx), whether or not we were started with --import tsx. */
function childNodeArgs(self: string): string[] {
  const args = [...process.execArgv];
  if (self.endsWith('.ts') && !args.some((a) => a.includes('tsx'))) args.push('--import', import.meta.resolve('tsx'));
  return args;
}

/** Starts N server processes and supervises them until they have all exited. */
async function launch(f: Flags): Promise<number> {
  const self = fileURLToPath(import.meta.url);
  const children: { port: number; proc: ChildProcess; code: number | null }[] = [];
  const base = [
    '--scorer',
    resolve(f.scorer),
    '--host',
    f.host,
    '--log-dir',
    resolve(f.logDir),
    '--max-body-bytes',
    String(f.maxBodyBytes),
    '--max-batch',
    String(f.maxBatch),
    '--shutdown-grace-ms',
    String(f.graceMs),
    '--score-field',
    f.scoreField,
    '--transform',
    f.transform,
    '--scale',
    String(f.scale),
    ...(f.threshold !== null ? ['--threshold', String(f.threshold)] : []),
    '--max-length',
    String(f.maxLength),
    '--threads',
    String(f.threads),
  ];
  let stopping = false;
  const exited = new Promise<void>((resolveAll) => {
    let left = f.count;
    for (let i = 0; i < f.count; i++) {
      const port = f.port === 0 ? 0 : f.port + i;
      // Own process group: a signal to the launcher's group reaches each server exactly once (forwarded below).
      const proc = spawn(
        process.execPath,
        [...childNodeArgs(self), self, '--count', '1', '--port', String(port), ...base],
        { stdio: ['ignore', 'inherit', 'inherit'], detached: true },
      );
      const entry = { port, proc, code: null as number | null };
      children.push(entry);
      proc.on('exit', (code, signal) => {
        entry.code = code ?? (signal ? 128 : 1);
        if (!stopping)
          process.stderr.write(
            `reward-server: server #${i} (port ${port || 'ephemeral'}, pid ${proc.pid}) exited unexpectedly (${signal ?? `code ${code}`}); the others keep serving\n`,
          );
        if (--left === 0) resolveAll();
      });
    }
  });
  const onSignal = (sig: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    for (const c of children) if (c.code === null) c.proc.kill(sig);
  };
  // If the launcher exits for any other reason, take the servers down with it.
  const onExit = () => {
    for (const c of children) if (c.code === null) c.proc.kill('SIGTERM');
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  process.on('exit', onExit);
  try {
    await exited;
  } finally {
    process.off('SIGTERM', onSignal);
    process.off('SIGINT', onSignal);
    process.off('exit', onExit);
  }
  return children.every((c) => c.code === 0) ? 0 : 1;
}

/** Entry for `rlstream reward-server …`; resolves the process exit code once the server(s) stopped. */
export async function main(argv: string[]): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(`usage: ${REWARD_SERVER_USAGE}\n\n${REWARD_SERVER_HELP}\n`);
    return 0;
  }
  let flags: Flags;
  try {
    flags = parseFlags(argv);
  } catch (e) {
    if (e instanceof UsageProblem) {
      process.stderr.write(`rlstream reward-server: ${e.message} (see \`rlstream reward-server --help\`)\n`);
      return 2;
    }
    throw e;
  }
  try {
    return flags.count === 1 ? await serveOne(flags) : await launch(flags);
  } catch (e) {
    process.stderr.write(`rlstream reward-server: ${(e as Error)?.message ?? String(e)}\n`);
    return 1;
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}
