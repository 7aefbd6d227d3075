/**
 * Runs one test tier with node's test runner: `node --import tsx scripts/run-tests.ts unit|int|e2e [filter]`.
 * Node 20's `--test` does not expand `**` globs, so the files are listed here. Extra arguments
 * filter the file list by substring (e.g. `npm run test:unit -- rl/`).
 */
import { readdirSync, readFileSync, statSync, existsSync } from 'node:fs';
import { join, relative } from 'node:path';
import { spawnSync } from 'node:child_process';

const tier = process.argv[2];
const filters = process.argv.slice(3);
if (!['unit', 'int', 'e2e'].includes(tier ?? '')) {
  console.error('usage: run-tests.ts unit|int|e2e [filter …]');
  process.exit(2);
}
const root = join(import.meta.dirname, '..');
const dir = join(root, 'test', tier);
function walk(d: string, out: string[] = []): string[] {
  if (!existsSync(d)) return out;
  for (const n of readdirSync(d).sort()) {
    const p = join(d, n);
    if (statSync(p).isDirectory()) walk(p, out);
    else if (n.endsWith('.test.ts')) out.push(relative(root, p));
  }
  return out;
}
const files = walk(dir).filter((f) => filters.length === 0 || filters.some((x) => f.includes(x)));
if (files.length === 0) {
  console.error(`no ${tier} test files${filters.length ? ` matching ${filters.join(', ')}` : ''}`);
  process.exit(1);
}
// A file that changes or shares something the others use (chaos.test.ts stops PostgreSQL; int
// files that use the shared test database) says so with the marker below in its header and runs
// alone, before the rest. The other files run two at a time: most of their time is waiting on
// processes, timers and back-offs, or single-threaded.
const ALONE_MARKER = '@runs-alone';
const alone = files.filter((f) => readFileSync(join(root, f), 'utf8').includes(ALONE_MARKER));
const rest = files.filter((f) => !alone.includes(f));
const concurrency = 2;

function run(list: string[], n: number): number {
  if (list.length === 0) return 0;
  const r = spawnSync(
    process.execPath,
    ['--import', 'tsx', '--test', '--test-force-exit', `--test-concurrency=${n}`, '--test-timeout=600000', ...list],
    { cwd: root, stdio: 'inherit' },
  );
  return r.status ?? 1;
}
const status = run(alone, 1) || run(rest, concurrency);
process.exit(status);
