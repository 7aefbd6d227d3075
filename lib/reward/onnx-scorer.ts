/**
 * ONNX sequence scorer run by onnxruntime-node: `reward.type: model` in the reward stage, and the
 * `.onnx` scorer of `rlstream reward-server`.
 *
 * Model contract: inputs `input_ids` [B, T] and `attention_mask` [B, T] (int64, int32 or float;
 * right-padded, mask 1 on real tokens); first output is one score per sequence, [B] or [B, 1] —
 * or [B, T] per-token values (a value model), of which the value at the last real token is taken.
 * Text is tokenized prompt ⧺ response; the default tokenizer is the model engine's byte-level one
 * (lib/model/tokenizer.ts: id = UTF-8 byte, 0–255) — pass `tokenize` for another. Padding uses
 * `padId` (default 0: any id the embedding has; masked out). Sequences longer than `maxLength`
 * keep their last `maxLength` tokens (the response end matters most). The model engine's value
 * model exported by value-scorer-export.ts is such a scorer.
 *
 * Calls made while a batch is being assembled are coalesced into one `session.run` of at most
 * `maxBatch` sequences. Reward = scale · transform(raw); with `threshold`, reward = 1 when
 * scale · transform(raw) ≥ threshold, else 0.
 */
import { basename } from 'node:path';
import { existsSync } from 'node:fs';
import * as ort from 'onnxruntime-node';
import { ConfigError, RlError } from '../errors.ts';
import { ByteTokenizer } from '../model/tokenizer.ts';
import type { RewardModelOptions, RewardOutcome, RewardRequestItem } from './types.ts';

export interface OnnxSequenceScorerOptions {
  path: string;
  transform?: 'none' | 'sigmoid';
  scale?: number;
  threshold?: number | null;
  maxLength?: number;
  maxBatch?: number;
  threads?: number;
  /** Text → token ids (default: UTF-8 bytes). */
  tokenize?: (text: string) => number[];
  padId?: number;
}

export interface OnnxSequenceScorer {
  /** Raw model outputs, one per sequence (NaN where the model produced a non-finite value). */
  rawScores(seqs: number[][]): Promise<number[]>;
  /** Transformed scores, one per sequence. */
  scoreTokens(seqs: number[][]): Promise<number[]>;
  /** Transformed scores of prompt ⧺ response. */
  scoreTexts(pairs: { prompt: string; response: string }[]): Promise<number[]>;
  tokenizePair(prompt: string, response: string): number[];
  close(): Promise<void>;
}

const bytes = new ByteTokenizer();

/** The model engine's byte-level tokenizer (ids 0–255 = UTF-8 bytes), without specials. */
export function byteTokenize(text: string): number[] {
  return Array.from(bytes.encode(text));
}

export function applyTransform(raw: number, t: { transform?: 'none' | 'sigmoid'; scale?: number; threshold?: number | null }): number {
  let v = t.transform === 'sigmoid' ? 1 / (1 + Math.exp(-raw)) : raw;
  v *= t.scale ?? 1;
  if (t.threshold !== undefined && t.threshold !== null && Number.isFinite(v)) v = v >= t.threshold ? 1 : 0;
  return v;
}

type IntKind = 'int64' | 'int32' | 'float32';

function kindOf(meta: ort.InferenceSession.ValueMetadata | undefined, name: string, path: string): IntKind {
  if (!meta || !meta.isTensor) return 'int64';
  const t = meta.type;
  if (t === 'int64' || t === 'int32') return t;
  if (t === 'float32') return 'float32';
  throw new ConfigError(`${path}: input ${name} has type ${t}; a sequence scorer's input_ids/attention_mask must be int64, int32 or float32`);
}

function makeTensor(kind: IntKind, data: number[], dims: number[]): ort.Tensor {
  if (kind === 'int64') return new ort.Tensor('int64', BigInt64Array.from(data, (x) => BigInt(x)), dims);
  if (kind === 'int32') return new ort.Tensor('int32', Int32Array.from(data), dims);
  return new ort.Tensor('float32', Float32Array.from(data), dims);
}

