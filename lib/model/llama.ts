/**
 * Llama-family decoder built with the graph builder (Touvron et al. 2023; Mistral is the same
 * graph; Qwen2 adds q/k/v biases; Qwen3 adds a per-head RMSNorm on q and k before RoPE and a head
 * width independent of hidden / heads): token embedding → L × [RMSNorm → causal GQA attention with RoPE → residual → RMSNorm →
 * SwiGLU MLP → residual] → RMSNorm → LM head (tied or separate) or scalar value head.
 *
 * Layout: activations are 2-D [N = B·T, D] so every projection is one Gemm against a torch-layout
 * [out, in] weight (transB). Attention runs per head in [B, H, T, S] (or [B, KVH, G, T, S] for
 * grouped-query attention, so K/V are never repeated). The KV cache layout is [B, KVH, S, hd].
 * The attention mask enters as an additive bias (0 / −1e9).
 */
import { GraphBuilder, GraphError, Var, dimAdd, dimEq, fmtShape, type Dim } from '../onnx/builder.ts';
import { embedding, linear, rmsNorm, rope, swiglu } from '../onnx/nn.ts';
import { hasQkNorm, type ModelConfig } from './config.ts';
import { loraScale, type LoraConfig } from './lora.ts';
import { paramSpecs, type Weights } from './params.ts';

export type ParamVars = Map<string, Var>;

/** Additive bias for masked attention positions. */
export const MASK_NEG = -1e9;

/**
 * Declare the model's parameters in `b`: as graph inputs named by their HF names (`'inputs'`,
 * for training and for sessions that take weights per call), or as initializers holding `weights`.
 */
export function declareParams(b: GraphBuilder, c: ModelConfig, source: 'inputs' | Weights): ParamVars {
  const p: ParamVars = new Map();
  for (const s of paramSpecs(c)) {
    if (source === 'inputs') p.set(s.name, b.input(s.name, b.float, s.shape));
    else {
      const w = source.get(s.name);
      if (!w) throw new GraphError(`declareParams: weights lack ${s.name}`);
      p.set(s.name, b.initializer(s.name, b.float === 'float64' ? Float64Array.from(w) : w, s.shape, b.float));
    }
  }
  return p;
}

function param(p: ParamVars, name: string): Var {
  const v = p.get(name);
  if (!v) throw new GraphError(`llama: missing parameter ${name}`);
  return v;
}

/**
 * RoPE inverse frequencies [headDim / 2]: θ^(−2i/hd) (Su et al. 2021), then HF's rope_scaling
 * (transformers modeling_rope_utils): linear divides every frequency by `factor`; llama3 (Llama 3.1)
 * divides the low frequencies (wavelength 2π/f > original_max_position_embeddings / low_freq_factor)
 * by `factor`, keeps the high ones (wavelength < original / high_freq_factor) and interpolates
 * between with s = (original / wavelength − low) / (high − low): (1 − s)·f/factor + s·f.
 */
export function ropeInvFreq(c: ModelConfig): Float64Array {
  const hd = c.headDim,
    half = hd / 2;
  const inv = new Float64Array(half);
  const rs = c.ropeScaling;
  for (let i = 0; i < half; i++) {
    // HF computes inv_freq in float32
    let f = Math.fround(1 / Math.fround(Math.pow(c.ropeTheta, (2 * i) / hd)));
    if (rs?.type === 'linear') f = Math.fround(f / rs.factor);
    else if (rs?.type === 'llama3') {
      const wavelen = (2 * Math.PI) / f;
      const lowWl = rs.originalMaxPositionEmbeddings / rs.lowFreqFactor,
        highWl = rs.originalMaxPositionEmbeddings / rs.highFreqFactor;
      if (wavelen > lowWl) f = Math.fround(f / rs.factor);
      else if (wavelen >= highWl) {
        const s =
          (rs.originalMaxPositionEmbeddings / wavelen - rs.lowFreqFactor) / (rs.highFreqFactor - rs.lowFreqFactor);
        f = Math.fround((1 - s) * (f / rs.factor) + s * f);
      }
    }
    inv[i] = f;
  }
  return inv;
}

