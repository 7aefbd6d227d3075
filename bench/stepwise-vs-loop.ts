/**
 * The decode graphs alone, no HTTP, no batcher: `StepDecoder` (prefill, then one step-graph run
 * per token over all rows; what serve-policy's decode thread runs) against `Sampler.generate` with
 * `decode: 'loop'` (the in-graph loop; the rollout's sampler for rows under 256 prompt + new
 * tokens) on the same 64 sequences (16-token prompts, 32 new tokens,
 * temperature 1, 1 ORT thread), alternating, CPU time per 1000 tokens (least of the repeats) and
 * the ratio loop ÷ step graph (tokens per CPU-second). RLSTREAM_BENCH_INFER_SHAPE picks the model
 * as in bench/inference.ts (`tiny` or `smollm2_135m`); RLSTREAM_BENCH_INFER_REPEATS (default 3);
 * RLSTREAM_ORT_PROFILE=<prefix> writes ORT's per-node profile of each graph.
 * RLSTREAM_BENCH_DECODE_SEQS / _PROMPT / _NEW (default 64 / 16 / 32) set the rows, prompt tokens
 * and new tokens; RLSTREAM_BENCH_DECODE_ONLY=loop|step runs one side alone and adds the process's
 * peak RSS (VmHWM), so each graph's memory is measured in a process of its own.
 *
 * Run: `node --import tsx bench/stepwise-vs-loop.ts`.
 */
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { pathToFileURL } from 'node:url';
import { loadCheckpoint } from '../lib/model/checkpoint.ts';
import type { ModelConfig } from '../lib/model/config.ts';
import { initWeights } from '../lib/model/init.ts';
import type { Weights } from '../lib/model/params.ts';
import { Sampler, sequenceUniforms } from '../lib/model/sample.ts';
import { appendRows, emptyState, StepDecoder } from '../lib/model/stepwise.ts';
import { defaultSessionCache } from '../lib/model/session-cache.ts';
import { ByteTokenizer } from '../lib/model/tokenizer.ts';
import { openServedPolicy } from '../lib/inference/served-policy.ts';
import { statusKb } from '../lib/pipeline/mem-trace.ts';
import { withSamplingMask } from '../lib/pipeline/policy.ts';
import { smollm2RandomDir, tinyBenchConfig, type Row } from './inference.ts';

const SHAPE = process.env.RLSTREAM_BENCH_INFER_SHAPE ?? 'tiny';
const REPEATS = Number(process.env.RLSTREAM_BENCH_INFER_REPEATS ?? 3);
const SEQS = Number(process.env.RLSTREAM_BENCH_DECODE_SEQS ?? 64),
  NEW = Number(process.env.RLSTREAM_BENCH_DECODE_NEW ?? 32),
  PROMPT = Number(process.env.RLSTREAM_BENCH_DECODE_PROMPT ?? 16);
const ONLY = ((v) => {
  if (v === undefined || v === 'loop' || v === 'step') return v ?? null;
  throw new Error(`RLSTREAM_BENCH_DECODE_ONLY must be loop or step, got ${v}`);
})(process.env.RLSTREAM_BENCH_DECODE_ONLY);

