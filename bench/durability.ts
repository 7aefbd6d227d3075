/**
 * What the embedded database's durability costs: a batch commit (one transaction: 16 rows of
 * ~1 KB and an offset update, as a stage's batch writes its outputs and commits its offset) on
 * PGlite with fsync at every commit (the default, lib/db/pglite-durable.ts) next to PGlite's own
 * fsync-off mode, interleaved in rounds on one disk, and the cost per training step at the
 * commits a step makes (COMMITS_PER_STEP: `RLSTREAM_CRASH_TRACE=1 rlstream train
 * test/e2e/fixtures/tiny.yaml` reaches `bus:committed` 35 times in 4 steps, ≈ 9 per step).
 *
 *   node --import tsx bench/durability.ts      (RLSTREAM_BENCH_DIR=<dir> to measure another disk)
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { PGlite } from '@electric-sql/pglite';
import { createPglite } from '../lib/db/pglite-durable.ts';

export interface BenchRow {
  name: string;
  value: number;
  unit: string;
  better?: 'higher' | 'lower';
}

const COMMITS_PER_STEP = 9;
const ROUNDS = 5;
const COMMITS_PER_ROUND = 40;

async function commitMs(pg: PGlite, n: number, base: number): Promise<number> {
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    await pg.transaction(async (tx) => {
      await tx.query(
        'insert into t (id, body) select $1::int * 16 + g, repeat(md5(g::text), 32) from generate_series(0, 15) g',
        [base + i],
      );
      await tx.query('update offsets set next_offset = next_offset + 1 where id = 1');
    });
  }
  return (performance.now() - t0) / n;
}

export async function run(): Promise<BenchRow[]> {
  const root = mkdtempSync(join(process.env.RLSTREAM_BENCH_DIR ?? tmpdir(), 'rlstream-bench-fsync-'));
  try {
    const dbs: Record<'durable' | 'fast', PGlite> = {
      durable: await createPglite(join(root, 'durable'), true),
      fast: await createPglite(join(root, 'fast'), false),
    };
    for (const pg of Object.values(dbs))
      await pg.exec(
        'create table t (id int primary key, body text); create table offsets (id int primary key, next_offset int); insert into offsets values (1, 0)',
      );
    const ms: Record<'durable' | 'fast', number[]> = { durable: [], fast: [] };
    for (let r = 0; r < ROUNDS; r++)
      for (const k of r % 2 ? (['fast', 'durable'] as const) : (['durable', 'fast'] as const))
        ms[k].push(await commitMs(dbs[k], COMMITS_PER_ROUND, r * COMMITS_PER_ROUND));
    for (const pg of Object.values(dbs)) await pg.close();
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const durable = median(ms.durable);
    const fast = median(ms.fast);
    return [
      { name: 'batch commit, fsync on (default)', value: durable, unit: 'ms', better: 'lower' },
      { name: 'batch commit, fsync off (PGlite default)', value: fast, unit: 'ms', better: 'lower' },
      { name: 'durability cost per commit', value: durable - fast, unit: 'ms', better: 'lower' },
      {
        name: `durability cost per step (${COMMITS_PER_STEP} commits)`,
        value: (durable - fast) * COMMITS_PER_STEP,
        unit: 'ms',
        better: 'lower',
      },
    ];
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  for (const r of await run()) console.log(`${r.name}: ${r.value.toFixed(2)} ${r.unit}`);
}
