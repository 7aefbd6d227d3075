/**
 * Stepwise generation: the prefill of decode-graph.ts and its loop-free one-step graph, so a
 * caller can stop after any step, see each token as it is sampled, and change which rows decode
 * together between steps (continuous batching, lib/inference/batcher.ts).
 *
 *   prefill(prompts)                 → Prefilled rows (each distinct prompt prefilled once)
 *   appendRows(state, prefilled)     → the rows join the state (copied in once)
 *   step(state, uniforms [B, N], …)  → N tokens per row (fewer once every row has hit a stop id),
 *                                      their log-probs and each step's top-20 log-probs; the state
 *                                      advances in place
 *   keepRows(state, keep)            → finished rows leave (a kept row moves into a freed slot)
 *
 * The state's caches are JS buffers with spare rows and columns; the step graph reads them in
 * place (the Node binding does not copy typed-array inputs) and returns only the new token's K
 * and V, which are written at the common column S. So a step copies no cache: its cost is the
 * graph run over the batch, as one iteration of the generation graph's loop.
 *
 * A row's tokens are those `Sampler.generate` draws for the same (seed, id): the same prefill, the
 * same decode step and the same uniforms (up to float rounding of masked-out work: a row's masked
 * columns add exact zeros to its attention).
 */
import { ConfigError } from '../errors.ts';
import { ort, tensor, type Device } from '../onnx/runtime.ts';
import type { ModelConfig } from './config.ts';
import { buildPrefillModel, buildStepModel, decodeStateNames, GEN_IO, MAX_TOP_LOGPROBS } from './decode-graph.ts';
import { MASK_NEG } from './llama.ts';
import { validateWeights, type Weights } from './params.ts';
import { promptFeeds, weightTensors } from './feeds.ts';
import { defaultSessionCache, keyOf, type SessionCache } from './session-cache.ts';
import type { ImagePixels } from './vision.ts';

/**
 * The decoding state of B rows, in buffers with room for `rowCap` rows of at least `colCap` cache
 * columns, laid out for `colCap` columns, that the step graph reads in place (feeds are views of
 * their first B rows). Every row's next token goes to column S; a row's cache holds its tokens in
 * columns [S − its length, S), the key bias masks every other column (MASK_NEG), so rows of
 * different lengths share the columns.
 */
export interface DecodeState {
  B: number;
  S: number;
  rowCap: number;
  colCap: number;
  logits: Float32Array; // [rowCap, V] (of each row's next token)
  pos: BigInt64Array; // [rowCap]: each row's next position
  bias: Float32Array; // [rowCap, colCap]
  keys: Float32Array[]; // per layer [rowCap, KVH, colCap, hd]
  values: Float32Array[];
}

/**
 * The prefilled distinct prompts as the prefill graph returns them: caches [B, KVH, S, hd], bias
 * [B, S] (B distinct prompts). Row r of the caller's rows continues prompt rowOf[r]: each prompt's
 * state is held once here, and appendRows copies it to each of its rows.
 */
export interface Prefilled {
  B: number;
  S: number;
  rowOf: Int32Array;
  logits: Float32Array;
  pos: BigInt64Array;
  bias: Float32Array;
  keys: Float32Array[];
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
  /** [steps, B, topK] with topK = `topWidth` (empty when the step was asked for no top log-probs) */
  topIds: BigInt64Array;
  topLogprobs: Float32Array;
}

export class StepDecoder {
  private readonly cache: SessionCache;
  /** The config's part of the session keys (hashed once: a step is too short to hash it each time). */
  private readonly key: string;
  /** Top log-probs reported per step (≤ MAX_TOP_LOGPROBS). */
  readonly topWidth: number;

  constructor(
    readonly config: ModelConfig,
    private readonly opts: { threads?: number; device?: Device; cache?: SessionCache } = {},
  ) {
    if (config.head !== 'lm') throw new ConfigError('StepDecoder: needs a policy model (head "lm")');
    this.cache = opts.cache ?? defaultSessionCache;
    this.topWidth = Math.min(MAX_TOP_LOGPROBS, config.vocabSize);
    this.key = keyOf(config);
  }

