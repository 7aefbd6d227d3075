/**
 * The generation graph: prefill + an in-graph decode loop, so one `session.run` generates every
 * token of a batch. The Node binding copies each output into JS memory; here the cache never
 * leaves ORT and the only outputs are the sampled tokens and their log-probs ([steps, B] each).
 * The stepwise graphs (`buildPrefillModel`, `buildStepModel`) serve callers that change the batch
 * between steps: the step graph reads the caller's caches and returns only the new K/V.
 *
 * Layout: prompts are LEFT-padded to a common length P (prompt_mask 0 on the padding), with
 * per-row positions cumsum(mask) − 1, so the last column is every row's last prompt token and
 * each decode step appends one column to every row's KV cache (an additive key bias keeps the
 * padding columns masked). A row's tokens therefore do not depend on the other rows of its batch
 * (up to float rounding of masked-out work).
 *
 * ONNX `Loop` (trip count = uniforms.shape[1], condition = "some row has not emitted EOS"):
 *   loop-carried: logits [B, V] (of the next token), position [B, 1], key bias [B, 1, 1, S],
 *                 done [B], per-layer K and V [B, KVH, S, hd] (S grows by one per step)
 *   scan outputs: token [B], logprob [B] → [steps, B]
 * The body samples from the carried logits, then runs the one-token forward of the sampled token
 * (`decodeStep`, written for T = 1: one Gemm per projection against the weight inputs themselves,
 * so the loop holds no copy of any weight: concatenated q/k/v and gate/up weights would hold a
 * second copy of 60 % of the decoder for the whole run, 7 GB at 3 B parameters).
 * The graph builder has no sub-graph attribute, so the body is built with its own GraphBuilder and
 * attached to the Loop node of the serialised outer model (`attachLoopBody`); body values that name
 * outer values (weights, rope tables, sampling inputs) are resolved from the outer scope.
 *
 * Sampling (per row, all inside the graph; see `sampleTokens`):
 *   logits += bias, bias[v] = −1e9 for v in `suppressTokenIds` (specials other than the stop ids,
 *             NUL, padding rows: ids that cannot appear in text), 0 otherwise; the scorer and the
 *             trainer add the same bias (`logitBiasOf`), so log-probs agree on-policy
 *   z = logits / T (T = temperature; T ≤ 0 means greedy: argmax of the logits)
 *   top-k then top-p truncation (HF/vLLM order) when the graph is built with `truncation`
 *   token = inverse CDF of softmax(truncated z) at the row's uniform u ∈ (0, 1), in vocabulary order
 *           (in two levels over chunks of the vocabulary: `inverseCdf`; greedy: `argMaxRows`)
 *   logprob = log_softmax(z)[token]: the temperature-scaled distribution BEFORE top-k/top-p
 *             truncation (for greedy rows: log_softmax(logits), i.e. T = 1).
 */
import onnxProto from 'onnx-proto';
import { GraphBuilder, GraphError, type Var } from '../onnx/builder.ts';
import { linear, rmsNorm, rope, swiglu } from '../onnx/nn.ts';
import { hasQkNorm, type ModelConfig } from './config.ts';
import { declareParams, llamaForward, lmHead, MASK_NEG, ropeTables, type ParamVars } from './llama.ts';
import { paramSpecs } from './params.ts';
import { mropeDeltaInput, placeImageTokens } from './vision.ts';

const { onnx } = onnxProto;

export interface GenerateGraphOptions {
  /** Include the top-k / top-p path (a full sort of the vocabulary per row and step). */
  truncation: boolean;
}

/** Names of the generation graph's non-weight inputs and outputs. */
export const GEN_IO = {
  promptIds: 'prompt_ids', // int64 [U, P], left-padded: each distinct prompt once
  promptMask: 'prompt_mask', // int64 [U, P], 1 = token, 0 = padding
  promptRows: 'prompt_rows', // int64 [B]: the prompt row (of U) each sampled row continues
  uniforms: 'uniforms', // float32 [B, N]: one uniform in (0, 1) per row and step; N = max new tokens
  temperature: 'temperature', // float32 [B]
  topP: 'top_p', // float32 [B] (truncation graphs only), 1 = off
  topK: 'top_k', // int64 [B] (truncation graphs only), 0 = off
  eosIds: 'eos_ids', // int64 [E]: stop tokens (pass [-1] for none)
  tokens: 'tokens', // int64 [steps, B]
  logprobs: 'logprobs', // float32 [steps, B]
  topIds: 'top_ids', // int64 [steps, B, K] (step graph only)
  topLogprobs: 'top_logprobs', // float32 [steps, B, K] (step graph only)
} as const;

