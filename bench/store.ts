/**
 * Trajectory ingest into the store, rows/s, on PGlite (embedded) and on PostgreSQL, with the
 * store's COPY path next to the array-parameter (`unnest`) and multi-row VALUES inserts.
 *
 * Rows are realistic: 64 prompt tokens, 256 response tokens, three real[] columns (behaviour and
 * reference log-probs, per-token advantages; Float32Array as ONNX returns them), ~250 + ~1000
 * characters of text, reward details. Batches of 1024 rows (128 prompts × 8 samples).
 *
 *   node --import tsx bench/store.ts            # both backends
 *   RLSTREAM_BENCH_PG_URL=postgres://… node --import tsx bench/store.ts
 *   RLSTREAM_BENCH_SKIP=pglite|postgres          # leave one out
 *
 * PostgreSQL: RLSTREAM_BENCH_PG_URL, else RLSTREAM_TEST_PG_URL, else postgres://postgres@127.0.0.1:5432/test.
 * The bench writes under run ids `bench-store-…` and deletes them afterwards.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { CompiledQuery } from 'kysely';
import { openDatabase, type Database, type Tx } from '../lib/db/database.ts';
import { createStore, type Store, type TrajectoryRow } from '../lib/store/index.ts';
import { unnestTrajectories } from '../lib/store/postgres-store.ts';
import { VALUES_ROWS_PER_STATEMENT, valuesInsert } from '../lib/store/trajectory-codec.ts';
import { Rng } from '../lib/util/rng.ts';
import { errorMessage } from '../lib/errors.ts';

export interface BenchRow {
  name: string;
  value: number;
  unit: string;
  /** The value should be at least this. */
  goal?: number;
}

const PROMPT_TOKENS = 64;
const RESPONSE_TOKENS = 256;
const BATCH = 1024;
const POSTGRES_GOAL = 25_000;
const WORDS = [
  'the',
  'answer',
  'is',
  'therefore',
  'we',
  'compute',
  'sum',
  'of',
  'and',
  'so',
  'step',
  'first',
  'then',
  '=',
  '+',
  '42',
  '7',
  'x',
];

function sentence(rng: Rng, chars: number): string {
  const parts: string[] = [];
  let n = 0;
  while (n < chars) {
    const w = WORDS[rng.int(WORDS.length)]!;
    parts.push(w);
    n += w.length + 1;
  }
  return parts.join(' ');
}

export function makeRows(runId: string, count: number, seed = 1): TrajectoryRow[] {
  const rng = Rng.fromSeed(seed);
  const rows: TrajectoryRow[] = [];
  for (let i = 0; i < count; i++) {
    const prompt = Math.floor(i / 8);
    const behaviour = new Float32Array(RESPONSE_TOKENS);
    const ref = new Float32Array(RESPONSE_TOKENS);
    for (let k = 0; k < RESPONSE_TOKENS; k++) {
      behaviour[k] = Math.log(rng.next() * 0.999 + 0.001);
      ref[k] = behaviour[k]! + (rng.next() - 0.5) * 0.1;
    }
    const advantage = (rng.next() - 0.5) * 2;
    const reward = rng.next() < 0.5 ? 1 : 0;
    rows.push({
      id: `${runId}/s${Math.floor(prompt / 128)}/p${prompt}/${i % 8}`,
      runId,
      step: Math.floor(prompt / 128),
      epoch: 0,
      kind: 'train',
      groupUid: `g${prompt}`,
      promptIndex: prompt,
      sampleIndex: i % 8,
      policyVersion: Math.floor(prompt / 128),
      promptTokens: Int32Array.from({ length: PROMPT_TOKENS }, () => rng.int(32000)),
      responseTokens: Int32Array.from({ length: RESPONSE_TOKENS }, () => rng.int(32000)),
      promptText: sentence(rng, 250),
      responseText: sentence(rng, 1000),
      groundTruth: '42',
      behaviourLogprobs: behaviour,
      refLogprobs: ref,
      oldLogprobs: null,
      advantages: new Float32Array(RESPONSE_TOKENS).fill(advantage),
      advantage,
      returns: null,
      reward,
      rewardDetails: { correct: reward === 1, format: 1 },
      rewardFailure: null,
      finishReason: 'stop',
      filtered: false,
      filterReason: null,
      staleness: 0,
    });
  }
  return rows;
}

type Method = (batch: TrajectoryRow[]) => Promise<unknown>;

interface Rate {
  rowsPerSecond: number;
  clientCpuMicrosPerRow: number;
}

async function rate(
  store: Store,
  database: Database,
  label: string,
  count: number,
  method: (s: Store, db: Database) => Method,
  concurrency = 1,
): Promise<Rate> {
  const runId = `bench-store-${label}-${process.pid}-${Date.now()}`;
  await store.upsertRun({ runId, project: 'bench', experiment: 'store', config: {} });
  const rows = makeRows(runId, count + 256);
  const insert = method(store, database);
  await insert(rows.slice(count)); // warm-up: JIT, plan cache
  const batches: TrajectoryRow[][] = [];
  for (let i = 0; i < count; i += BATCH) batches.push(rows.slice(i, i + BATCH));
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < batches.length) await insert(batches[next++]!);
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const stored = await store.countTrajectories(runId);
  if (stored !== count + 256) throw new Error(`bench ${label}: expected ${count + 256} rows stored, found ${stored}`);
  await database.db.deleteFrom('runs').where('run_id', '=', runId).execute();
  return { rowsPerSecond: count / seconds, clientCpuMicrosPerRow: (cpu.user + cpu.system) / count };
}

