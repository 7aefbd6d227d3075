/**
 * Stepwise generation: the graphs of decode-graph.ts split at the decoding state, so a caller can
 * stop after any number of steps, see each token as it is sampled, and change which rows decode
 * together between runs (continuous batching, lib/inference/batcher.ts).
 *
 *   prefill(prompts)          → DecodeState of the rows (each distinct prompt prefilled once)
 *   step(state, uniforms [B, N], …) → N tokens per row (fewer once every row has hit a stop id),
 *                               their log-probs, each step's top-20 log-probs, and the new state
 *
 * A row's tokens are those `Sampler.generate` draws for the same (seed, id): the same prefill, the
 * same decode-step graph and the same uniforms (up to float rounding of masked-out work). Rows of
 * different lengths share a state by left-padding the shorter caches with masked columns
 * (`concatStates`); `selectRows` drops rows and the padding columns no remaining row needs.
 * The state crosses into JS after each run (the Node binding copies outputs): the price of
 * changing the batch between runs, paid per run rather than per token when N > 1.
 */
import { ConfigError } from '../errors.ts';
import { ort, tensor, type Device } from '../onnx/runtime.ts';
import type { ModelConfig } from './config.ts';
import { buildPrefillModel, buildStepModel, decodeStateNames, GEN_IO, MAX_TOP_LOGPROBS } from './decode-graph.ts';
import { MASK_NEG } from './llama.ts';
import { validateWeights, type Weights } from './params.ts';
import { imageKey, weightTensors } from './sample.ts';
import { defaultSessionCache, keyOf, type SessionCache } from './session-cache.ts';
import { visionFeeds, type ImagePixels } from './vision.ts';

/** The decoding state of B rows (see decodeStateNames): caches [B, KVH, S, hd] per layer. */
export interface DecodeState {
  B: number;
  S: number;
  logits: Float32Array; // [B, V]
  pos: BigInt64Array; // [B]
  bias: Float32Array; // [B, S]
  keys: Float32Array[]; // per layer [B, KVH, S, hd]
  values: Float32Array[];
}

export interface StepRowParams {
  temperature: number;
  topP: number;
  topK: number;
}

export interface StepResult {
  steps: number;
  /** [steps, B] */
  tokens: BigInt64Array;
  logprobs: Float32Array;
  /** [steps, B, topK] with topK = `topWidth` */
  topIds: BigInt64Array;
  topLogprobs: Float32Array;
  state: DecodeState;
}

export class StepDecoder {
  private readonly cache: SessionCache;
  /** Top log-probs reported per step (≤ MAX_TOP_LOGPROBS). */
  readonly topWidth: number;

  constructor(
    readonly config: ModelConfig,
    private readonly opts: { threads?: number; device?: Device; cache?: SessionCache } = {},
  ) {
    if (config.head !== 'lm') throw new ConfigError('StepDecoder: needs a policy model (head "lm")');
    this.cache = opts.cache ?? defaultSessionCache;
    this.topWidth = Math.min(MAX_TOP_LOGPROBS, config.vocabSize);
  }

  private session(kind: 'prefill' | 'step', truncation = false): Promise<ort.InferenceSession> {
    const c = this.config;
    return this.cache.get(
      `${kind}|${keyOf(c)}|trunc=${truncation}`,
      () => (kind === 'prefill' ? buildPrefillModel(c) : buildStepModel(c, { truncation })),
      { threads: this.opts.threads, device: this.opts.device },
    );
  }

