/**
 * Python reward benchmark: a trivial verl-style `compute_score` (exact match after strip) over
 * 10 000 responses, rows/s —
 *  - in Python: the reward stage's pool (lib/reward-fns/python-pool.ts; `reward.python_workers`
 *    default, many items per message), interpreter `RLSTREAM_BENCH_PYTHON` or /usr/bin/python3;
 *  - the same function in JS, as rlstream runs a JS `reward_fn_path`: in its worker thread with a
 *    per-sample time limit (lib/reward-fns/function-worker.ts), one sample per message;
 *  - the same JS function called in process (no isolation, no time limit): the upper bound.
 * Rounds interleave the three (median of 3); the ratio Python / JS worker is the goal (≥ 0.5: the
 * pool and the pipe cost at most half).
 *
 * Run: `node --import tsx bench/python-reward.ts` or `npm run bench -- python-reward`.
 */
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PythonRewardPool } from '../lib/reward-fns/python-pool.ts';
import { FunctionRewardWorker } from '../lib/reward-fns/function-worker.ts';
import { applyRewardFn, loadRewardModule, type RewardInput } from '../lib/reward-fns/index.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number;
}

const N = Number(process.env.RLSTREAM_BENCH_PY_REWARD_N ?? 10_000);
const ROUNDS = 3;
const PYTHON = process.env.RLSTREAM_BENCH_PYTHON ?? (existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3');

const PY = `def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.strip() == ground_truth.strip() else 0.0
`;
const JS = `export function compute_score(data_source, solution_str, ground_truth, extra_info) {
  return solution_str.trim() === ground_truth.trim() ? 1 : 0;
}
`;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

export async function run(): Promise<Row[]> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-pyreward-'));
  try {
    writeFileSync(join(dir, 'score.py'), PY);
    writeFileSync(join(dir, 'score.mjs'), JS);
    const inputs: RewardInput[] = Array.from({ length: N }, (_, i) => ({
      prompt: `${i}+1=`,
      response: ` ${i % 3 ? i + 1 : i} `,
      ground_truth: String(i + 1),
      data_source: 'bench',
      extra_info: { i },
      kwargs: {},
    }));
    const pool = new PythonRewardPool({
      path: join(dir, 'score.py'),
      python: PYTHON,
      timeoutS: 30,
      stderr: () => undefined,
    });
    await pool.start();
    const worker = new FunctionRewardWorker({ path: join(dir, 'score.mjs'), name: null }, 30_000);
    await worker.start();
    const direct = await loadRewardModule(join(dir, 'score.mjs'));
    const expected = inputs.reduce((a, x) => a + (x.response.trim() === x.ground_truth ? 1 : 0), 0);
    const check = (total: number, what: string) => {
      if (total !== expected) throw new Error(`${what}: total reward ${total}, expected ${expected}`);
    };
    const rate: Record<'py' | 'jsWorker' | 'jsDirect', number[]> = { py: [], jsWorker: [], jsDirect: [] };
    const time = async (f: () => Promise<number>, what: keyof typeof rate) => {
      const t0 = performance.now();
      check(await f(), what);
      rate[what].push(N / ((performance.now() - t0) / 1000));
    };
    try {
      for (let r = 0; r < ROUNDS; r++) {
        await time(async () => {
          const out = await pool.score(inputs);
          return out.reduce((a, o) => a + (o.ok ? o.reward : NaN), 0);
        }, 'py');
        await time(async () => {
          let t = 0;
          for (const x of inputs) {
            const o = await worker.score(x);
            t += o.ok ? o.reward : NaN;
          }
          return t;
        }, 'jsWorker');
        await time(async () => {
          let t = 0;
          for (const x of inputs) {
            const o = await applyRewardFn(direct, x);
            t += o.ok ? o.reward : NaN;
          }
          return t;
        }, 'jsDirect');
      }
    } finally {
      await pool.close();
      await worker.close();
    }
    const py = median(rate.py),
      jsw = median(rate.jsWorker),
      jsd = median(rate.jsDirect);
    return [
      {
        name: `python compute_score, pool (${N} rows, python ${pool.pythonVersion})`,
        value: Math.round(py),
        unit: 'rows/s',
      },
      { name: 'same function in JS, worker thread (reward_fn_path .mjs)', value: Math.round(jsw), unit: 'rows/s' },
      { name: 'same function in JS, called in process', value: Math.round(jsd), unit: 'rows/s' },
      { name: 'python pool / JS worker thread', value: Math.round((py / jsw) * 100) / 100, unit: '×', goal: 0.5 },
      { name: 'python pool / JS in process', value: Math.round((py / jsd) * 1000) / 1000, unit: '×' },
    ];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  for (const r of await run()) console.log(`${r.name}: ${r.value} ${r.unit}${r.goal ? ` (goal ≥ ${r.goal})` : ''}`);
}
