/**
 * A Kafka-protocol broker for tests: librdkafka's mock cluster (infra/kafka-mock/mockbroker.c),
 * built on demand into test/.tmp/ and started per test file, or the real broker named by
 * `KAFKA_BROKERS` (comma-separated host:port) when that is set.
 *
 * The mock listens on random 127.0.0.1 ports and prints `BOOTSTRAP=<host:port,...>`; it is stopped
 * by PID (SIGTERM, then SIGKILL). See infra/kafka-mock/README.md for what it can and cannot do.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { TopicSpec } from '../lib/bus/port.ts';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const SOURCE = join(ROOT, 'infra/kafka-mock/mockbroker.c');
const BUILD = join(ROOT, 'infra/kafka-mock/build.sh');
const BINARY = join(ROOT, 'test/.tmp/mockbroker');

export interface KafkaTarget {
  brokers: string[];
  /** A real broker from KAFKA_BROKERS (not started or stopped here). */
  external: boolean;
  /** The mock's controller-id patch applied (admin calls and the idempotent producer work). Always true for a real broker. */
  controllerFixed: boolean;
  /** PID of the mock broker process, if one was started. */
  pid?: number;
  stop(): Promise<void>;
}

/** Builds the mock broker if it is missing or older than its source. Returns the binary's path. */
export function buildMockBroker(): string {
  if (existsSync(BINARY) && statSync(BINARY).mtimeMs >= statSync(SOURCE).mtimeMs) return BINARY;
  const r = spawnSync('bash', [BUILD, BINARY], { encoding: 'utf8' });
  if (r.status !== 0) {
    throw new Error(
      `could not build the Kafka mock broker (${BUILD}):\n${r.stderr || r.error?.message}\n` +
        "It needs gcc and librdkafka's headers: apt-get install -y gcc librdkafka-dev. " +
        'Or point the tests at a real broker: KAFKA_BROKERS=localhost:9092',
    );
  }
  return BINARY;
}

/**
 * Starts a mock cluster (`brokers` brokers, default 3) with `topics` pre-created (other topics are
 * auto-created with 4 partitions on first use), or returns KAFKA_BROKERS when set.
 */
export async function startKafka(
  opts: {
    brokers?: number;
    topics?: TopicSpec[];
    timeoutMs?: number;
    /** Fault injection (mock only): the next requests of an API key fail with these Kafka error codes, e.g. `{ 14: [42] }`. */
    requestErrors?: Record<number, number[]>;
  } = {},
): Promise<KafkaTarget> {
  const env = process.env.KAFKA_BROKERS?.trim();
  if (env) {
    return {
      brokers: env
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean),
      external: true,
      controllerFixed: true,
      async stop() {
        /* not ours */
      },
    };
  }
  const bin = buildMockBroker();
  const args = [String(opts.brokers ?? 3), ...(opts.topics ?? []).map((t) => `${t.name}:${t.partitions}`)];
  const inject = Object.entries(opts.requestErrors ?? {})
    .map(([api, errs]) => `${api}:${errs.join(',')}`)
    .join(';');
  const child = spawn(bin, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, MOCK_REQUEST_ERRORS: inject },
  });
  const killOnExit = () => {
    try {
      child.kill('SIGKILL');
    } catch {
      /* gone */
    }
  };
  process.once('exit', killOnExit);
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (d: string) => {
    stderr += d;
  });
  const bootstrap = await new Promise<string>((resolveBoot, reject) => {
    let out = '';
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(
        new Error(`mock broker printed no BOOTSTRAP line within ${opts.timeoutMs ?? 10_000} ms; stderr: ${stderr}`),
      );
    }, opts.timeoutMs ?? 10_000);
    child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      out += d;
      const m = /^BOOTSTRAP=(\S+)$/m.exec(out);
      if (m) {
        clearTimeout(timer);
        resolveBoot(m[1]);
      }
    });
    child.once('exit', (code, sig) => {
      clearTimeout(timer);
      reject(new Error(`mock broker exited (${code ?? sig}) before it was ready; stderr: ${stderr}`));
    });
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
  });
  // Keep draining its output so it never blocks on a full pipe.
  child.stdout!.resume();
  return {
    brokers: bootstrap.split(','),
    external: false,
    controllerFixed: !/controller id not patched/.test(stderr) && !process.env.MOCK_NO_CONTROLLER_FIX,
    pid: child.pid,
    stop: () => stopChild(child).finally(() => process.removeListener('exit', killOnExit)),
  };
}

async function stopChild(child: ChildProcess, graceMs = 3000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.kill('SIGTERM');
  const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited;
  clearTimeout(t);
}