  /** Prefills the prompts (one row each; equal prompts share one prefill). */
  async prefill(
    weights: Weights,
    prompts: readonly { prompt: ArrayLike<number>; images?: readonly ImagePixels[] }[],
  ): Promise<DecodeState> {
    const c = this.config;
    validateWeights(c, weights, 'StepDecoder weights');
    const B = prompts.length;
    const P = Math.max(...prompts.map((r) => r.prompt.length));
    const uniq = new Map<string, number>();
    const rows = new BigInt64Array(B);
    const distinct: (typeof prompts)[number][] = [];
    prompts.forEach((r, i) => {
      const key = Array.prototype.join.call(r.prompt, ',') + imageKey(r.images);
      let k = uniq.get(key);
      if (k === undefined) {
        k = distinct.length;
        uniq.set(key, k);
        distinct.push(r);
      }
      rows[i] = BigInt(k);
    });
    const U = distinct.length;
    const ids = new BigInt64Array(U * P).fill(BigInt(c.padTokenId));
    const mask = new BigInt64Array(U * P);
    distinct.forEach((r, k) => {
      const off = k * P + P - r.prompt.length;
      for (let t = 0; t < r.prompt.length; t++) {
        ids[off + t] = BigInt(r.prompt[t]);
        mask[off + t] = 1n;
      }
    });
    const session = await this.session('prefill');
    const res = await session.run({
      ...weightTensors(c, weights),
      [GEN_IO.promptIds]: tensor('int64', ids, [U, P]),
      [GEN_IO.promptMask]: tensor('int64', mask, [U, P]),
      [GEN_IO.promptRows]: tensor('int64', rows, [B]),
      ...(c.vision
        ? visionFeeds(
            c,
            ids,
            U,
            P,
            distinct.map((r) => r.images),
            'prefill',
          )
        : {}),
    });
    return this.readState(res, B);
  }

  private readState(res: ort.InferenceSession.OnnxValueMapType, B: number): DecodeState {
    const L = this.config.numHiddenLayers;
    const out = (n: string) => res[`state_out.${n}`];
    const S = out('bias').dims[3];
    const names = decodeStateNames(this.config);
    return {
      B,
      S,
      logits: out('logits').data as Float32Array,
      pos: out('pos').data as BigInt64Array,
      bias: out('bias').data as Float32Array,
      keys: names.slice(3, 3 + L).map((n) => out(n).data as Float32Array),
      values: names.slice(3 + L).map((n) => out(n).data as Float32Array),
    };
  }

  /**
   * Runs `N` decode steps for every row of `state`. uniforms [B, N]; params one per row; eos the
   * stop ids (the run ends early once every row has emitted one).
   */
  async step(
    weights: Weights,
    state: DecodeState,
    uniforms: Float32Array,
    N: number,
    params: readonly StepRowParams[],
    eos: readonly number[],
  ): Promise<StepResult> {
    const c = this.config,
      { B, S } = state;
    const L = c.numHiddenLayers,
      KVH = c.numKeyValueHeads,
      hd = c.headDim;
    if (uniforms.length !== B * N || params.length !== B)
      throw new ConfigError(`StepDecoder.step: ${B} rows need ${B * N} uniforms and ${B} params`);
    const truncation = params.some((p) => p.topK > 0 || p.topP < 1);
    const session = await this.session('step', truncation);
    const names = decodeStateNames(c);
    const feeds: Record<string, ort.Tensor> = {
      ...weightTensors(c, weights),
      [GEN_IO.uniforms]: tensor('float32', uniforms, [B, N]),
      [GEN_IO.temperature]: tensor(
        'float32',
        Float32Array.from(params, (p) => p.temperature),
        [B],
      ),
      [GEN_IO.eosIds]: tensor('int64', eos.length ? [...eos] : [-1], [Math.max(1, eos.length)]),
      'state.logits': tensor('float32', state.logits, [B, c.vocabSize]),
      'state.pos': tensor('int64', state.pos, [B, 1]),
      'state.bias': tensor('float32', state.bias, [B, 1, 1, S]),
    };
    for (let l = 0; l < L; l++) {
      feeds[`state.${names[3 + l]}`] = tensor('float32', state.keys[l], [B, KVH, S, hd]);
      feeds[`state.${names[3 + L + l]}`] = tensor('float32', state.values[l], [B, KVH, S, hd]);
    }
    if (truncation) {
      feeds[GEN_IO.topP] = tensor(
        'float32',
        Float32Array.from(params, (p) => p.topP),
        [B],
      );
      feeds[GEN_IO.topK] = tensor(
        'int64',
        BigInt64Array.from(params, (p) => BigInt(p.topK)),
        [B],
      );
    }
    const wanted = new Set(session.inputNames);
    for (const k of Object.keys(feeds)) if (!wanted.has(k)) delete feeds[k];
    const res = await session.run(feeds);
    return {
      steps: res[GEN_IO.tokens].dims[0],
      tokens: res[GEN_IO.tokens].data as BigInt64Array,
      logprobs: res[GEN_IO.logprobs].data as Float32Array,
      topIds: res[GEN_IO.topIds].data as BigInt64Array,
      topLogprobs: res[GEN_IO.topLogprobs].data as Float32Array,
      state: this.readState(res, B),
    };
  }
}

