/**
 * lib/rl/f32.ts reproduces torch's CPU float32 summation order, which decides exact zeros in the
 * reference (e.g. identical float32 scores in a group). Pinned against torch's own results
 * (test/fixtures/golden/torch_f32_sums.json, written by gen_torch_f32_sums.py with torch 1.13).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, resolve } from 'node:path';
import { torchMeanF32, torchSumF32 } from '../../../lib/rl/index.ts';

const fixture = resolve(dirname(fileURLToPath(import.meta.url)), '../../fixtures/golden/torch_f32_sums.json');

test('torchSumF32/torchMeanF32 are bit-identical to torch float32 .sum()/.mean() (1 … 4099 elements)', () => {
  const { cases } = JSON.parse(readFileSync(fixture, 'utf8')) as {
    cases: { n: number; kind: string; x: number[]; sum: number; mean: number }[];
  };
  assert.ok(cases.length > 100);
  for (const c of cases) {
    const x = Float64Array.from(c.x);
    assert.equal(torchSumF32(x), c.sum, `sum of ${c.n} (${c.kind})`);
    assert.equal(torchMeanF32(x), c.mean, `mean of ${c.n} (${c.kind})`);
  }
});

test('torch order by hand: 4 interleaved accumulators with the tail into the first (n < 8); 8 lanes added in turn', () => {
  // n = 5: torch sums (((a0 + a4) + a1) + a2) + a3; sequential summation loses the two 2^-24
  const x = new Float64Array([2 ** -24, 1, 0, 0, 2 ** -24]);
  assert.equal(torchSumF32(x), 1 + 2 ** -23);
  let seq = 0;
  for (const v of x) seq = Math.fround(seq + v);
  assert.equal(seq, 1);
  // n = 8 (one 8-lane vector): lanes are added one by one, i.e. sequentially
  assert.equal(torchSumF32(new Float64Array([1, 2 ** -24, 2 ** -24, 0, 0, 0, 0, 0])), 1);
  // an offset run inside a larger array (one row of a (bs, T) tensor)
  assert.equal(torchSumF32(new Float64Array([9, 9, 2 ** -24, 1, 0, 0, 2 ** -24, 9]), 2, 5), 1 + 2 ** -23);
  assert.equal(torchSumF32(new Float64Array(1000).fill(0.5)), 500);
});
