/**
 * ONNX sequence scorer run by onnxruntime-node: `reward.type: model` in the reward stage, and the
 * `.onnx` scorer of `rlstream reward-server`.
 *
 * Model contract: inputs `input_ids` [B, T] and `attention_mask` [B, T] (int64, int32 or float;
 * right-padded, mask 1 on real tokens); first output is one score per sequence, [B] or [B, 1] —
 * or [B, T] per-token values (a value model), of which the value at the last real token is taken.
 *
 * What the model accepts, when it says so (`readScorerLimits`): string entries of the model's
 * `metadata_props` — `vocab_size` (ids must be < it), `max_sequence_length` (longest sequence),
 * `pad_token_id` — and a fixed T in the declared shape of `input_ids` (the maximum length; every
 * batch is then padded to exactly T).
 * The model engine's value model exported by value-scorer-export.ts declares all three. A
 * sequence outside these limits is refused with an error naming it, never truncated or clamped.
 *
 * Token ids in (`rawScores`, `scoreTokens`): the caller's ids as they are — the reward stage
 * passes each trajectory's own prompt ids ⧺ response ids (the run's tokenizer). Text in
 * (`scoreTexts`, used by `rlstream reward-server`, whose HTTP protocol carries text): prompt ⧺
 * response tokenized by `tokenize` (default: the model engine's byte-level tokenizer,
 * lib/model/tokenizer.ts, id = UTF-8 byte 0–255); texts longer than `maxLength` (or the model's
 * declared maximum) keep their last tokens (the response end matters most).
 *
 * Padding uses the model's declared `pad_token_id`, else `padId` (the reward stage passes the
 * run's tokenizer's pad), else 0; padded positions are masked out.
 *
 * Calls made while a batch is being assembled are coalesced into one `session.run` of at most
 * `maxBatch` sequences. Reward = scale · transform(raw); with `threshold`, reward = 1 when
 * scale · transform(raw) ≥ threshold, else 0.
 */
import { basename } from 'node:path';
import { existsSync, readFileSync } from 'node:fs';
import * as ort from 'onnxruntime-node';
import onnxProto from 'onnx-proto';
import { ConfigError, RlError } from '../errors.ts';
import { ByteTokenizer } from '../model/tokenizer.ts';
import type { RewardModelOptions, RewardOutcome, RewardRequestItem } from './types.ts';
import type { RewardItem } from './port.ts';

export interface OnnxSequenceScorerOptions {
  path: string;
  transform?: 'none' | 'sigmoid';
  scale?: number;
  threshold?: number | null;
  /** Text input only: keep the last maxLength tokens (default 1024; capped by the model's declared maximum). */
  maxLength?: number;
  maxBatch?: number;
  threads?: number;
  /** Text → token ids for `scoreTexts` (default: UTF-8 bytes). */
  tokenize?: (text: string) => number[];
  /** Padding id when the model declares no `pad_token_id` (default 0). */
  padId?: number;
}

/** What a scorer model declares it accepts (null = not declared). */
export interface ScorerLimits {
  vocabSize: number | null;
  maxSequenceLength: number | null;
  padTokenId: number | null;
}

export interface OnnxSequenceScorer {
  /** The model's declared limits, and the pad id in use. */
  readonly limits: ScorerLimits & { padId: number };
  /** Why `seq` cannot be scored by this model (too long, an id outside the vocabulary), or null. */
  problem(seq: ArrayLike<number>): string | null;
  /**
   * Raw model outputs, one per sequence of token ids, used as given (NaN where the model produced a
   * non-finite value or the sequence is empty). Rejects (not retriable) when a sequence is outside
   * the model's limits (see `problem`).
   */
  rawScores(seqs: ArrayLike<number>[]): Promise<number[]>;
  /** Transformed scores, one per sequence of token ids. */
  scoreTokens(seqs: ArrayLike<number>[]): Promise<number[]>;
  /** Transformed scores of tokenize(prompt) ⧺ tokenize(response), the tail kept (see maxLength). */
  scoreTexts(pairs: { prompt: string; response: string }[]): Promise<number[]>;
  tokenizePair(prompt: string, response: string): number[];
  /** What `scoreTexts` feeds the model for one pair: tokenizePair, its last maxLength tokens. */
  textIds(prompt: string, response: string): number[];
  close(): Promise<void>;
}

const bytes = new ByteTokenizer();

/** The model engine's byte-level tokenizer (ids 0–255 = UTF-8 bytes), without specials. */
export function byteTokenize(text: string): number[] {
  return Array.from(bytes.encode(text));
}

export function applyTransform(
  raw: number,
  t: { transform?: 'none' | 'sigmoid'; scale?: number; threshold?: number | null },
): number {
  let v = t.transform === 'sigmoid' ? 1 / (1 + Math.exp(-raw)) : raw;
  v *= t.scale ?? 1;
  if (t.threshold !== undefined && t.threshold !== null && Number.isFinite(v)) v = v >= t.threshold ? 1 : 0;
  return v;
}