const NEG_INF = -Infinity;

/**
 * The additive logit bias [V] of a policy: MASK_NEG (−1e9, finite so p·log p stays 0 in the
 * entropy) at `c.suppressTokenIds`, 0 elsewhere; null when nothing is suppressed. Every graph that
 * computes the policy's distribution (sampling, scoring, training) adds it to the logits before
 * the temperature, so behaviour, old and current log-probs are of one masked distribution.
 */
export function logitBiasOf(c: ModelConfig): Float32Array | null {
  // a VLM never emits its vision tokens: a sampled <|image_pad|> would have no image to show
  const ids = [
    ...(c.suppressTokenIds ?? []),
    ...(c.vision ? [c.vision.imageTokenId, c.vision.visionStartTokenId, c.vision.visionEndTokenId] : []),
  ];
  if (ids.length === 0) return null;
  const bias = new Float32Array(c.vocabSize);
  for (const id of ids) bias[id] = MASK_NEG;
  return bias;
}

/**
 * Sample one token per row from logits [B, V]. u [B] uniforms in (0, 1), temperature [B];
 * topP [B] / topK [B] when truncating; bias [V] (logitBiasOf) added to the logits first, or null.
 * Returns token [B] int64 and its log-prob [B] under the masked, temperature-scaled, untruncated
 * distribution.
 */
export function sampleTokens(
  b: GraphBuilder,
  logitsIn: Var,
  u: Var,
  temperature: Var,
  trunc: { topP: Var; topK: Var } | null,
  bias: Var | null = null,
): { token: Var; logprob: Var; logp: Var } {
  const [B, V] = logitsIn.shape;
  if (typeof V !== 'number') throw new GraphError('sampleTokens: vocabulary size must be static');
  return b.scope('sample', () => {
    const logits = bias ? b.add(logitsIn, b.unsqueeze(bias, [0])) : logitsIn; // [B, V]
    const greedy = b.lessOrEqual(temperature, 0); // [B]
    const tEff = b.where(greedy, 1, temperature);
    const z = b.div(logits, b.unsqueeze(tEff, [1])); // [B, V]
    const logp = b.logSoftmax(z, -1);
    let zt = z;
    if (trunc) {
      // sorted descending: TopK with k = V
      const [sorted] = b.op('TopK', [z, b.const([V], 'int64')], { axis: 1, largest: 1, sorted: 1 }, [
        { dtype: z.dtype, shape: [B, V] },
        { dtype: 'int64', shape: [B, V] },
      ]);
      const rank = b.unsqueeze(b.range(V), [0]); // [1, V]
      const k = b.unsqueeze(
        b.where(b.or(b.lessOrEqual(trunc.topK, 0), b.greater(trunc.topK, V)), b.const(V, 'int64'), trunc.topK),
        [1],
      ); // [B, 1]
      const keepK = b.less(rank, k); // [B, V] over sorted ranks
      const ps = b.softmax(b.where(keepK, sorted, NEG_INF), -1);
      const before = b.op('CumSum', [ps, b.const(1, 'int64')], { exclusive: 1 }, { dtype: ps.dtype, shape: ps.shape }); // mass ranked above
      const pOff = b.unsqueeze(b.greaterOrEqual(trunc.topP, 1), [1]);
      const keepP = b.or(b.less(before, b.unsqueeze(trunc.topP, [1])), pOff);
      const nKeep = b.reduceSum(b.cast(b.and(keepK, keepP), 'int64'), [1], true); // [B, 1] ≥ 1
      const thr = b.gatherElements(sorted, b.sub(nKeep, b.const(1, 'int64')), 1); // smallest kept logit
      zt = b.where(b.less(z, thr), NEG_INF, z); // ties with the threshold are kept
    }
    const drawn = inverseCdf(b, b.softmax(zt, -1), u);
    const token = b.where(greedy, argMaxRows(b, logits), drawn);
    const logprob = b.squeeze(b.gatherElements(logp, b.unsqueeze(token, [1]), 1), [1]);
    return { token, logprob, logp };
  });
}