export async function run(): Promise<Row[]> {
  let c: ModelConfig, weights: Weights, stopIds: number[];
  if (SHAPE === 'tiny') {
    const tok = new ByteTokenizer();
    const base = tinyBenchConfig(tok);
    weights = initWeights(base, 1);
    c = withSamplingMask(base, tok);
    stopIds = [tok.eos];
  } else if (SHAPE === 'smollm2_135m') {
    const dir = await smollm2RandomDir();
    const { policy } = await openServedPolicy(dir);
    c = policy.config;
    stopIds = policy.stopIds;
    weights = (await loadCheckpoint(dir, { optimizer: false })).weights;
  } else throw new Error(`RLSTREAM_BENCH_INFER_SHAPE must be tiny or smollm2_135m, got ${SHAPE}`);
  const reqs = Array.from({ length: SEQS }, (_, i) => ({
    id: `s${i}`,
    prompt: Array.from({ length: PROMPT }, (_, t) => 32 + ((i * 7 + t * 13) % 90)),
  }));
  const params = { temperature: 1, maxNewTokens: NEW, seed: 1, eosTokenIds: stopIds };
  const sampler = new Sampler(c, { threads: 1, decode: 'loop' });
  const decoder = new StepDecoder(c, { threads: 1 });
  const cpuMs = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1000;
  };
  const loop = async () => {
    const out = await sampler.generate(weights, reqs, params);
    return out.reduce((k, g) => k + g.tokens.length, 0);
  };
  const stepwise = async () => {
    const pre = await decoder.prefill(weights, reqs);
    const st = appendRows(c, emptyState(c), pre);
    const u = new Float32Array(SEQS * NEW);
    reqs.forEach((r, b) => u.set(sequenceUniforms(1, r.id, NEW), b * NEW));
    const rowParams = reqs.map(() => ({ temperature: 1, topP: 1, topK: 0 }));
    // one step-graph run per token, as the decode thread runs it (steps-per-run 1)
    let n = 0;
    for (let t = 0; t < NEW; t++) {
      const ut = new Float32Array(SEQS);
      for (let b = 0; b < SEQS; b++) ut[b] = u[b * NEW + t];
      const res = await decoder.step(weights, st, ut, 1, rowParams, stopIds, false);
      n += res.tokens.length;
    }
    return n;
  };
  const best = { loop: Infinity, step: Infinity };
  for (let r = -1; r < REPEATS; r++)
    for (const [name, f] of (
      [
        ['loop', loop],
        ['step', stepwise],
      ] as const
    ).filter(([name]) => ONLY === null || name === ONLY)) {
      const c0 = cpuMs();
      const n = await f();
      const ms = ((cpuMs() - c0) / n) * 1000;
      if (r >= 0) best[name] = Math.min(best[name], ms);
    }
  // RLSTREAM_ORT_PROFILE: ORT writes each session's per-node profile when the session is released
  if (process.env.RLSTREAM_ORT_PROFILE) await defaultSessionCache.clear();
  const round = (x: number, d = 2) => Math.round(x * 10 ** d) / 10 ** d;
  const shape = `${SHAPE}${SEQS === 64 && PROMPT === 16 && NEW === 32 ? '' : `_${SEQS}x${PROMPT}+${NEW}`}`;
  if (ONLY !== null)
    return [
      { name: `inference/decode_graphs/${shape}/${ONLY}_cpu_ms_per_1k_tok`, value: round(best[ONLY]), unit: 'ms' },
      {
        name: `inference/decode_graphs/${shape}/${ONLY}_peak_rss`,
        value: round(statusKb('VmHWM', readFileSync('/proc/self/status', 'utf8')) / 1024 ** 2),
        unit: 'GB',
      },
      { name: `inference/decode_graphs/${shape}/load_avg_1m`, value: round(loadavg()[0], 1), unit: 'load' },
    ];
  return [
    { name: `inference/decode_graphs/${shape}/loop_cpu_ms_per_1k_tok`, value: round(best.loop), unit: 'ms' },
    { name: `inference/decode_graphs/${shape}/step_cpu_ms_per_1k_tok`, value: round(best.step), unit: 'ms' },
    {
      name: `inference/decode_graphs/${shape}/step_cpu_vs_loop`,
      value: round(best.loop / best.step, 3),
      unit: 'ratio',
    },
    { name: `inference/decode_graphs/${shape}/load_avg_1m`, value: round(loadavg()[0], 1), unit: 'load' },
  ];
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  for (const r of await run()) console.log(`${r.name}\t${r.value}\t${r.unit}`);
  process.exit(0);
}