  private session(kind: 'prefill' | 'step', truncation = false, top = true): Promise<ort.InferenceSession> {
    const c = this.config;
    return this.cache.get(
      `${kind}|${this.key}|trunc=${truncation}|top=${top}`,
      () => (kind === 'prefill' ? buildPrefillModel(c) : buildStepModel(c, { truncation, topLogprobs: top })),
      { threads: this.opts.threads, device: this.opts.device },
    );
  }

  /** Prefills the prompts (one row each; equal prompts share one prefill, held once: `rowOf`). */
  async prefill(
    weights: Weights,
    prompts: readonly { prompt: ArrayLike<number>; images?: readonly ImagePixels[] }[],
  ): Promise<Prefilled> {
    const c = this.config;
    validateWeights(c, weights, 'StepDecoder weights');
    const session = await this.session('prefill');
    const feeds = promptFeeds(c, prompts, 'prefill');
    // the graph's own expansion to the rows is not used: each distinct prompt comes back once
    const rowOf = Int32Array.from(feeds[GEN_IO.promptRows].data as BigInt64Array, Number);
    const U = feeds[GEN_IO.promptIds].dims[0];
    feeds[GEN_IO.promptRows] = tensor(
      'int64',
      BigInt64Array.from({ length: U }, (_, i) => BigInt(i)),
      [U],
    );
    const res = await session.run({ ...weightTensors(c, weights), ...feeds });
    const B = res['state_out.pos'].dims[0];
    const L = c.numHiddenLayers;
    const out = (n: string) => res[`state_out.${n}`];
    const names = decodeStateNames(c);
    return {
      B,
      S: out('bias').dims[3],
      rowOf,
      logits: out('logits').data as Float32Array,
      pos: out('pos').data as BigInt64Array,
      bias: out('bias').data as Float32Array,
      keys: names.slice(3, 3 + L).map((n) => out(n).data as Float32Array),
      values: names.slice(3 + L).map((n) => out(n).data as Float32Array),
    };
  }