/**
 * The inverse CDF of probs [B, V] (rows summing to ~1) at u [B] ∈ (0, 1): the first token whose
 * cumulative mass reaches u × the row's total, never a zero-probability token. Computed in two
 * levels over chunks of C tokens (V = nC × C, zero-padded): the chunk sums' cumulative sum picks the
 * chunk J, the cumulative sum within J (offset by the mass of the chunks before it) picks the
 * token. Sequential prefix sums over [B, nC] and [B, C] instead of [B, V] (onnxruntime's CumSum is
 * one scalar pass; at V = 49 152 it cost more than the rest of the draw together); the mass below
 * a token is summed in another order than one prefix sum over V, so a draw differs from that
 * definition only where u falls within float rounding of a token boundary.
 */
export function inverseCdf(b: GraphBuilder, probs: Var, u: Var): Var {
  const [B, V] = rowsOf(probs, 'inverseCdf');
  const cumsum = (x: Var) => b.op('CumSum', [x, b.const(1, 'int64')], {}, { dtype: x.dtype, shape: x.shape });
  const count = (x: Var, t: Var) => b.reduceSum(b.cast(b.less(x, t), 'int64'), [1]); // #{x < t} per row [B]
  const ch = vocabChunks(b, probs, 0);
  if (!ch) {
    const cdf = cumsum(probs);
    return b.min(count(cdf, b.mul(b.unsqueeze(u, [1]), b.slice(cdf, 1, V - 1, V))), b.const(V - 1, 'int64'));
  }
  const { chunks, C, nC } = ch;
  const upTo = cumsum(b.reduceSum(chunks, [2])); // [B, nC]: mass of chunks 0..j
  const total = b.slice(upTo, 1, nC - 1, nC); // [B, 1]
  const target = b.mul(b.unsqueeze(u, [1]), total); // [B, 1]
  const J = b.unsqueeze(b.min(count(upTo, target), b.const(nC - 1, 'int64')), [1]); // [B, 1]: the chunk
  const below = b.concat([b.mul(total, 0), b.slice(upTo, 1, 0, nC - 1)], 1, nC); // [B, nC]: mass of chunks 0..j−1
  const base = b.unsqueeze(chunkAt(b, below, J, [B]), [1]); // [B, 1]
  const local = b.add(cumsum(chunkAt(b, chunks, J, [B, C])), base); // [B, C]: mass up to each token of chunk J
  // the chunk's last cumulative mass can round below target: the draw then takes its last token with mass
  const within = count(local, b.min(target, b.slice(local, 1, C - 1, C)));
  return b.min(b.add(b.mul(b.squeeze(J, [1]), b.const(C, 'int64')), within), b.const(V - 1, 'int64'));
}

/**
 * The first index of each row's maximum of x [B, V], in two levels like inverseCdf: the first
 * chunk holding the row's maximum (ReduceMax per chunk, then ArgMax over the chunks), then the first
 * maximum inside it. The same index as one ArgMax over V (onnxruntime's is one scalar pass).
 */
export function argMaxRows(b: GraphBuilder, x: Var): Var {
  const [B] = rowsOf(x, 'argMaxRows');
  const ch = vocabChunks(b, x, NEG_INF);
  if (!ch) return b.argMax(x, 1);
  const J = b.argMax(b.reduceMax(ch.chunks, [2]), 1, true); // [B, 1]
  const inChunk = b.argMax(chunkAt(b, ch.chunks, J, [B, ch.C]), 1);
  return b.add(b.mul(b.squeeze(J, [1]), b.const(ch.C, 'int64')), inChunk);
}

function rowsOf(x: Var, what: string): [B: number | string, V: number] {
  const [B, V] = x.shape;
  if (typeof V !== 'number') throw new GraphError(`${what}: row length must be static`);
  return [B, V];
}

/** x [B, V] as [B, nC, C] chunks of chunkSize(V), the last padded with `pad`; null when that is one chunk. */
function vocabChunks(b: GraphBuilder, x: Var, pad: number): { chunks: Var; C: number; nC: number } | null {
  const [B, V] = rowsOf(x, 'vocabChunks');
  const C = chunkSize(V),
    nC = Math.ceil(V / C);
  if (nC < 2) return null;
  const padded =
    nC * C === V
      ? x
      : b.op(
          'Pad',
          [x, b.const([0, 0, 0, nC * C - V], 'int64'), b.const(pad, x.dtype)],
          {},
          {
            dtype: x.dtype,
            shape: [B, nC * C],
          },
        );
  return { chunks: b.reshape(padded, [B, nC, C]), C, nC };
}

/** Row b's entry J[b] of x [B, n, …] (J [B, 1] int64): [B, …]. */
function chunkAt(b: GraphBuilder, x: Var, J: Var, shape: (number | string)[]): Var {
  return b.op('GatherND', [x, J], { batch_dims: 1 }, { dtype: x.dtype, shape });
}