/** Metadata keys a scorer model may declare (ModelProto.metadata_props, string values). */
export const SCORER_METADATA_KEYS = {
  vocabSize: 'vocab_size',
  maxSequenceLength: 'max_sequence_length',
  padTokenId: 'pad_token_id',
} as const;

/** The string entries of an ONNX file's `metadata_props` (decoded with onnx-proto, as the graph builder writes them). */
export function readOnnxMetadata(model: Uint8Array): Record<string, string> {
  let decoded: onnxProto.onnx.ModelProto;
  try {
    decoded = onnxProto.onnx.ModelProto.decode(model);
  } catch (e) {
    throw new Error(`truncated or invalid ONNX model: ${(e as Error).message}`);
  }
  return Object.fromEntries((decoded.metadataProps ?? []).map((m) => [m.key ?? '', m.value ?? '']));
}

/** A fixed sequence length T declared by input_ids' shape [B, T], or null. */
function fixedLength(idsShape?: ReadonlyArray<number | string>): number | null {
  return idsShape && idsShape.length === 2 && typeof idsShape[1] === 'number' && idsShape[1] > 0 ? idsShape[1] : null;
}

/** The limits a scorer declares: metadata_props entries and a fixed T of input_ids' shape. */
export function readScorerLimits(path: string, idsShape?: ReadonlyArray<number | string>): ScorerLimits {
  let meta: Record<string, string>;
  try {
    meta = readOnnxMetadata(readFileSync(path));
  } catch (e) {
    throw new ConfigError(`reward model ${path}: not a readable ONNX model (${(e as Error).message})`);
  }
  const int = (key: string, min: number): number | null => {
    if (!(key in meta)) return null;
    const v = Number(meta[key]);
    if (!Number.isInteger(v) || v < min)
      throw new ConfigError(
        `reward model ${path}: metadata ${key} = ${JSON.stringify(meta[key])} is not an integer ≥ ${min}`,
      );
    return v;
  };
  const vocabSize = int(SCORER_METADATA_KEYS.vocabSize, 1);
  let maxSequenceLength = int(SCORER_METADATA_KEYS.maxSequenceLength, 1);
  const fixedT = fixedLength(idsShape);
  if (fixedT !== null) maxSequenceLength = maxSequenceLength === null ? fixedT : Math.min(maxSequenceLength, fixedT);
  const padTokenId = int(SCORER_METADATA_KEYS.padTokenId, 0);
  return { vocabSize, maxSequenceLength, padTokenId };
}

type IntKind = 'int64' | 'int32' | 'float32';

function kindOf(meta: ort.InferenceSession.ValueMetadata | undefined, name: string, path: string): IntKind {
  if (!meta || !meta.isTensor) return 'int64';
  const t = meta.type;
  if (t === 'int64' || t === 'int32') return t;
  if (t === 'float32') return 'float32';
  throw new ConfigError(
    `${path}: input ${name} has type ${t}; a sequence scorer's input_ids/attention_mask must be int64, int32 or float32`,
  );
}

function makeTensor(kind: IntKind, data: number[], dims: number[]): ort.Tensor {
  if (kind === 'int64')
    return new ort.Tensor(
      'int64',
      BigInt64Array.from(data, (x) => BigInt(x)),
      dims,
    );
  if (kind === 'int32') return new ort.Tensor('int32', Int32Array.from(data), dims);
  return new ort.Tensor('float32', Float32Array.from(data), dims);
}