  /**
   * Runs up to `N` decode steps for every row of `state` (one step-graph run each; fewer once
   * every row has emitted a stop id) and appends each step's K/V to the state in place.
   * uniforms [B, N]; params one per row; eos the stop ids; `top` false: no top log-probs (the
   * result's `topIds` and `topLogprobs` are empty, and the step graph runs without its TopK).
   */
  async step(
    weights: Weights,
    state: DecodeState,
    uniforms: Float32Array,
    N: number,
    params: readonly StepRowParams[],
    eos: readonly number[],
    top = true,
  ): Promise<StepResult> {
    const c = this.config,
      { B } = state;
    const L = c.numHiddenLayers,
      KVH = c.numKeyValueHeads,
      hd = c.headDim,
      V = c.vocabSize,
      K = top ? this.topWidth : 0;
    if (uniforms.length !== B * N || params.length !== B)
      throw new ConfigError(`StepDecoder.step: ${B} rows need ${B * N} uniforms and ${B} params`);
    const truncation = params.some((p) => p.topK > 0 || p.topP < 1);
    const session = await this.session('step', truncation, top);
    const fixed: Record<string, ort.Tensor> = {
      ...weightTensors(c, weights),
      [GEN_IO.temperature]: tensor(
        'float32',
        Float32Array.from(params, (p) => p.temperature),
        [B],
      ),
    };
    if (truncation) {
      fixed[GEN_IO.topP] = tensor(
        'float32',
        Float32Array.from(params, (p) => p.topP),
        [B],
      );
      fixed[GEN_IO.topK] = tensor(
        'int64',
        BigInt64Array.from(params, (p) => BigInt(p.topK)),
        [B],
      );
    }
    const out: StepResult = {
      steps: 0,
      tokens: new BigInt64Array(N * B),
      logprobs: new Float32Array(N * B),
      topIds: new BigInt64Array(N * B * K),
      topLogprobs: new Float32Array(N * B * K),
    };
    const stops = new Set(eos);
    const done = new Uint8Array(B);
    let live = B;
    const u = new Float32Array(B);
    for (let t = 0; t < N && live > 0; t++) {
      reserveColumn(c, state);
      const { S, colCap } = state;
      for (let b = 0; b < B; b++) u[b] = uniforms[b * N + t];
      const feeds: Record<string, ort.Tensor> = {
        ...fixed,
        [GEN_IO.uniforms]: tensor('float32', u, [B]),
        'state.logits': tensor('float32', state.logits.subarray(0, B * V), [B, V]),
        'state.pos': tensor('int64', state.pos.subarray(0, B), [B, 1]),
        'state.bias': tensor('float32', state.bias.subarray(0, B * colCap), [B, 1, 1, colCap]),
      };
      const n = B * KVH * colCap * hd;
      for (let l = 0; l < L; l++) {
        feeds[`state.k${l}`] = tensor('float32', state.keys[l].subarray(0, n), [B, KVH, colCap, hd]);
        feeds[`state.v${l}`] = tensor('float32', state.values[l].subarray(0, n), [B, KVH, colCap, hd]);
      }
      const res = await session.run(feeds);
      const toks = res[GEN_IO.tokens].data as BigInt64Array;
      out.tokens.set(toks, t * B);
      out.logprobs.set(res[GEN_IO.logprobs].data as Float32Array, t * B);
      if (top) {
        out.topIds.set(res[GEN_IO.topIds].data as BigInt64Array, t * B * K);
        out.topLogprobs.set(res[GEN_IO.topLogprobs].data as Float32Array, t * B * K);
      }
      out.steps = t + 1;
      // the next logits: the binding's fresh array becomes the state's when it has the state's size
      const logits = res['state_out.logits'].data as Float32Array;
      if (logits.length === state.logits.length) state.logits = logits;
      else state.logits.set(logits);
      // the sampled token's K/V go to column S of each row
      for (let l = 0; l < L; l++)
        for (const [src, dst] of [
          [res[`new.k${l}`].data as Float32Array, state.keys[l]],
          [res[`new.v${l}`].data as Float32Array, state.values[l]],
        ])
          for (let bh = 0; bh < B * KVH; bh++) {
            const s0 = bh * hd,
              d0 = (bh * colCap + S) * hd;
            for (let i = 0; i < hd; i++) dst[d0 + i] = src[s0 + i];
          }
      for (let b = 0; b < B; b++) {
        state.bias[b * colCap + S] = 0;
        state.pos[b]++;
        if (!done[b] && stops.has(Number(toks[b]))) {
          done[b] = 1;
          live--;
        }
      }
      state.S = S + 1;
    }
    if (out.steps < N) {
      const s = out.steps;
      out.tokens = out.tokens.slice(0, s * B);
      out.logprobs = out.logprobs.slice(0, s * B);
      out.topIds = out.topIds.slice(0, s * B * K);
      out.topLogprobs = out.topLogprobs.slice(0, s * B * K);
    }
    return out;
  }
}

/** An empty decoding state (no rows). */
export function emptyState(c: ModelConfig): DecodeState {
  return allocState(c, 0, 0);
}

/**
 * An empty decoding state whose buffers are allocated once with room for `rows` rows of `cols`
 * columns. Its column capacity starts small and grows inside that room (an in-place relayout), so
 * the step graph attends over the columns in use plus at most an eighth, not over all `cols`.
 */
export function reservedState(c: ModelConfig, rows: number, cols: number): DecodeState {
  return allocState(c, rows, 0, cols);
}