/** cos/sin tables [maxPositionEmbeddings, headDim] (HF layout: frequencies repeated over both halves). */
export function ropeTables(b: GraphBuilder, c: ModelConfig): { cos: Var; sin: Var } {
  const hd = c.headDim,
    half = hd / 2,
    P = c.maxPositionEmbeddings;
  const invFreq = ropeInvFreq(c);
  const cos = new Float64Array(P * hd),
    sin = new Float64Array(P * hd);
  for (let pos = 0; pos < P; pos++) {
    for (let i = 0; i < half; i++) {
      // HF computes the angle in float32
      const ang = Math.fround(pos * invFreq[i]);
      const cv = Math.cos(ang),
        sv = Math.sin(ang);
      cos[pos * hd + i] = cos[pos * hd + half + i] = cv;
      sin[pos * hd + i] = sin[pos * hd + half + i] = sv;
    }
  }
  const cast = (a: Float64Array) => (b.float === 'float64' ? a : Float32Array.from(a));
  return {
    cos: b.initializer('rope.cos', cast(cos), [P, hd], b.float),
    sin: b.initializer('rope.sin', cast(sin), [P, hd], b.float),
  };
}

/**
 * Causal + key-padding additive bias from a key mask [B, S] (1 = real token, any numeric dtype):
 * [B, 1, T, S]. Query i (of the last T positions) may attend key j iff j ≤ S − T + i and (mask[j] or
 * j is the query's own position).
 * With `keyMask` null: the plain causal bias [T, T].
 */
export function causalBias(b: GraphBuilder, keyMask: Var | null, T: Dim): Var {
  if (keyMask && keyMask.rank !== 2)
    throw new GraphError(`causalBias: key mask ${keyMask.name} must be [B, S], got ${fmtShape(keyMask.shape)}`);
  return b.scope('mask', () => {
    const S = keyMask ? keyMask.shape[1] : T;
    const kidx = b.unsqueeze(b.range(S), [0]); // [1, S]
    let qidx = b.range(T); // [T]
    if (!dimEq(S, T))
      qidx = b.op(
        'Add',
        [qidx, b.op('Sub', [b.dimTensor(S), b.dimTensor(T)], {}, { dtype: 'int64', shape: [1] })],
        {},
        { dtype: 'int64', shape: [T] },
      );
    const causal = b.lessOrEqual(kidx, b.unsqueeze(qidx, [1])); // [T, S]
    if (!keyMask) return b.where(causal, b.const(0), b.const(MASK_NEG)); // [T, S]
    const km =
      keyMask.dtype === 'bool' ? keyMask : b.op('Cast', [keyMask], { to: 9 }, { dtype: 'bool', shape: keyMask.shape });
    // a padding query (all of its keys masked) attends to itself only, so its output does not
    // depend on how much padding the batch has
    const diag = b.equal(kidx, b.unsqueeze(qidx, [1])); // [T, S]
    const allowed = b.and(b.or(b.unsqueeze(km, [1]), diag), causal); // [B, T, S]
    return b.unsqueeze(b.where(allowed, b.const(0), b.const(MASK_NEG)), [1]); // [B, 1, T, S]
  });
}

/** One query block of causal attention: its query rows, the keys it attends ([0, keys)), and its bias [.., rows, keys]. */
export interface CausalBlock {
  rows: Dim;
  keys: Dim;
  bias: Var;
}

/**
 * Causal attention by query blocks (the causal block skipping of FlashAttention, Dao et al. 2022,
 * at the graph level): the T queries are cut into `n` blocks of ⌊T/n⌋ or ⌈T/n⌉ rows, and block i
 * attends only keys [0, end_i), end_i its last query + 1. The score blocks above the diagonal are
 * all masked (exactly 0 after the softmax), so leaving them out changes nothing but the work:
 * (n + 1) / 2n of the [T, T] scores, softmax and their backward. `bias` [.., T, T] (no KV cache)
 * is cut once, here, and shared by every layer.
 */