export async function loadOnnxSequenceScorer(opts: OnnxSequenceScorerOptions): Promise<OnnxSequenceScorer> {
  if (!existsSync(opts.path)) throw new ConfigError(`reward model: file not found: ${opts.path}`);
  const maxBatch = opts.maxBatch ?? 32;
  const tokenize = opts.tokenize ?? byteTokenize;
  let session: ort.InferenceSession;
  try {
    session = await ort.InferenceSession.create(opts.path, {
      intraOpNumThreads: opts.threads ?? 1,
      interOpNumThreads: 1,
      graphOptimizationLevel: 'all',
    });
  } catch (e) {
    throw new ConfigError(`reward model ${opts.path}: onnxruntime cannot load it: ${(e as Error).message}`);
  }
  const inputs = session.inputNames;
  if (!inputs.includes('input_ids') || !inputs.includes('attention_mask') || inputs.length !== 2) {
    await session.release();
    throw new ConfigError(
      `reward model ${opts.path}: inputs are [${inputs.join(', ')}]; a sequence scorer needs exactly input_ids and attention_mask`,
    );
  }
  const meta = (n: string) => session.inputMetadata[inputs.indexOf(n)];
  const idsMeta = meta('input_ids');
  const idKind = kindOf(idsMeta, 'input_ids', opts.path);
  const maskKind = kindOf(meta('attention_mask'), 'attention_mask', opts.path);
  const outName = session.outputNames[0];
  let declared: ScorerLimits;
  try {
    declared = readScorerLimits(opts.path, idsMeta && idsMeta.isTensor ? idsMeta.shape : undefined);
  } catch (e) {
    await session.release();
    throw e;
  }
  const padId = declared.padTokenId ?? opts.padId ?? 0;
  if (!Number.isInteger(padId) || padId < 0 || (declared.vocabSize !== null && padId >= declared.vocabSize)) {
    await session.release();
    throw new ConfigError(
      `reward model ${opts.path}: pad id ${padId} is outside the model's vocabulary [0, ${declared.vocabSize ?? '∞'}); declare pad_token_id in the model's metadata or pass the right pad id`,
    );
  }
  const maxLength = Math.min(opts.maxLength ?? 1024, declared.maxSequenceLength ?? Infinity);
  // a model whose input_ids has a fixed T takes every batch padded to exactly T
  const fixedT = fixedLength(idsMeta && idsMeta.isTensor ? idsMeta.shape : undefined);
  const limits = { ...declared, padId };

  const problem = (seq: ArrayLike<number>): string | null => {
    if (declared.maxSequenceLength !== null && seq.length > declared.maxSequenceLength) {
      return `sequence of ${seq.length} tokens is longer than the ${declared.maxSequenceLength} the reward model accepts`;
    }
    for (let i = 0; i < seq.length; i++) {
      const id = seq[i];
      if (!Number.isInteger(id) || id < 0 || (declared.vocabSize !== null && id >= declared.vocabSize)) {
        return `token id ${id} at position ${i} is outside the reward model's vocabulary [0, ${declared.vocabSize ?? '∞'})`;
      }
    }
    return null;
  };

  async function runBatch(seqs: ArrayLike<number>[]): Promise<number[]> {
    const B = seqs.length;
    const T = fixedT ?? Math.max(1, ...seqs.map((s) => s.length));
    const ids = new Array<number>(B * T).fill(padId);
    const mask = new Array<number>(B * T).fill(0);
    seqs.forEach((s, b) => {
      for (let t = 0; t < s.length; t++) {
        ids[b * T + t] = s[t];
        mask[b * T + t] = 1;
      }
    });
    const out = await session.run({
      input_ids: makeTensor(idKind, ids, [B, T]),
      attention_mask: makeTensor(maskKind, mask, [B, T]),
    });
    const y = out[outName];
    const data = y.data as Float32Array | Float64Array;
    let scores: number[];
    if (data.length === B) scores = Array.from(data, Number);
    else if (data.length === B * T && y.dims.length === 2)
      scores = seqs.map((s, b) => Number(data[b * T + Math.max(0, s.length - 1)]));
    else
      throw new RlError(
        `reward model ${opts.path}: output ${outName} has shape [${y.dims.join(', ')}] for ${B} sequences of length ${T}; expected [B], [B, 1] or [B, T]`,
        { retriable: false },
      );
    // An empty sequence has nothing to score: NaN, which callers report as a failure.
    return scores.map((x, b) => (Number.isFinite(x) && seqs[b].length > 0 ? x : Number.NaN));
  }

  // Coalesce concurrent calls into batches of ≤ maxBatch sequences.
  let queue: { seq: ArrayLike<number>; resolve: (v: number) => void; reject: (e: unknown) => void }[] = [];
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

  const rawScores = async (seqs: ArrayLike<number>[]) => {
    // refuse before queueing: one bad sequence must not fail the others batched with it
    seqs.forEach((s, i) => {
      const why = problem(s);
      if (why) throw new RlError(`reward model ${opts.path}: sequence ${i}: ${why}`, { retriable: false });
    });
    return Promise.all(
      seqs.map(
        (seq) =>
          new Promise<number>((resolve, reject) => {
            queue.push({ seq, resolve, reject });
            if (queue.length >= maxBatch) flush();
            else if (!scheduled) {
              scheduled = true;
              setImmediate(() => {
                if (scheduled) flush();
              });
            }
          }),
      ),
    );
  };

  const tokenizePair = (prompt: string, response: string) => [...tokenize(prompt), ...tokenize(response)];
  const textIds = (prompt: string, response: string) => {
    const s = tokenizePair(prompt, response);
    return s.length > maxLength ? s.slice(s.length - maxLength) : s;
  };
  const scoreTokens = async (seqs: ArrayLike<number>[]) => (await rawScores(seqs)).map((x) => applyTransform(x, opts));
  return {
    limits,
    problem,
    rawScores,
    scoreTokens,
    tokenizePair,
    textIds,
    scoreTexts: (pairs) => scoreTokens(pairs.map((p) => textIds(p.prompt, p.response))),
    async close() {
      await running;
      await session.release();
    },
  };
}