/** Buffers for `rowCap` rows of `room` columns (at least `colCap`), laid out for `colCap` columns. */
function allocState(c: ModelConfig, rowCap: number, colCap: number, room = colCap): DecodeState {
  const kv = c.numKeyValueHeads * c.headDim;
  return {
    B: 0,
    S: 0,
    rowCap,
    colCap,
    logits: new Float32Array(rowCap * c.vocabSize),
    pos: new BigInt64Array(rowCap),
    bias: new Float32Array(rowCap * room).fill(MASK_NEG),
    keys: Array.from({ length: c.numHiddenLayers }, () => new Float32Array(rowCap * kv * room)),
    values: Array.from({ length: c.numHiddenLayers }, () => new Float32Array(rowCap * kv * room)),
  };
}

/** The columns per row the state's buffers have room for at `rowCap` rows (0 unless `rowCap` is the state's). */
function columnRoom(st: DecodeState, rowCap: number): number {
  return rowCap !== st.rowCap || rowCap === 0 ? 0 : Math.floor(st.bias.length / rowCap);
}

/** The capacity to grow to for column S: columnCapacity(S), within the buffers' room when S fits there. */
function grownCapacity(st: DecodeState, rowCap: number, S: number): number {
  const room = columnRoom(st, rowCap);
  return S < room ? Math.min(columnCapacity(S), room) : columnCapacity(S);
}

const pow2 = (n: number) => 2 ** Math.ceil(Math.log2(Math.max(1, n)));

/**
 * Column capacity for `S` cached columns and the next one: S + 1 plus an eighth of S (at least 16),
 * rounded up to 16. The step graph attends over the whole capacity, so the spare columns are
 * work; growing by an eighth keeps them under ~12 % of the cache while a relayout (one copy of the
 * cache) happens once per S/8 steps.
 */
export function columnCapacity(S: number): number {
  return Math.ceil((S + 1 + Math.max(16, Math.ceil(S / 8))) / 16) * 16;
}

/**
 * Moves the B rows into buffers of `rowCap` × `colCap`, each row's columns [from, S) to
 * [to, to + S − from). Returns the new state (S = to + S − from): the same buffers when they have
 * room (the rows are moved last first, so a row's new place never overwrites an unmoved one).
 */
function relayout(
  c: ModelConfig,
  st: DecodeState,
  rowCap: number,
  colCap: number,
  from: number,
  to: number,
): DecodeState {
  const inPlace = colCap >= st.colCap && colCap <= columnRoom(st, rowCap);
  const out = inPlace ? st : allocState(c, rowCap, colCap);
  const KVH = c.numKeyValueHeads,
    hd = c.headDim,
    V = c.vocabSize,
    w = st.S - from;
  if (!inPlace) {
    out.logits.set(st.logits.subarray(0, st.B * V));
    out.pos.set(st.pos.subarray(0, st.B));
  }
  for (let b = st.B - 1; b >= 0; b--) {
    const row = st.bias.slice(b * st.colCap + from, b * st.colCap + st.S);
    out.bias.fill(MASK_NEG, b * colCap, (b + 1) * colCap);
    out.bias.set(row, b * colCap + to);
    for (let l = 0; l < c.numHiddenLayers; l++)
      for (const [src, dst] of [
        [st.keys[l], out.keys[l]],
        [st.values[l], out.values[l]],
      ])
        for (let h = KVH - 1; h >= 0; h--) {
          const s0 = ((b * KVH + h) * st.colCap + from) * hd,
            d0 = ((b * KVH + h) * colCap + to) * hd;
          if (inPlace) dst.copyWithin(d0, s0, s0 + w * hd);
          else dst.set(src.subarray(s0, s0 + w * hd), d0);
        }
  }
  out.B = st.B;
  out.S = to + w;
  out.colCap = colCap;
  return out;
}

/** The first column any row uses (columns before it can be dropped). */
function firstUsedColumn(st: DecodeState): number {
  let first = st.S;
  for (let b = 0; b < st.B; b++) {
    let lead = 0;
    while (lead < first && st.bias[b * st.colCap + lead] <= MASK_NEG) lead++;
    first = Math.min(first, lead);
  }
  return first;
}