const copyPath =
  (s: Store): Method =>
  (b) =>
    s.insertTrajectories(b);
const copyInTx =
  (s: Store, d: Database): Method =>
  (b) =>
    d.db.transaction().execute((tx) => s.insertTrajectories(b, { tx }));
const unnestPath =
  (_s: Store, d: Database): Method =>
  (b) =>
    d.db.transaction().execute((tx) => unnestTrajectories(tx, b));
const valuesPath =
  (_s: Store, d: Database): Method =>
  (b) =>
    d.db.transaction().execute(async (tx: Tx) => {
      for (let i = 0; i < b.length; i += VALUES_ROWS_PER_STATEMENT) {
        const q = valuesInsert(b.slice(i, i + VALUES_ROWS_PER_STATEMENT));
        await tx.executeQuery(CompiledQuery.raw(q.text, q.values));
      }
    });
/** Re-delivery of rows already stored: every row a duplicate. */
async function duplicateRate(store: Store, database: Database, count: number): Promise<number> {
  const runId = `bench-store-dup-${process.pid}-${Date.now()}`;
  await store.upsertRun({ runId, project: 'bench', experiment: 'store', config: {} });
  const rows = makeRows(runId, count);
  await store.insertTrajectories(rows);
  const t0 = performance.now();
  for (let i = 0; i < count; i += BATCH) {
    const r = await store.insertTrajectories(rows.slice(i, i + BATCH));
    if (r.inserted !== 0) throw new Error('bench: re-delivered rows were inserted again');
  }
  const seconds = (performance.now() - t0) / 1000;
  await database.db.deleteFrom('runs').where('run_id', '=', runId).execute();
  return count / seconds;
}

async function benchBackend(kind: 'pglite' | 'postgres', database: Database): Promise<BenchRow[]> {
  const store = createStore(database);
  const out: BenchRow[] = [];
  const scale = kind === 'pglite' ? 0.5 : 1;
  const n = (x: number) => Math.max(BATCH, Math.round((x * scale) / BATCH) * BATCH);
  const push = (label: string, r: Rate, goal?: number) => {
    out.push({
      name: `store/${kind}/${label}`,
      value: Math.round(r.rowsPerSecond),
      unit: 'rows/s',
      ...(goal === undefined ? {} : { goal }),
    });
  };
  try {
    const copy = await rate(store, database, 'copy', n(16 * BATCH), copyPath);
    push('copy', copy, kind === 'postgres' ? POSTGRES_GOAL : undefined);
    // CPU of this process per row: for PGlite the whole database engine, for PostgreSQL the client side.
    out.push({
      name: `store/${kind}/copy_${kind === 'pglite' ? 'engine' : 'client'}_cpu_per_row`,
      value: Math.round(copy.clientCpuMicrosPerRow),
      unit: 'µs',
    });
    push('copy_in_caller_tx', await rate(store, database, 'copytx', n(8 * BATCH), copyInTx));
    if (kind === 'postgres') push('copy_2_writers', await rate(store, database, 'copy2', n(16 * BATCH), copyPath, 2));
    push('unnest_insert', await rate(store, database, 'unnest', n(4 * BATCH), unnestPath));
    push('multirow_values_insert', await rate(store, database, 'values', n(4 * BATCH), valuesPath));
    out.push({
      name: `store/${kind}/redelivery_all_duplicates`,
      value: Math.round(await duplicateRate(store, database, n(4 * BATCH))),
      unit: 'rows/s',
    });
  } finally {
    await store.close();
  }
  return out;
}

export async function run(): Promise<BenchRow[]> {
  const skip = process.env.RLSTREAM_BENCH_SKIP ?? '';
  const rows: BenchRow[] = [];
  if (!skip.includes('pglite')) {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-store-'));
    try {
      const database = await openDatabase({ kind: 'pglite', dir });
      try {
        rows.push(...(await benchBackend('pglite', database)));
      } finally {
        await database.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }
  if (!skip.includes('postgres')) {
    const url =
      process.env.RLSTREAM_BENCH_PG_URL ??
      process.env.RLSTREAM_TEST_PG_URL ??
      'postgres://postgres@127.0.0.1:5432/test';
    let database: Database | undefined;
    try {
      database = await openDatabase({ kind: 'postgres', url });
    } catch (e) {
      console.error(`bench/store: PostgreSQL skipped: ${errorMessage(e)}`);
    }
    if (database) {
      try {
        rows.push(...(await benchBackend('postgres', database)));
      } finally {
        await database.close();
      }
    }
  }
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const rows = await run();
  const w = Math.max(...rows.map((r) => r.name.length));
  console.log(`${'benchmark'.padEnd(w)}  ${'value'.padStart(9)}  unit    goal`);
  for (const r of rows) {
    const goal = r.goal === undefined ? '' : `≥ ${r.goal} ${r.value >= r.goal ? '(met)' : '(NOT met)'}`;
    console.log(`${r.name.padEnd(w)}  ${String(r.value).padStart(9)}  ${r.unit.padEnd(6)}  ${goal}`);
  }
}