export function causalBlocks(b: GraphBuilder, bias: Var, T: Dim, n: number): CausalBlock[] {
  if (!Number.isInteger(n) || n < 2) throw new GraphError(`causalBlocks: need an integer n ≥ 2, got ${n}`);
  const [rowsDim, keysDim] = bias.shape.slice(-2);
  if (!dimEq(rowsDim, T) || !dimEq(keysDim, T))
    throw new GraphError(`causalBlocks: bias ${fmtShape(bias.shape)} must end in [${T}, ${T}] (no KV cache)`);
  return b.scope('mask', () => {
    const t = b.dimTensor(T),
      tag = String(T).replace(/[^A-Za-z0-9_]/g, '_');
    const ends = Array.from({ length: n }, (_, i) =>
      i === n - 1
        ? t
        : b.op(
            'Div',
            [b.op('Mul', [t, b.const([i + 1], 'int64')], {}, { dtype: 'int64', shape: [1] }), b.const([n], 'int64')],
            {},
            { dtype: 'int64', shape: [1] },
          ),
    );
    const rows = ends.map((e, i) =>
      b.namedDim(i === 0 ? e : b.op('Sub', [e, ends[i - 1]], {}, { dtype: 'int64', shape: [1] }), `${tag}_q${n}_${i}`),
    );
    const rowBias = b.split(bias, bias.rank - 2, rows);
    let keys: Dim = 0;
    return rows.map((r, i) => {
      keys = dimAdd(keys, r);
      return { rows: r, keys, bias: i === n - 1 ? rowBias[i] : b.slice(rowBias[i], bias.rank - 1, 0, keys) };
    });
  });
}

/**
 * Query blocks for rows of T tokens: `n` (default QUERY_BLOCKS) from QUERY_BLOCKS_MIN_T tokens on,
 * 1 below, where the extra nodes cost more than the skipped score blocks save (and T ≥ n keeps
 * every block non-empty). SmolLM2-135M training step, 2 × 1024 tokens, 2 threads: 13.4 s with 4
 * blocks against 17.7 s with one (docs/benchmarks.md); 2 and 8 blocks were slower than 4.
 */
export const QUERY_BLOCKS = 4,
  QUERY_BLOCKS_MIN_T = 256;
export function queryBlocksFor(T: number, n = QUERY_BLOCKS): number {
  return T >= Math.max(QUERY_BLOCKS_MIN_T, n) ? n : 1;
}

export interface LlamaForwardOptions {
  /** Token ids [B, T] int64. */
  ids: Var;
  /** Position ids [B, T] int64 (default 0..T−1; pass cumsum(mask) − 1 for left-padded rows). */
  positions?: Var;
  /** Key mask [B, S] (S = T, or P + T with a cache); builds the causal + padding bias. */
  attentionMask?: Var;
  /** Additive bias [B, 1, T, S] (or [T, S]); overrides attentionMask. With neither, plain causal attention. */
  bias?: Var;
  /** Per-layer KV cache [B, KVH, P, hd]. */
  past?: { keys: Var[]; values: Var[] };
  /**
   * M-RoPE offsets [B, T, 3] int64 (vision.ts mropeDeltas; configs with mropeSection): token (b, t)
   * rotates the frequencies of section a ∈ (t, h, w) by position + delta[b, t, a]. Without it an
   * M-RoPE decoder is plain RoPE (text: the three positions are equal).
   */
  mropeDelta?: Var;
  /** Replace token embeddings [N = B·T, D] before the first layer (vision.ts placeImageTokens). */
  placeImages?: (tokens: Var, N: Dim) => Var;
  /** LoRA adapters (lib/model/lora.ts): `p` holds `<module>.lora_A.weight` / `.lora_B.weight`. */
  lora?: { config: LoraConfig; p: ParamVars };
  /**
   * Gradient checkpointing (builder.ts `checkpoint`): each decoder layer keeps only its input for
   * the backward, which recomputes the layer's forward. Training graphs only (no KV cache).
   */
  checkpointLayers?: boolean;
  /**
   * q/k/v and gate/up as one Gemm each against row-concatenated weights (default true). The
   * generation graph turns it off: nothing orders those weight-only Concats after the previous
   * layer, so onnxruntime may run them all first and hold a copy of 60 % of the decoder.
   */
  fuseProjections?: boolean;
  /**
   * Causal attention in this many query blocks (`causalBlocks`; no KV cache): block i attends only
   * the keys up to its last query, so the all-masked score blocks above the diagonal are never
   * computed. Same result as the full scores; default 1 (one block).
   */
  queryBlocks?: number;
}

export interface LlamaForwardResult {
  /** Final-norm hidden states [B·T, D]. */
  hidden: Var;
  /** Per-layer keys/values including the past: [B, KVH, S, hd]. */
  presentKeys: Var[];
  presentValues: Var[];
}

