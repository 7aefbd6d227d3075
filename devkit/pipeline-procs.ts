/**
 * Helpers for end-to-end tests of the distributed mode: a fresh PostgreSQL database per run, the
 * Kafka mock with a run's topics pre-created, and the five stages as `rlstream serve` processes
 * (bounded, stopped by PID).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { LOGICAL_TOPICS, topicName } from '../lib/contracts/index.ts';
import { startKafka, type KafkaTarget } from './kafka-mock.ts';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const PG_URL = process.env.RLSTREAM_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** Creates a fresh database next to the test database; returns its URL and a drop function. */
/**
 * The URL of a migrated database as `rlstream_reader`, the read-only role `rlstream sql` runs
 * queries as (migrate creates it NOLOGIN; trust auth needs no password once logins are on).
 */
export async function readerUrl(url: string): Promise<string> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query('alter role rlstream_reader login');
  } finally {
    await c.end();
  }
  const u = new URL(url);
  u.username = 'rlstream_reader';
  return u.toString();
}

export async function freshDatabase(name: string): Promise<{ url: string; drop(): Promise<void> }> {
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  try {
    await admin.query(`drop database if exists ${name}`);
    await admin.query(`create database ${name}`);
  } finally {
    await admin.end();
  }
  const u = new URL(PG_URL);
  u.pathname = `/${name}`;
  return {
    url: u.toString(),
    async drop() {
      const c = new pg.Client({ connectionString: PG_URL });
      await c.connect();
      try {
        await c.query(`drop database if exists ${name} with (force)`);
      } finally {
        await c.end();
      }
    },
  };
}

const SINGLE = new Set(['policy', 'control', 'metrics', 'deadletter']);

/** The Kafka mock with every topic of the run pre-created (the mock has no working admin API). */
export function kafkaForRun(
  prefix: string,
  runId: string | readonly string[],
  partitions: number,
): Promise<KafkaTarget> {
  const runs = typeof runId === 'string' ? [runId] : runId;
  return startKafka({
    topics: runs.flatMap((r) =>
      LOGICAL_TOPICS.map((t) => ({ name: topicName(prefix, r, t), partitions: SINGLE.has(t) ? 1 : partitions })),
    ),
  });
}

/**
 * The tests run a served stage to the end of its run and wait for it to exit, and give it a fresh
 * database to migrate (a cluster runs `rlstream migrate` first and keeps finished stages idle);
 * several stages share this machine, so each serves HTTP on a free port.
 */
export const SERVE_ENV: NodeJS.ProcessEnv = {
  RLSTREAM_PIPELINE__ON_RUN_END: 'exit',
  RLSTREAM_PIPELINE__MIGRATE_ON_START: 'true',
  RLSTREAM_PIPELINE__HTTP_PORT: '0',
};

export interface StageProc {
  stage: string;
  replica: number;
  child: ChildProcess;
  exit: Promise<number | null>;
  output: () => string;
}

export function serveStage(
  stage: string,
  replica: number,
  configFile: string,
  overrides: string[],
  env: NodeJS.ProcessEnv = {},
): StageProc {
  const child = spawn(
    process.execPath,
    [join(ROOT, 'bin/rlstream.mjs'), 'serve', stage, configFile, ...overrides, '--replica', String(replica)],
    {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, RLSTREAM_LOG_JSON: '1', ...SERVE_ENV, ...env },
    },
  );
  let out = '';
  child.stdout!.on('data', (d) => {
    out = (out + d).slice(-20000);
  });
  child.stderr!.on('data', (d) => {
    out = (out + d).slice(-20000);
  });
  const exit = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  return { stage, replica, child, exit, output: () => out };
}

/** Runs the five stages (rolloutReplicas rollout processes) until all exit; kills all after timeoutMs. */
export async function runDistributed(
  configFile: string,
  overrides: string[],
  opts: { rolloutReplicas?: number; timeoutMs?: number } = {},
): Promise<StageProc[]> {
  const procs: StageProc[] = [];
  for (const s of ['update', 'controller', 'advantage', 'reward']) procs.push(serveStage(s, 0, configFile, overrides));
  for (let r = 0; r < (opts.rolloutReplicas ?? 1); r++) {
    // members of one group joining at the same instant sometimes get an invalid-request error from
    // the librdkafka mock's group coordinator; a second replica joins a moment later
    if (r > 0) await new Promise((res) => setTimeout(res, 4000));
    procs.push(serveStage('rollout', r, configFile, overrides));
  }
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((r) => {
    timer = setTimeout(() => r('timeout'), opts.timeoutMs ?? 240_000);
  });
  const all = Promise.all(procs.map((p) => p.exit));
  const res = await Promise.race([all, timeout]);
  clearTimeout(timer);
  if (res === 'timeout') {
    for (const p of procs) p.child.kill('SIGKILL');
    await all;
    throw new Error(
      `distributed run timed out; outputs:\n${procs.map((p) => `--- ${p.stage}#${p.replica}\n${p.output().slice(-3000)}`).join('\n')}`,
    );
  }
  return procs;
}