/** Per-row sizes of the state arrays other than S. */
function rowSizes(c: ModelConfig): { V: number; kv: number } {
  return { V: c.vocabSize, kv: c.numKeyValueHeads * c.headDim };
}

/**
 * Rows `rows` of `st` (in that order) with S shrunk by the leading columns every kept row masks.
 * A cache [KVH, S, hd] per row keeps its last `S'` columns of each head.
 */
export function selectRows(c: ModelConfig, st: DecodeState, rows: readonly number[]): DecodeState {
  const { S } = st;
  let drop = S;
  for (const r of rows) {
    let lead = 0;
    while (lead < S && st.bias[r * S + lead] <= MASK_NEG) lead++;
    drop = Math.min(drop, lead);
  }
  if (rows.length === 0) drop = 0;
  return assemble(c, [{ st, rows, from: drop }], S - drop);
}

/** The rows of `a` then those of `b`, the shorter caches left-padded with masked columns. */
export function concatStates(c: ModelConfig, a: DecodeState, b: DecodeState): DecodeState {
  const all = (s: DecodeState) => Array.from({ length: s.B }, (_, i) => i);
  return assemble(
    c,
    [
      { st: a, rows: all(a), from: 0 },
      { st: b, rows: all(b), from: 0 },
    ],
    Math.max(a.S, b.S),
  );
}

/** Copies rows of several states into one of width S2; a row keeps its columns [from, S) right-aligned. */
function assemble(
  c: ModelConfig,
  parts: readonly { st: DecodeState; rows: readonly number[]; from: number }[],
  S2: number,
): DecodeState {
  const { V, kv } = rowSizes(c);
  const hd = c.headDim,
    KVH = c.numKeyValueHeads;
  const B = parts.reduce((n, p) => n + p.rows.length, 0);
  const L = c.numHiddenLayers;
  const out: DecodeState = {
    B,
    S: S2,
    logits: new Float32Array(B * V),
    pos: new BigInt64Array(B),
    bias: new Float32Array(B * S2).fill(MASK_NEG),
    keys: Array.from({ length: L }, () => new Float32Array(B * kv * S2)),
    values: Array.from({ length: L }, () => new Float32Array(B * kv * S2)),
  };
  let b = 0;
  for (const { st, rows, from } of parts) {
    const S = st.S,
      w = S - from,
      pad = S2 - w;
    for (const r of rows) {
      out.logits.set(st.logits.subarray(r * V, (r + 1) * V), b * V);
      out.pos[b] = st.pos[r];
      out.bias.set(st.bias.subarray(r * S + from, (r + 1) * S), b * S2 + pad);
      for (let l = 0; l < L; l++)
        for (const [src, dst] of [
          [st.keys[l], out.keys[l]],
          [st.values[l], out.values[l]],
        ])
          for (let h = 0; h < KVH; h++)
            dst.set(
              src.subarray(((r * KVH + h) * S + from) * hd, ((r * KVH + h) * S + S) * hd),
              ((b * KVH + h) * S2 + pad) * hd,
            );
      b++;
    }
  }
  return out;
}