export async function loadOnnxSequenceScorer(opts: OnnxSequenceScorerOptions): Promise<OnnxSequenceScorer> {
  if (!existsSync(opts.path)) throw new ConfigError(`reward model: file not found: ${opts.path}`);
  const maxLength = opts.maxLength ?? 1024;
  const maxBatch = opts.maxBatch ?? 32;
  const padId = opts.padId ?? 0;
  const tokenize = opts.tokenize ?? byteTokenize;
  let session: ort.InferenceSession;
  try {
    session = await ort.InferenceSession.create(opts.path, { intraOpNumThreads: opts.threads ?? 1, interOpNumThreads: 1, graphOptimizationLevel: 'all' });
  } catch (e) {
    throw new ConfigError(`reward model ${opts.path}: onnxruntime cannot load it: ${(e as Error).message}`);
  }
  const inputs = session.inputNames;
  if (!inputs.includes('input_ids') || !inputs.includes('attention_mask') || inputs.length !== 2) {
    throw new ConfigError(`reward model ${opts.path}: inputs are [${inputs.join(', ')}]; a sequence scorer needs exactly input_ids and attention_mask`);
  }
  const meta = (n: string) => session.inputMetadata[inputs.indexOf(n)];
  const idKind = kindOf(meta('input_ids'), 'input_ids', opts.path);
  const maskKind = kindOf(meta('attention_mask'), 'attention_mask', opts.path);
  const outName = session.outputNames[0];

  async function runBatch(seqs: number[][]): Promise<number[]> {
    const B = seqs.length;
    const T = Math.max(1, ...seqs.map((s) => s.length));
    const ids = new Array<number>(B * T).fill(padId);
    const mask = new Array<number>(B * T).fill(0);
    seqs.forEach((s, b) => s.forEach((tok, t) => { ids[b * T + t] = tok; mask[b * T + t] = 1; }));
    const out = await session.run({ input_ids: makeTensor(idKind, ids, [B, T]), attention_mask: makeTensor(maskKind, mask, [B, T]) });
    const y = out[outName];
    const data = y.data as Float32Array | Float64Array;
    let scores: number[];
    if (data.length === B) scores = Array.from(data, Number);
    else if (data.length === B * T && y.dims.length === 2) scores = seqs.map((s, b) => Number(data[b * T + Math.max(0, s.length - 1)]));
    else throw new RlError(`reward model ${opts.path}: output ${outName} has shape [${y.dims.join(', ')}] for ${B} sequences of length ${T}; expected [B], [B, 1] or [B, T]`, { retriable: false });
    // An empty sequence has nothing to score: NaN, which callers report as a failure.
    return scores.map((x, b) => (Number.isFinite(x) && seqs[b].length > 0 ? x : Number.NaN));
  }

  // Coalesce concurrent calls into batches of ≤ maxBatch sequences.
  let queue: { seq: number[]; resolve: (v: number) => void; reject: (e: unknown) => void }[] = [];
  let scheduled = false;
  let running: Promise<void> = Promise.resolve();
  const flush = () => {
    scheduled = false;
    const work = queue;
    queue = [];
    running = running.then(async () => {
      for (let i = 0; i < work.length; i += maxBatch) {
        const chunk = work.slice(i, i + maxBatch);
        try {
          const scores = await runBatch(chunk.map((w) => w.seq));
          chunk.forEach((w, j) => w.resolve(scores[j]));
        } catch (e) {
          chunk.forEach((w) => w.reject(e));
        }
      }
    });
  };

  const rawScores = (seqs: number[][]) => Promise.all(seqs.map((s) => new Promise<number>((resolve, reject) => {
    const seq = s.length > maxLength ? s.slice(s.length - maxLength) : s;
    queue.push({ seq, resolve, reject });
    if (queue.length >= maxBatch) flush();
    else if (!scheduled) { scheduled = true; setImmediate(() => { if (scheduled) flush(); }); }
  })));

  const tokenizePair = (prompt: string, response: string) => [...tokenize(prompt), ...tokenize(response)];
  const scoreTokens = async (seqs: number[][]) => (await rawScores(seqs)).map((x) => applyTransform(x, opts));
  return {
    rawScores,
    scoreTokens,
    tokenizePair,
    scoreTexts: (pairs) => scoreTokens(pairs.map((p) => tokenizePair(p.prompt, p.response))),
    async close() { await running; await session.release(); },
  };
}

export interface ModelRewardScorer {
  /** One outcome per item; a model error or a non-finite score is a failure, never a zero. */
  scoreBatch(items: RewardRequestItem[]): Promise<RewardOutcome[]>;
  close(): Promise<void>;
}

/** `reward.type: model`: scores trajectories (prompt ⧺ response) with an ONNX sequence scorer, in process. */
export async function createModelRewardScorer(opts: RewardModelOptions, extra: Omit<OnnxSequenceScorerOptions, 'path' | 'transform' | 'scale' | 'threshold'> = {}): Promise<ModelRewardScorer> {
  if (!opts.path) throw new ConfigError('reward.model.path: required when reward.type = model (an ONNX sequence scorer with inputs input_ids and attention_mask)');
  const scorer = await loadOnnxSequenceScorer({ ...extra, path: opts.path, transform: opts.transform, scale: opts.scale, threshold: opts.threshold });
  const name = `model:${basename(opts.path)}`;
  return {
    async scoreBatch(items) {
      let raw: number[];
      try {
        raw = await scorer.rawScores(items.map((it) => scorer.tokenizePair(it.prompt_text, it.response_text)));
      } catch (e) {
        const reason = `reward model ${opts.path} failed: ${(e as Error)?.message ?? String(e)}`;
        return items.map((it) => ({ id: it.id, ok: false as const, reason, retriable: e instanceof RlError ? e.retriable : false, server: name }));
      }
      return items.map((it, i): RewardOutcome => {
        const r = raw[i];
        if (!Number.isFinite(r)) return { id: it.id, ok: false, reason: `reward model ${opts.path} produced a non-finite score`, retriable: false, server: name };
        const reward = applyTransform(r, opts);
        return { id: it.id, ok: true, reward, details: { score_raw: r, score: reward }, server: name };
      });
    },
    close: () => scorer.close(),
  };
}