/** Chunk size for inverseCdf and argMaxRows: the divisor of V nearest √V within [√V / 4, 4√V], else ⌈√V⌉ (V padded). */
export function chunkSize(V: number): number {
  const r = Math.sqrt(V);
  let best = 0;
  for (let c = Math.max(1, Math.floor(r / 4)); c <= Math.ceil(4 * r); c++)
    if (V % c === 0 && (best === 0 || Math.abs(c - r) < Math.abs(best - r))) best = c;
  return best || Math.ceil(r);
}

/** The serialised generation model (see the file comment for inputs and outputs). */
export function buildGenerateModel(c: ModelConfig, opts: GenerateGraphOptions): Uint8Array {
  if (c.head !== 'lm') throw new GraphError('buildGenerateModel: needs a policy (head "lm") config');
  // ── outer graph: prefill ──
  const b = new GraphBuilder({ name: 'generate' });
  // weights are graph inputs named by their HF names, fed per call (one session per model shape)
  const p = declareParams(b, c, 'inputs');
  const uniforms = b.input(GEN_IO.uniforms, 'float32', ['B', 'N']);
  const s0 = prefillState(b, c, p);
  const model = decodeLoop(b, c, opts, uniforms, s0);
  return onnx.ModelProto.encode(model).finish();
}

/**
 * The decoding state of B rows between runs of the stepwise graphs: next-token logits [B, V],
 * next position [B, 1], additive key bias [B, 1, 1, S] (MASK_NEG on padding columns) and per-layer
 * K and V caches [B, KVH, S, hd]. Inputs are named `state.<name>`, outputs `state_out.<name>`.
 */
export function decodeStateNames(c: ModelConfig): string[] {
  const L = c.numHiddenLayers;
  return [
    'logits',
    'pos',
    'bias',
    ...Array.from({ length: L }, (_, l) => `k${l}`),
    ...Array.from({ length: L }, (_, l) => `v${l}`),
  ];
}

/** Most likely tokens reported per step by the step graph (OpenAI's top_logprobs cap). */
export const MAX_TOP_LOGPROBS = 20;

/**
 * Stepwise generation, prefill half: prompt_ids, prompt_mask [U, P], prompt_rows [B] (and a VLM's
 * vision inputs) → the decoding state `state_out.*` of the B rows (each distinct prompt prefilled
 * once; the n rows of a prompt share it).
 */
export function buildPrefillModel(c: ModelConfig): Uint8Array {
  if (c.head !== 'lm') throw new GraphError('buildPrefillModel: needs a policy (head "lm") config');
  const b = new GraphBuilder({ name: 'prefill' });
  const p = declareParams(b, c, 'inputs');
  const s = prefillState(b, c, p);
  const names = decodeStateNames(c);
  [s.logits, s.pos, s.bias, ...s.keys, ...s.values].forEach((v, i) => b.output(v, `state_out.${names[i]}`));
  return b.toBytes();
}

/**
 * Stepwise generation, decode half: ONE decode step of B rows, without a loop, so its inputs can
 * be the caller's own buffers (the Node binding reads typed-array inputs in place) and its outputs
 * are small. Inputs: the weights (HF names, read as they are: see `decodeStep`), `uniforms` [B],
 * `temperature` [B] (and `top_p`, `top_k` [B] with `truncation`), the state `state.logits` [B, V],
 * `state.pos` [B, 1], `state.bias` [B, 1, 1, S] and per layer `state.k<l>` / `state.v<l>`
 * [B, KVH, S, hd], where S is the caller's cache capacity and the key bias masks (MASK_NEG) every
 * column that holds no token of the row. Outputs: `tokens`, `logprobs` [B] (as in the generation
 * graph), the `MAX_TOP_LOGPROBS` most likely tokens of the step's distribution (`top_ids`,
 * `top_logprobs` [B, K]; left out with `topLogprobs: false`, which saves a TopK per step), the
 * next logits `state_out.logits` [B, V] and the sampled token's own K and V per layer (`new.k<l>`, `new.v<l>` [B, KVH, hd]), which the caller writes into its cache.
 */