export interface ModelRewardScorer {
  /** The scorer's declared limits and pad id. */
  readonly limits: ScorerLimits & { padId: number };
  /**
   * One outcome per item, scoring prompt_ids ⧺ response_ids — the reward stage's items always carry
   * them. An item with neither (a caller that has only text, e.g. to compare with `rlstream
   * reward-server`) is scored like the server does: its texts tokenized (`scoreTexts`). A model
   * error, a non-finite score, or a sequence outside the model's limits (too long, an id ≥ its
   * vocabulary) is a failure, never a zero.
   */
  scoreBatch(items: (RewardItem | RewardRequestItem)[]): Promise<RewardOutcome[]>;
  close(): Promise<void>;
}

function lengths(it: RewardItem | RewardRequestItem, seq: number[]): string {
  const t = it as Partial<RewardItem>;
  return t.prompt_ids && t.response_ids
    ? `prompt ${t.prompt_ids.length} + response ${t.response_ids.length} tokens`
    : `${seq.length} tokens from its text`;
}

/** prompt ids ⧺ response ids as one sequence. */
export function trajectoryIds(it: Pick<RewardItem, 'prompt_ids' | 'response_ids'>): number[] {
  return [...Array.from(it.prompt_ids), ...Array.from(it.response_ids)];
}

/**
 * `reward.type: model`: scores trajectories with an ONNX sequence scorer, in process, on their own
 * token ids (prompt ⧺ response, the run's tokenizer); `extra.padId` should be that tokenizer's pad.
 * `extra.tokenize` / `extra.maxLength` apply only to items without token ids (see scoreBatch).
 */
export async function createModelRewardScorer(
  opts: RewardModelOptions,
  extra: Omit<OnnxSequenceScorerOptions, 'path' | 'transform' | 'scale' | 'threshold'> = {},
): Promise<ModelRewardScorer> {
  if (!opts.path)
    throw new ConfigError(
      'reward.model.path: required when reward.type = model (an ONNX sequence scorer with inputs input_ids and attention_mask)',
    );
  const scorer = await loadOnnxSequenceScorer({
    ...extra,
    path: opts.path,
    transform: opts.transform,
    scale: opts.scale,
    threshold: opts.threshold,
  });
  const name = `model:${basename(opts.path)}`;
  return {
    limits: scorer.limits,
    async scoreBatch(items) {
      const problems: (string | null)[] = [];
      const seqs = items.map((it, i) => {
        const t = it as Partial<RewardItem>;
        problems[i] = null;
        if (t.prompt_ids && t.response_ids) return trajectoryIds(t as RewardItem);
        if (t.prompt_ids || t.response_ids) {
          problems[i] = `carries ${t.prompt_ids ? 'prompt_ids but no response_ids' : 'response_ids but no prompt_ids'}`;
          return [];
        }
        try {
          return scorer.textIds(it.prompt_text, it.response_text);
        } catch (e) {
          problems[i] = `cannot tokenize its text: ${(e as Error).message}`;
          return [];
        }
      });
      seqs.forEach((q, i) => {
        problems[i] ??= scorer.problem(q);
      });
      const ok = seqs.map((_, i) => i).filter((i) => problems[i] === null);
      const refused = (i: number, why: string): RewardOutcome => ({
        id: items[i].id,
        ok: false,
        server: name,
        retriable: false,
        reason: `reward model ${opts.path}: trajectory ${items[i].id} (${lengths(items[i], seqs[i])}): ${why}`,
      });
      let raw: number[];
      try {
        raw = await scorer.rawScores(ok.map((i) => seqs[i]));
      } catch (e) {
        const reason = `reward model ${opts.path} failed: ${(e as Error)?.message ?? String(e)}`;
        const retriable = e instanceof RlError ? e.retriable : false;
        return items.map((it, i) =>
          problems[i] !== null
            ? refused(i, problems[i]!)
            : { id: it.id, ok: false as const, reason, retriable, server: name },
        );
      }
      const rawOf = new Map(ok.map((i, j) => [i, raw[j]]));
      return items.map((it, i): RewardOutcome => {
        if (problems[i] !== null) return refused(i, problems[i]!);
        const r = rawOf.get(i)!;
        if (!Number.isFinite(r))
          return {
            id: it.id,
            ok: false,
            reason: `reward model ${opts.path} produced a non-finite score${seqs[i].length === 0 ? ' (empty sequence: no prompt or response tokens)' : ''}`,
            retriable: false,
            server: name,
          };
        const reward = applyTransform(r, opts);
        return { id: it.id, ok: true, reward, details: { score_raw: r, score: reward }, server: name };
      });
    },
    close: () => scorer.close(),
  };
}