/** The decoder trunk. */
export function llamaForward(
  b: GraphBuilder,
  c: ModelConfig,
  p: ParamVars,
  o: LlamaForwardOptions,
): LlamaForwardResult {
  const { ids } = o;
  if (ids.rank !== 2 || (ids.dtype !== 'int64' && ids.dtype !== 'int32'))
    throw new GraphError(`llama: ids must be int64 [B, T], got ${ids}`);
  const [B, T] = ids.shape;
  const N = `${B}*${T}`;
  const H = c.numAttentionHeads,
    KVH = c.numKeyValueHeads,
    G = H / KVH,
    hd = c.headDim,
    D = c.hiddenSize;
  if (o.past && (o.past.keys.length !== c.numHiddenLayers || o.past.values.length !== c.numHiddenLayers))
    throw new GraphError(`llama: past must have ${c.numHiddenLayers} keys and values`);

  const { cos, sin } = b.scope('rope', () => ropeTables(b, c));
  const [cosT, sinT] = b.scope('rope', () => {
    const sec = c.mropeSection;
    if (o.mropeDelta && sec) {
      // M-RoPE (Qwen2-VL): cos/sin of each channel from its section's position; the channel
      // selection is a 0/1 mask summed over the three axes, so every value is one table entry
      const pos = o.positions ?? b.unsqueeze(b.range(T), [0]); // [B | 1, T]
      const p3 = b.add(b.unsqueeze(pos, [2]), o.mropeDelta); // [B, T, 3]
      const sel = new Float32Array(3 * hd);
      for (let ch = 0; ch < hd; ch++) {
        const f = ch % (hd / 2);
        const a = f < sec[0] ? 0 : f < sec[0] + sec[1] ? 1 : 2;
        sel[a * hd + ch] = 1;
      }
      const selV = b.initializer(
        'rope.mrope_select',
        b.float === 'float64' ? Float64Array.from(sel) : sel,
        [3, hd],
        b.float,
      );
      const pick = (table: Var) => b.unsqueeze(b.reduceSum(b.mul(b.gather(table, p3), selV), [2]), [2]); // [B, T, 1, hd]
      return [pick(cos), pick(sin)];
    }
    if (o.positions) {
      if (!dimEq(o.positions.shape[0], B) || !dimEq(o.positions.shape[1], T))
        throw new GraphError(`llama: positions ${fmtShape(o.positions.shape)} must match ids ${fmtShape(ids.shape)}`);
      return [b.unsqueeze(b.gather(cos, o.positions), [2]), b.unsqueeze(b.gather(sin, o.positions), [2])]; // [B, T, 1, hd]
    }
    return [b.unsqueeze(b.slice(cos, 0, 0, T), [1]), b.unsqueeze(b.slice(sin, 0, 0, T), [1])]; // [T, 1, hd]
  });

  let bias: Var | null = o.bias ?? null;
  if (!bias) {
    if (o.attentionMask) bias = causalBias(b, o.attentionMask, T);
    else if (o.past) throw new GraphError('llama: with a KV cache pass attentionMask [B, P+T] or bias');
    else bias = causalBias(b, null, T);
  }
  const bias5 = G > 1 && bias.rank === 4 ? b.unsqueeze(bias, [1]) : bias;
  const nq = o.queryBlocks ?? 1;
  if (nq > 1 && o.past) throw new GraphError('llama: queryBlocks is for graphs without a KV cache');
  const blocks = nq > 1 ? causalBlocks(b, bias5, T, nq) : null;

  let x = b.scope('embed', () =>
    embedding(
      b,
      param(p, 'model.embed_tokens.weight'),
      b.reshape(ids.dtype === 'int64' ? ids : b.cast(ids, 'int64'), [N]),
    ),
  );
  if (o.placeImages) x = o.placeImages(x, N);
  const presentKeys: Var[] = [],
    presentValues: Var[] = [];
  const scale = 1 / Math.sqrt(hd);
  const lora = o.lora ?? null;
  const loraS = lora ? loraScale(lora.config) : 0;
  /** y + s·(x·Aᵀ)·Bᵀ for an adapted module (Hu et al. 2021): x [N, in], A [r, in], B [out, r] → [N, out]; y unchanged otherwise. */
  const adaptWith = (y: Var, x: Var, module: string, path: string, P: (name: string) => Var): Var => {
    if (!lora || !lora.config.targetModules.includes(module as never)) return y;
    return b.scope(`lora.${module}`, () =>
      b.add(
        y,
        b.gemm(linear(b, x, P(`${path}.lora_A.weight`)), P(`${path}.lora_B.weight`), { transB: true, alpha: loraS }),
      ),
    );
  };

  if (o.checkpointLayers && o.past)
    throw new GraphError('llama: checkpointLayers is for training graphs (no KV cache)');
  for (let l = 0; l < c.numHiddenLayers; l++) {
    const pre = `model.layers.${l}`;
    /** One decoder layer: x0 [N, D] → [x0 + attn, + mlp, and the layer's keys / values]; weights through P. */
    const layer = (x0: Var, P: (name: string) => Var): Var[] => {
      let kv: Var[] = [];
      const adapt = (y: Var, x: Var, module: string, path: string): Var => adaptWith(y, x, module, path, P);
      const attnOut = b.scope('attn', () => {
        const h = rmsNorm(b, x0, P(`${pre}.input_layernorm.weight`), c.rmsNormEps);
        // q, k, v in one Gemm against the row-concatenated weights (fewer, larger GEMMs; the
        // weight gradient is one Gemm too, split back by the Concat's backward rule)
        const qd = H * hd,
          kvd = KVH * hd;
        const fused = () => {
          const wqkv = b.concat(
            [
              P(`${pre}.self_attn.q_proj.weight`),
              P(`${pre}.self_attn.k_proj.weight`),
              P(`${pre}.self_attn.v_proj.weight`),
            ],
            0,
          );
          const bqkv = c.attentionBias
            ? b.concat(
                [
                  P(`${pre}.self_attn.q_proj.bias`),
                  P(`${pre}.self_attn.k_proj.bias`),
                  P(`${pre}.self_attn.v_proj.bias`),
                ],
                0,
              )
            : null;
          return b.split(linear(b, h, wqkv, bqkv), 1, [qd, kvd, kvd]);
        };
        const single = (m: string) =>
          linear(b, h, P(`${pre}.self_attn.${m}.weight`), c.attentionBias ? P(`${pre}.self_attn.${m}.bias`) : null);
        const [q00, k00, v00] =
          o.fuseProjections === false ? [single('q_proj'), single('k_proj'), single('v_proj')] : fused();
        const q0 = adapt(q00, h, 'q_proj', `${pre}.self_attn.q_proj`),
          k0 = adapt(k00, h, 'k_proj', `${pre}.self_attn.k_proj`),
          v0 = adapt(v00, h, 'v_proj', `${pre}.self_attn.v_proj`);
        let q = b.reshape(q0, [B, T, H, hd]);
        let k = b.reshape(k0, [B, T, KVH, hd]);
        if (hasQkNorm(c)) {
          // Qwen3: RMSNorm over each head's hd channels of q and k, before RoPE
          q = rmsNorm(b, q, P(`${pre}.self_attn.q_norm.weight`), c.rmsNormEps);
          k = rmsNorm(b, k, P(`${pre}.self_attn.k_norm.weight`), c.rmsNormEps);
        }
        const v = b.reshape(v0, [B, T, KVH, hd]);
        q = b.mul(rope(b, q, cosT, sinT), scale);
        k = rope(b, k, cosT, sinT);
        let k4 = b.transpose(k, [0, 2, 1, 3]); // [B, KVH, T, hd]
        let v4 = b.transpose(v, [0, 2, 1, 3]);
        if (o.past) {
          k4 = b.concat([o.past.keys[l], k4], 2);
          v4 = b.concat([o.past.values[l], v4], 2);
        }
        kv = [k4, v4];
        let ctx: Var;
        // softmax(q·kᵀ + bias)·v over the queries' last-but-one axis; by query blocks when `blocks`
        const core = (qh: Var, kT: Var, vh: Var, bs: Var): Var =>
          b.matmul(b.softmax(b.add(b.matmul(qh, kT), bs), -1), vh);
        const attend = (qh: Var, kh: Var, vh: Var): Var => {
          const kT = (x: Var) => (G === 1 ? b.transposeLast2(x) : b.unsqueeze(b.transposeLast2(x), [2]));
          const vv = (x: Var) => (G === 1 ? x : b.unsqueeze(x, [2]));
          if (!blocks) return core(qh, kT(kh), vv(vh), G === 1 ? bias! : bias5);
          const qAxis = qh.rank - 2,
            qs = b.split(
              qh,
              qAxis,
              blocks.map((x) => x.rows),
            );
          return b.concat(
            blocks.map((blk, i) => {
              const last = i === blocks.length - 1; // the last block attends every key
              return core(
                qs[i],
                kT(last ? kh : b.slice(kh, 2, 0, blk.keys)),
                vv(last ? vh : b.slice(vh, 2, 0, blk.keys)),
                blk.bias,
              ); // keys on axis 2
            }),
            qAxis,
            T,
          );
        };
        if (G === 1) {
          const q4 = b.transpose(q, [0, 2, 1, 3]); // [B, H, T, hd]
          ctx = b.transpose(attend(q4, k4, v4), [0, 2, 1, 3]); // [B, T, H, hd]
        } else {
          const q5 = b.transpose(b.reshape(q, [B, T, KVH, G, hd]), [0, 2, 3, 1, 4]); // [B, KVH, G, T, hd]
          ctx = b.transpose(attend(q5, k4, v4), [0, 3, 1, 2, 4]); // [B, T, KVH, G, hd]
        }
        const ctx2 = b.reshape(ctx, [N, H * hd]);
        return adapt(linear(b, ctx2, P(`${pre}.self_attn.o_proj.weight`)), ctx2, 'o_proj', `${pre}.self_attn.o_proj`);
      });
      const x1 = b.add(x0, attnOut);
      const mlpOut = b.scope('mlp', () => {
        const h = rmsNorm(b, x1, P(`${pre}.post_attention_layernorm.weight`), c.rmsNormEps);
        const F = c.intermediateSize;
        const [gate0, up0] =
          o.fuseProjections === false
            ? [linear(b, h, P(`${pre}.mlp.gate_proj.weight`)), linear(b, h, P(`${pre}.mlp.up_proj.weight`))]
            : b.split(
                linear(b, h, b.concat([P(`${pre}.mlp.gate_proj.weight`), P(`${pre}.mlp.up_proj.weight`)], 0)),
                1,
                [F, F],
              );
        const act = swiglu(
          b,
          adapt(gate0, h, 'gate_proj', `${pre}.mlp.gate_proj`),
          adapt(up0, h, 'up_proj', `${pre}.mlp.up_proj`),
        );
        return adapt(linear(b, act, P(`${pre}.mlp.down_proj.weight`)), act, 'down_proj', `${pre}.mlp.down_proj`);
      });
      return [b.add(x1, mlpOut), ...kv];
    };
    b.scope(`layers.${l}`, () => {
      let out: Var[];
      if (o.checkpointLayers) {
        // the layer's input and its weights (base and adapters) are the checkpoint's inputs
        const names = [...p.keys()].filter((k) => k.startsWith(`${pre}.`));
        if (lora) names.push(...[...lora.p.keys()].filter((k) => k.startsWith(`${pre}.`)));
        const all = new Map<string, Var>([...p, ...(lora ? lora.p : [])]);
        out = b.checkpoint([x, ...names.map((n) => all.get(n)!)], ([x0, ...ws]) => {
          const byName = new Map(names.map((n, i) => [n, ws[i]]));
          return layer(x0, (n) => {
            const v = byName.get(n);
            if (!v) throw new GraphError(`llama: missing parameter ${n}`);
            return v;
          });
        });
      } else {
        out = layer(x, (n) => param(lora && n.includes('.lora_') ? lora.p : p, n));
      }
      x = out[0];
      presentKeys.push(out[1]);
      presentValues.push(out[2]);
    });
  }
  const hidden = b.scope('final_norm', () => rmsNorm(b, x, param(p, 'model.norm.weight'), c.rmsNormEps));
  if (!dimEq(hidden.shape[1], D)) throw new GraphError('internal: hidden width');
  return { hidden, presentKeys, presentValues };
}

/** Logits [N, V] = hidden · Wᵀ with W = lm_head.weight (or the tied embedding). */
export function lmHead(b: GraphBuilder, c: ModelConfig, p: ParamVars, hidden: Var): Var {
  if (c.head !== 'lm') throw new GraphError('lmHead: this is a value model (head "value")');
  const w = c.tieWordEmbeddings ? param(p, 'model.embed_tokens.weight') : param(p, 'lm_head.weight');
  return b.scope('lm_head', () => linear(b, hidden, w));
}

/** Values [N] = hidden · score.weightᵀ (HF token-classification head, one label). */
export function valueHead(b: GraphBuilder, c: ModelConfig, p: ParamVars, hidden: Var): Var {
  if (c.head !== 'value') throw new GraphError('valueHead: this is a policy model (head "lm")');
  return b.scope('value_head', () => b.squeeze(linear(b, hidden, param(p, 'score.weight')), [1]));
}