export function buildStepModel(c: ModelConfig, opts: GenerateGraphOptions & { topLogprobs?: boolean }): Uint8Array {
  if (c.head !== 'lm') throw new GraphError('buildStepModel: needs a policy (head "lm") config');
  const L = c.numHiddenLayers,
    V = c.vocabSize;
  const b = new GraphBuilder({ name: 'decode_step' });
  const p = declareParams(b, c, 'inputs');
  const { cos, sin } = ropeTables(b, c);
  const u = b.input(GEN_IO.uniforms, 'float32', ['B']);
  const temperature = b.input(GEN_IO.temperature, 'float32', ['B']);
  const trunc = opts.truncation
    ? { topP: b.input(GEN_IO.topP, 'float32', ['B']), topK: b.input(GEN_IO.topK, 'int64', ['B']) }
    : null;
  const [logits, pos, bias, ...kv] = decodeStateNames(c).map((n, i) =>
    b.input(
      `state.${n}`,
      i === 1 ? 'int64' : 'float32',
      i === 0 ? ['B', V] : i === 1 ? ['B', 1] : i === 2 ? ['B', 1, 1, 'S'] : ['B', c.numKeyValueHeads, 'S', c.headDim],
    ),
  );
  const biasData = logitBiasOf(c);
  const logitBias = biasData ? b.initializer('sample.logit_bias', biasData, [V]) : null;
  const { token, logprob, logp } = sampleTokens(b, logits, u, temperature, trunc, logitBias);
  const rope = new Map([
    ['rope.cos', cos],
    ['rope.sin', sin],
  ]);
  const step = decodeStep(b, c, p, rope, token, b.squeeze(pos, [1]), bias, kv.slice(0, L), kv.slice(L), 'external');
  b.output(token, GEN_IO.tokens);
  b.output(logprob, GEN_IO.logprobs);
  if (opts.topLogprobs ?? true) {
    const K = Math.min(MAX_TOP_LOGPROBS, V);
    const [topVals, topIdx] = b.op('TopK', [logp, b.const([K], 'int64')], { axis: 1, largest: 1, sorted: 1 }, [
      { dtype: 'float32', shape: ['B', K] },
      { dtype: 'int64', shape: ['B', K] },
    ]);
    b.output(topIdx, GEN_IO.topIds);
    b.output(topVals, GEN_IO.topLogprobs);
  }
  b.output(lmHead(b, c, p, step.hidden), 'state_out.logits');
  step.presentKeys.forEach((k, l) => b.output(k, `new.k${l}`));
  step.presentValues.forEach((v, l) => b.output(v, `new.v${l}`));
  return b.toBytes();
}

interface DecodeState {
  logits: Var;
  pos: Var;
  bias: Var;
  keys: Var[];
  values: Var[];
  /** Any [B] int64 tensor (gives the loop's `done` its shape). */
  rows: Var;
}

/** The prefill of the generation graphs: each distinct prompt once, expanded to the B sampled rows. */
function prefillState(b: GraphBuilder, c: ModelConfig, p: ParamVars): DecodeState {
  const ids = b.input(GEN_IO.promptIds, 'int64', ['U', 'P']);
  const mask = b.input(GEN_IO.promptMask, 'int64', ['U', 'P']);
  const rows = b.input(GEN_IO.promptRows, 'int64', ['B']);
  // prefill each distinct prompt once ([U, P]), then expand the last logits, positions, key bias
  // and KV cache to the B sampled rows (n samples of a prompt share its prefix computation)
  const cum = b.op('CumSum', [mask, b.const(1, 'int64')], {}, { dtype: 'int64', shape: ['U', 'P'] });
  const positions = b.max(b.sub(cum, b.const(1, 'int64')), b.const(0, 'int64'));
  // a VLM's image tokens enter in the prefill only: the tower runs once per prompt (vision.ts)
  const mropeDelta = c.vision ? mropeDeltaInput(b, c, ids) : null;
  const pre = llamaForward(b, c, p, {
    ids,
    positions,
    ...(mropeDelta ? { mropeDelta } : {}),
    attentionMask: mask,
    fuseProjections: false,
    ...(c.vision ? { placeImages: (x, N) => placeImageTokens(b, c, p, x, N) } : {}),
  });
  const lastIdx = b.sub(b.dimTensor('P'), b.const([1], 'int64')); // [1]
  // only the last position goes through the LM head
  const hLast = b.reshape(
    b.op(
      'Gather',
      [b.reshape(pre.hidden, ['U', 'P', c.hiddenSize]), lastIdx],
      { axis: 1 },
      { dtype: 'float32', shape: ['U', 1, c.hiddenSize] },
    ),
    ['U', c.hiddenSize],
  );
  const expand = (v: Var): Var => b.gather(v, rows); // [U, …] → [B, …]
  const logits0 = expand(lmHead(b, c, p, hLast)); // [B, V]
  // the next position: the last prompt token's + 1 (M-RoPE: its text position, offset included)
  let lastPos = b.op('Gather', [positions, lastIdx], { axis: 1 }, { dtype: 'int64', shape: ['U', 1] });
  if (mropeDelta)
    lastPos = b.add(
      lastPos,
      b.reshape(
        b.op('Gather', [b.slice(mropeDelta, 2, 0, 1), lastIdx], { axis: 1 }, { dtype: 'int64', shape: ['U', 1, 1] }),
        ['U', 1],
      ),
    );
  return {
    logits: logits0,
    pos: expand(b.add(lastPos, b.const(1, 'int64'))), // [B, 1]
    bias: expand(b.reshape(b.where(b.cast(mask, 'bool'), b.const(0), b.const(MASK_NEG)), ['U', 1, 1, 'P'])),
    keys: pre.presentKeys.map(expand),
    values: pre.presentValues.map(expand),
    rows,
  };
}

