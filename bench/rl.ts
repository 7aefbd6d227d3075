/**
 * RL math throughput on a 512 × 1024 batch (tokens/s = bs·T / time per pass):
 *  - GRPO advantages + low_var_kl + PPO clipped loss + token-mean aggregation (the per-step path of
 *    the advantage and update stages), in float32 and float64;
 *  - GAE (advantages + returns, whitened) on the same shape.
 *
 * `run()` returns the rows for bench/run.ts; `node --import tsx bench/rl.ts` prints the table.
 */
import { pathToFileURL } from 'node:url';
import { Rng } from '../lib/util/rng.ts';
import {
  aggLoss,
  computeGaeAdvantageReturn,
  computeGrpoOutcomeAdvantage,
  computePolicyLossVanilla,
  klPenalty,
  type FloatArray,
  type Mask2D,
  type Tensor2D,
} from '../lib/rl/index.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: string;
}

const BS = 512,
  T = 1024,
  GROUP = 8;

interface Batch {
  rewards: Tensor2D;
  mask: Mask2D;
  index: string[];
  values: Tensor2D;
  logProb: Tensor2D;
  oldLogProb: Tensor2D;
  refLogProb: Tensor2D;
}

function makeBatch(dtype: 'float32' | 'float64', seed: number): Batch {
  const rng = Rng.fromSeed(seed);
  const n = BS * T;
  const arr = (): FloatArray => (dtype === 'float32' ? new Float32Array(n) : new Float64Array(n));
  const rewards = arr(),
    mask = arr(),
    values = arr(),
    lp = arr(),
    old = arr(),
    ref = arr();
  const index: string[] = [];
  for (let i = 0; i < BS; i++) {
    index.push(`p${Math.floor(i / GROUP)}`);
    const len = 1 + rng.int(T);
    for (let t = 0; t < T; t++) {
      const k = i * T + t;
      if (t < len) mask[k] = 1;
      values[k] = rng.next() - 0.5;
      old[k] = -3 * rng.next();
      lp[k] = old[k] + 0.2 * (rng.next() - 0.5);
      ref[k] = old[k] + 0.4 * (rng.next() - 0.5);
    }
    rewards[i * T + len - 1] = rng.next() < 0.5 ? 1 : 0;
  }
  const t2 = (data: FloatArray) => ({ data, bs: BS, T });
  return {
    rewards: t2(rewards),
    mask: t2(mask),
    index,
    values: t2(values),
    logProb: t2(lp),
    oldLogProb: t2(old),
    refLogProb: t2(ref),
  };
}

/** Median seconds per call over `reps` timed calls after `warmup` untimed ones (JIT warm-up). */
function time(fn: () => unknown, reps = 9, warmup = 3): number {
  for (let i = 0; i < warmup; i++) fn();
  const ts: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    fn();
    ts.push((performance.now() - t0) / 1000);
  }
  ts.sort((a, b) => a - b);
  return ts[Math.floor(ts.length / 2)];
}

function grpoPpoStep(b: Batch): number {
  const { advantages } = computeGrpoOutcomeAdvantage({
    token_level_rewards: b.rewards as Tensor2D,
    response_mask: b.mask,
    index: b.index,
  });
  const kl = klPenalty(b.logProb, b.refLogProb, 'low_var_kl');
  const pg = computePolicyLossVanilla(
    { old_log_prob: b.oldLogProb, log_prob: b.logProb, advantages, response_mask: b.mask },
    { clip_ratio: 0.2, clip_ratio_low: 0.2, clip_ratio_high: 0.28, clip_ratio_c: 3, loss_agg_mode: 'token-mean' },
  );
  const klLoss = aggLoss(kl, b.mask, 'token-mean');
  return pg.pg_loss + 0.001 * klLoss;
}

export async function run(): Promise<Row[]> {
  const rows: Row[] = [];
  const tokens = BS * T;
  for (const dtype of ['float32', 'float64'] as const) {
    const b = makeBatch(dtype, 1);
    const s1 = time(() => grpoPpoStep(b));
    rows.push({
      name: `rl: GRPO adv + low_var_kl + PPO loss + token-mean, ${BS}×${T} ${dtype}`,
      value: Math.round(tokens / s1),
      unit: 'tokens/s',
      goal: '≥ 5e6',
    });
    const s2 = time(() =>
      computeGaeAdvantageReturn(
        { token_level_rewards: b.rewards, response_mask: b.mask, values: b.values },
        { gamma: 0.99, lam: 0.95 },
      ),
    );
    rows.push({
      name: `rl: GAE advantages + returns, ${BS}×${T} ${dtype}`,
      value: Math.round(tokens / s2),
      unit: 'tokens/s',
      goal: '≥ 5e6',
    });
  }
  return rows;
}

function printTable(rows: Row[]): void {
  const w = Math.max(...rows.map((r) => r.name.length));
  console.log(`${'benchmark'.padEnd(w)}  ${'value'.padStart(14)}  unit       goal`);
  for (const r of rows)
    console.log(`${r.name.padEnd(w)}  ${r.value.toExponential(3).padStart(14)}  ${r.unit.padEnd(9)}  ${r.goal ?? ''}`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  printTable(await run());
}
