/**
 * LoRA merge in ORT: W' = W + s·B·A per adapted module (Hu et al. 2021, §4.1: the merged model
 * has no inference latency), one Gemm(B [out, r], A [r, in], C = W [out, in], alpha = s) per
 * module in one session with symbolic shapes. The same result as lib/model/lora.ts `mergeLora`
 * (the plain-JS reference) to float32 rounding, in a fraction of its time at real widths.
 */
import { GraphBuilder } from '../onnx/builder.ts';
import { runInto, tensor, type SessionOptions } from '../onnx/runtime.ts';
import type { ModelConfig } from './config.ts';
import { loraScale, loraSites, type LoraConfig } from './lora.ts';
import type { Weights } from './params.ts';
import { defaultSessionCache, SessionCache } from './session-cache.ts';
import { ConfigError } from '../errors.ts';

function buildMergeGraph(scale: number): Uint8Array {
  const b = new GraphBuilder({ name: 'lora_merge', float: 'float32' });
  const w = b.input('w', 'float32', ['O', 'I']),
    a = b.input('a', 'float32', ['r', 'I']),
    bb = b.input('b', 'float32', ['O', 'r']);
  b.output(b.gemm(bb, a, { alpha: scale, c: w }), 'merged'); // [O, r]·[r, I]·s + W
  return b.toBytes();
}

/** Merged weights: new arrays for the adapted modules, the base's own arrays for every other tensor. */
export async function mergeLoraOnnx(
  c: ModelConfig,
  l: LoraConfig,
  base: ReadonlyMap<string, Float32Array>,
  adapter: ReadonlyMap<string, Float32Array>,
  opts: { cache?: SessionCache; session?: SessionOptions } = {},
): Promise<Weights> {
  const s = loraScale(l);
  const sess = await (opts.cache ?? defaultSessionCache).get(
    `lora_merge:${s}`,
    () => buildMergeGraph(s),
    opts.session ?? {},
  );
  const out: Weights = new Map(base);
  for (const site of loraSites(c, l)) {
    const W = base.get(`${site.path}.weight`),
      A = adapter.get(`${site.path}.lora_A.weight`),
      B = adapter.get(`${site.path}.lora_B.weight`);
    if (!W || !A || !B) throw new ConfigError(`mergeLoraOnnx: ${site.path} lacks its base weight or adapter`);
    const O = site.outFeatures,
      I = site.inFeatures,
      M = new Float32Array(O * I);
    await runInto(
      sess,
      { w: tensor('float32', W, [O, I]), a: tensor('float32', A, [l.rank, I]), b: tensor('float32', B, [O, l.rank]) },
      { merged: tensor('float32', M, [O, I]) },
      [],
    );
    out.set(`${site.path}.weight`, M);
  }
  return out;
}