/**
 * Adds the decode Loop over `s0` to `b` (trip count = uniforms.shape[1]) and returns the model
 * proto with the loop body attached. Outputs: tokens, logprobs.
 */
function decodeLoop(
  b: GraphBuilder,
  c: ModelConfig,
  opts: GenerateGraphOptions,
  uniforms: Var,
  s0: DecodeState,
): onnxProto.onnx.ModelProto {
  const L = c.numHiddenLayers,
    KVH = c.numKeyValueHeads,
    hd = c.headDim,
    V = c.vocabSize;
  // read only by the loop body, through the outer scope
  b.input(GEN_IO.temperature, 'float32', ['B']);
  if (opts.truncation) {
    b.input(GEN_IO.topP, 'float32', ['B']);
    b.input(GEN_IO.topK, 'int64', ['B']);
  }
  b.input(GEN_IO.eosIds, 'int64', ['E']);
  const done0 = b.less(s0.rows, b.const(0, 'int64')); // [B] all false (shape from the batch)
  const trip = b.op('Gather', [b.shape(uniforms), b.const(1, 'int64')], { axis: 0 }, { dtype: 'int64', shape: [] });
  const cond0 = b.cast(b.const(1, 'int64'), 'bool');

  const carried: Var[] = [s0.logits, s0.pos, s0.bias, done0, ...s0.keys, ...s0.values];
  const loopOuts = b.op('Loop', [trip, cond0, ...carried], {}, [
    ...carried.map((v) => ({ dtype: v.dtype, shape: v.shape.map(() => b.unknownDim()) })), // final state
    { dtype: 'int64', shape: ['steps', 'B'] },
    { dtype: 'float32', shape: ['steps', 'B'] },
  ]);
  const nc = carried.length;
  b.output(loopOuts[nc], GEN_IO.tokens);
  b.output(loopOuts[nc + 1], GEN_IO.logprobs);
  const loopName = loopOuts[0].name.replace(/:0$/, '');

  // ── loop body ──
  const g = new GraphBuilder({ name: 'decode_step' });
  const iter = g.input('iter', 'int64', []);
  g.input('cond_in', 'bool', []);
  const logits = g.input('logits_in', 'float32', ['B', V]);
  const pos = g.input('pos_in', 'int64', ['B', 1]);
  const bias = g.input('bias_in', 'float32', ['B', 1, 1, 'S']);
  const done = g.input('done_in', 'bool', ['B']);
  const keys = Array.from({ length: L }, (_, l) => g.input(`k${l}_in`, 'float32', ['B', KVH, 'S', hd]));
  const values = Array.from({ length: L }, (_, l) => g.input(`v${l}_in`, 'float32', ['B', KVH, 'S', hd]));
  const nState = 2 + 4 + 2 * L;
  // outer-scope references (same names as in the outer graph)
  const gp = declareParams(g, c, 'inputs');
  const gU = g.input(GEN_IO.uniforms, 'float32', ['B', 'N']);
  const gT = g.input(GEN_IO.temperature, 'float32', ['B']);
  const gTopP = opts.truncation ? g.input(GEN_IO.topP, 'float32', ['B']) : null;
  const gTopK = opts.truncation ? g.input(GEN_IO.topK, 'int64', ['B']) : null;
  const gEos = g.input(GEN_IO.eosIds, 'int64', ['E']);

  const u = g.op('Gather', [gU, iter], { axis: 1 }, { dtype: 'float32', shape: ['B'] });
  const biasData = logitBiasOf(c);
  const logitBias = biasData ? g.initializer('sample.logit_bias', biasData, [V]) : null;
  const { token, logprob } = sampleTokens(
    g,
    logits,
    u,
    gT,
    gTopP && gTopK ? { topP: gTopP, topK: gTopK } : null,
    logitBias,
  );
  const hit = g.reduceMax(g.cast(g.equal(g.unsqueeze(token, [1]), g.unsqueeze(gEos, [0])), 'int32'), [1]); // [B]
  const doneOut = g.or(done, g.cast(hit, 'bool'));
  const condOut = g.equal(g.reduceMax(g.cast(g.not(doneOut), 'int32'), [0]), g.const(1, 'int32'));
  const biasOut = g.concat([bias, g.zeros(['B', 1, 1, 1], 'float32')], 3);
  const ropeIn = new Map(
    ['rope.cos', 'rope.sin'].map((n) => [n, g.input(n, 'float32', [c.maxPositionEmbeddings, hd])]),
  );
  const step = decodeStep(g, c, gp, ropeIn, token, g.squeeze(pos, [1]), biasOut, keys, values);
  const logitsOut = lmHead(g, c, gp, step.hidden);
  const posOut = g.add(pos, g.const(1, 'int64'));
  const scans = [token, logprob];
  for (const v of [condOut, logitsOut, posOut, biasOut, doneOut, ...step.presentKeys, ...step.presentValues, ...scans])
    g.output(v);
  const body = g.toModelProto().graph!;
  const outerRefs = new Set<string>([
    ...paramSpecs(c).map((s) => s.name),
    GEN_IO.uniforms,
    GEN_IO.temperature,
    GEN_IO.topP,
    GEN_IO.topK,
    GEN_IO.eosIds,
    'rope.cos',
    'rope.sin',
  ]);
  const model = b.toModelProto();
  attachLoopBody(model, loopName, body, nState, outerRefs);
  return model;
}