/**
 * Makes room for column S: when the buffers are full, drops the columns no row uses if they are
 * at least a quarter of the capacity, else grows it to `columnCapacity(S)` (by an eighth: appends
 * cost amortised O(1) copies of the cache).
 */
function reserveColumn(c: ModelConfig, st: DecodeState): void {
  if (st.S < st.colCap) return;
  const first = firstUsedColumn(st);
  const next =
    first >= st.colCap / 4
      ? relayout(c, st, st.rowCap, st.colCap, first, 0)
      : relayout(c, st, st.rowCap, grownCapacity(st, st.rowCap, st.S), 0, 0);
  Object.assign(st, next);
}

/**
 * Appends the prefilled rows to `st` (rows B.., right-aligned at column S; the running rows shift
 * right when the new ones are longer). Returns the state, which may be new buffers.
 */
export function appendRows(c: ModelConfig, st: DecodeState, pre: Prefilled): DecodeState {
  const KVH = c.numKeyValueHeads,
    hd = c.headDim,
    V = c.vocabSize;
  const { rowOf } = pre;
  const B = st.B + rowOf.length;
  let S = st.B === 0 ? pre.S : Math.max(st.S, pre.S);
  let s = st;
  if (B > st.rowCap || S >= st.colCap || S > st.S) {
    const rowCap = B > st.rowCap ? Math.max(pow2(B), st.rowCap * 2) : st.rowCap;
    const colCap = S >= st.colCap ? grownCapacity(st, rowCap, S) : st.colCap;
    s = relayout(c, st, rowCap, colCap, 0, S - st.S);
  }
  S = s.S = Math.max(s.S, S);
  rowOf.forEach((r, i) => {
    const b = st.B + i,
      at = S - pre.S;
    s.logits.set(pre.logits.subarray(r * V, (r + 1) * V), b * V);
    s.pos[b] = pre.pos[r];
    s.bias.fill(MASK_NEG, b * s.colCap, (b + 1) * s.colCap);
    s.bias.set(pre.bias.subarray(r * pre.S, (r + 1) * pre.S), b * s.colCap + at);
    for (let l = 0; l < c.numHiddenLayers; l++)
      for (const [src, dst] of [
        [pre.keys[l], s.keys[l]],
        [pre.values[l], s.values[l]],
      ])
        for (let h = 0; h < KVH; h++)
          dst.set(
            src.subarray((r * KVH + h) * pre.S * hd, ((r * KVH + h) * pre.S + pre.S) * hd),
            ((b * KVH + h) * s.colCap + at) * hd,
          );
  });
  s.B = B;
  return s;
}

/**
 * Keeps the rows `keep` (ascending) of `st` in place: a kept row at or past the new row count
 * moves into the slot of a dropped one. Returns the old row index of each new row.
 */
export function keepRows(c: ModelConfig, st: DecodeState, keep: readonly number[]): number[] {
  const B2 = keep.length;
  const order = [...keep];
  const movers = keep.filter((r) => r >= B2);
  const kept = new Set(keep);
  const rowLen = c.numKeyValueHeads * st.colCap * c.headDim,
    V = c.vocabSize,
    W = st.colCap;
  let m = 0;
  for (let slot = 0; slot < B2; slot++) {
    if (kept.has(slot)) {
      order[slot] = slot;
      continue;
    }
    const from = movers[m++];
    order[slot] = from;
    st.logits.copyWithin(slot * V, from * V, (from + 1) * V);
    st.pos[slot] = st.pos[from];
    st.bias.copyWithin(slot * W, from * W, (from + 1) * W);
    for (let l = 0; l < c.numHiddenLayers; l++)
      for (const a of [st.keys[l], st.values[l]]) a.copyWithin(slot * rowLen, from * rowLen, (from + 1) * rowLen);
  }
  st.B = B2;
  if (B2 === 0) st.S = 0;
  return order;
}
