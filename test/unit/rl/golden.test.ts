/**
 * Every case of verl's golden vectors (test/fixtures/golden/rl_golden.json, 699 cases from
 * core_algos.py at the commit named in the file) must pass against lib/rl, in float32 and float64.
 * Prints a per-function table: cases, passed, worst error relative to its tolerance.
 *
 * RLSTREAM_GOLDEN=/path/a.json[:/path/b.json] checks further golden files of the same schema (for
 * example a held-back set) with the same adapters and tolerances.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, resolve } from 'node:path';
import { createHash } from 'node:crypto';
import { adapters, formatTable, loadGolden, runCase, summarise, type GoldenFile } from './golden-harness.ts';

const here = dirname(fileURLToPath(import.meta.url));
const fixture = resolve(here, '../../fixtures/golden/rl_golden.json');

function check(label: string, path: string): void {
  const golden: GoldenFile = loadGolden(path);

  test(`${label}: every function in the golden file has an adapter`, () => {
    const fns = [...new Set(golden.cases.map((c) => c.function))];
    const missing = fns.filter((f) => !adapters[f]);
    assert.deepEqual(missing, [], `no adapter for: ${missing.join(', ')}`);
    assert.ok(golden.cases.length > 0, 'the golden file has cases');
  });

  const results = golden.cases.map(runCase);
  const byFn = new Map<string, number[]>();
  results.forEach((r, i) => byFn.set(r.fn, [...(byFn.get(r.fn) ?? []), i]));
  for (const [fn, idx] of byFn) {
    test(`${label}: ${fn} (${idx.length} cases)`, () => {
      const failed = idx.map((i) => results[i]).filter((r) => !r.passed);
      assert.equal(
        failed.length,
        0,
        failed
          .slice(0, 5)
          .map((r) => `${r.id} [${r.dtype}]: ${r.problems.join('; ')}`)
          .join('\n'),
      );
    });
  }

  test(`${label}: summary`, () => {
    console.log(`\n${label} (${path}, verl ${golden.commit})\n${formatTable(summarise(golden.cases, results))}\n`);
    const failed = results.filter((r) => !r.passed).length;
    assert.equal(failed, 0, `${failed} of ${results.length} golden cases failed`);
  });
}

check('golden', fixture);

// In CI the shared copy sits beside the clone: the project's fixture must be the same file.
const shared = resolve(here, '../../../../shared/golden/rl_golden.json');
if (existsSync(shared)) {
  test('golden fixture is identical to ../shared/golden/rl_golden.json', () => {
    const sha = (p: string) => createHash('sha256').update(readFileSync(p)).digest('hex');
    assert.equal(
      sha(fixture),
      sha(shared),
      'test/fixtures/golden/rl_golden.json is stale: copy ../shared/golden/rl_golden.json over it',
    );
  });
}

for (const extra of (process.env.RLSTREAM_GOLDEN ?? '').split(':').filter(Boolean)) check(`golden ${extra}`, extra);