/**
 * One decoding step for B rows of one token each (the model of llama.ts, specialised to T = 1):
 * token [B] at positions pos [B], caches [B, KVH, S, hd] per layer. Returns the final-norm hidden
 * states [B, D] and, per layer, with `cache` 'append': the caches with this token appended
 * ([B, KVH, S+1, hd]; `bias` [B, 1, 1, S+1] covers the S cached columns and this token), with
 * 'external': only this token's K and V ([B, KVH, hd]; `bias` [B, 1, 1, S] covers the cached
 * columns, the token always sees itself), so the caches are read and never copied.
 * Grouped-query attention runs as [B, KVH, G, ·] so K/V are not repeated.
 */
export function decodeStep(
  g: GraphBuilder,
  c: ModelConfig,
  p: ParamVars,
  ropeIn: Map<string, Var>,
  token: Var,
  pos: Var,
  bias: Var,
  keys: Var[],
  values: Var[],
  cache: 'append' | 'external' = 'append',
): { hidden: Var; presentKeys: Var[]; presentValues: Var[] } {
  const H = c.numAttentionHeads,
    KVH = c.numKeyValueHeads,
    G = H / KVH,
    hd = c.headDim,
    D = c.hiddenSize;
  const qd = H * hd;
  const w = (name: string): Var => {
    const v = p.get(name) ?? ropeIn.get(name);
    if (!v) throw new GraphError(`decodeStep: missing ${name}`);
    return v;
  };
  const cos = g.unsqueeze(g.gather(w('rope.cos'), pos), [1]); // [B, 1, hd]
  const sin = g.unsqueeze(g.gather(w('rope.sin'), pos), [1]);
  let x = g.gather(w('model.embed_tokens.weight'), token); // [B, D]
  const presentKeys: Var[] = [],
    presentValues: Var[] = [];
  for (let l = 0; l < c.numHiddenLayers; l++) {
    const pre = `model.layers.${l}`;
    g.scope(`step.layers.${l}`, () => {
      const h = rmsNorm(g, x, w(`${pre}.input_layernorm.weight`), c.rmsNormEps);
      const proj = (m: string) =>
        linear(g, h, w(`${pre}.self_attn.${m}.weight`), c.attentionBias ? w(`${pre}.self_attn.${m}.bias`) : null);
      const [q0, k0, v0] = [proj('q_proj'), proj('k_proj'), proj('v_proj')]; // [B, H·hd], [B, KVH·hd] × 2
      let qh = g.reshape(q0, ['B', H, hd]),
        kh = g.reshape(k0, ['B', KVH, hd]);
      if (hasQkNorm(c)) {
        // Qwen3: per-head RMSNorm of q and k before RoPE (as in llama.ts)
        qh = rmsNorm(g, qh, w(`${pre}.self_attn.q_norm.weight`), c.rmsNormEps);
        kh = rmsNorm(g, kh, w(`${pre}.self_attn.k_norm.weight`), c.rmsNormEps);
      }
      const q = g.mul(rope(g, qh, cos, sin), 1 / Math.sqrt(hd));
      const k = rope(g, kh, cos, sin);
      const qg = g.reshape(q, ['B', KVH, G, hd]);
      let ctx: Var; // [B, KVH, G, hd]
      if (cache === 'append') {
        const K = g.concat([keys[l], g.unsqueeze(k, [2])], 2); // [B, KVH, S+1, hd]
        const V = g.concat([values[l], g.reshape(v0, ['B', KVH, 1, hd])], 2);
        presentKeys.push(K);
        presentValues.push(V);
        const scores = g.add(g.matmul(qg, g.transposeLast2(K)), bias); // [B, KVH, G, S+1]
        ctx = g.matmul(g.softmax(scores, -1), V);
      } else {
        const vh = g.reshape(v0, ['B', KVH, hd]);
        presentKeys.push(k);
        presentValues.push(vh);
        // softmax over [cached columns; this token], the two parts weighted apart
        const past = g.add(g.matmul(qg, g.transposeLast2(keys[l])), bias); // [B, KVH, G, S]
        const self = g.reduceSum(g.mul(qg, g.unsqueeze(k, [2])), [3], true); // [B, KVH, G, 1]
        const S = keys[l].shape[2];
        const [pPast, pSelf] = g.split(g.softmax(g.concat([past, self], 3), -1), 3, [S, 1]);
        ctx = g.add(g.matmul(pPast, values[l]), g.mul(pSelf, g.unsqueeze(vh, [2])));
      }
      x = g.add(x, linear(g, g.reshape(ctx, ['B', qd]), w(`${pre}.self_attn.o_proj.weight`)));
      const h2 = rmsNorm(g, x, w(`${pre}.post_attention_layernorm.weight`), c.rmsNormEps);
      const gate = linear(g, h2, w(`${pre}.mlp.gate_proj.weight`)),
        up = linear(g, h2, w(`${pre}.mlp.up_proj.weight`)); // [B, intermediate] each
      x = g.add(x, linear(g, swiglu(g, gate, up), w(`${pre}.mlp.down_proj.weight`)));
    });
  }
  const hidden = rmsNorm(g, x, w('model.norm.weight'), c.rmsNormEps);
  if (hidden.shape[1] !== D) throw new GraphError('internal: decodeStep hidden width');
  return { hidden, presentKeys, presentValues };
}

/**
 * Attach `body` as the `body` attribute of the Loop node `loopName` in `model`. The body's first
 * `nInputs` graph inputs are the Loop's (iteration, condition, carried...); its other inputs and
 * any initializer named in `outerRefs` are dropped so those names resolve to the outer graph's
 * values. Every other body value is renamed under `loop/` so no name shadows an outer one.
 */
export function attachLoopBody(
  model: onnxProto.onnx.ModelProto,
  loopName: string,
  body: onnxProto.onnx.IGraphProto,
  nInputs: number,
  outerRefs: Set<string>,
): void {
  const node = model.graph!.node!.find((n) => n.name === loopName);
  if (!node || node.opType !== 'Loop') throw new GraphError(`attachLoopBody: no Loop node named ${loopName}`);
  const bodyInputs = body.input!.slice(0, nInputs);
  for (const i of body.input!.slice(nInputs))
    if (!outerRefs.has(i.name!))
      throw new GraphError(`attachLoopBody: body input ${i.name} is neither loop state nor an outer value`);
  const rn = (s: string): string => (s === '' || outerRefs.has(s) ? s : `loop/${s}`);
  const renameVi = (v: onnxProto.onnx.IValueInfoProto) => ({ ...v, name: rn(v.name!) });
  const g: onnxProto.onnx.IGraphProto = {
    name: body.name,
    input: bodyInputs.map(renameVi),
    output: body.output!.map(renameVi),
    initializer: (body.initializer ?? [])
      .filter((t) => !outerRefs.has(t.name!))
      .map((t) => ({ ...t, name: rn(t.name!) })),
    node: body.node!.map((n) => ({ ...n, name: `loop/${n.name}`, input: n.input!.map(rn), output: n.output!.map(rn) })),
  };
  node.attribute = [...(node.attribute ?? []), { name: 'body', type: onnx.AttributeProto.AttributeType.GRAPH, g }];
}
