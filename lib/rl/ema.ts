/**
 * Exponential moving average of policy weights for evaluation/checkpointing:
 * θ_ema ← d·θ_ema + (1 − d)·θ per parameter, with d = decay, or min(decay, (1 + n)/(10 + n)) when
 * `num_updates` n is given (the warm-up of tf.train.ExponentialMovingAverage). A weight map is a
 * record of parameter name → typed array.
 */
import { ConfigError } from '../errors.ts';
import { assertFinite, checkScalar, newLike, type FloatArray } from './tensor.ts';

export type WeightMap = Readonly<Record<string, FloatArray>>;

export interface EmaOptions {
  /** Number of updates applied so far (enables the warm-up decay). */
  num_updates?: number;
}

/** The decay actually applied. */
export function effectiveEmaDecay(decay: number, opts: EmaOptions = {}): number {
  checkScalar('ema decay', decay, { min: 0, max: 1 });
  if (opts.num_updates === undefined) return decay;
  const n = checkScalar('ema num_updates', opts.num_updates, { min: 0 });
  return Math.min(decay, (1 + n) / (10 + n));
}

function checkMaps(ema: WeightMap, current: WeightMap): string[] {
  const keys = Object.keys(current).sort();
  const emaKeys = Object.keys(ema).sort();
  const missing = keys.filter((k) => !(k in ema)),
    extra = emaKeys.filter((k) => !(k in current));
  if (missing.length || extra.length) {
    throw new ConfigError(
      `ema: the weight maps differ — missing in EMA: ${missing.join(', ') || '(none)'}; not in the model: ${extra.join(', ') || '(none)'}`,
    );
  }
  for (const k of keys) {
    if (ema[k].length !== current[k].length)
      throw new ConfigError(`ema: parameter "${k}" has ${current[k].length} values but the EMA holds ${ema[k].length}`);
    assertFinite(`ema: parameter "${k}"`, current[k]);
  }
  return keys;
}

/**
 * One EMA step, pure: returns a new map (arrays in the EMA's dtype). With `ema` null/undefined the
 * EMA starts as a copy of `current`.
 */
export function emaUpdate(
  ema: WeightMap | null | undefined,
  current: WeightMap,
  decay: number,
  opts: EmaOptions = {},
): Record<string, FloatArray> {
  const d = effectiveEmaDecay(decay, opts);
  const out: Record<string, FloatArray> = {};
  if (!ema) {
    for (const k of Object.keys(current)) {
      assertFinite(`ema: parameter "${k}"`, current[k]);
      out[k] = current[k].slice();
    }
    return out;
  }
  for (const k of checkMaps(ema, current)) {
    const e = ema[k],
      c = current[k];
    const o = newLike(e, e.length);
    for (let j = 0; j < e.length; j++) o[j] = d * e[j] + (1 - d) * c[j];
    out[k] = o;
  }
  return out;
}

/** The same update written into `ema`'s arrays (no allocation), for large models. */
export function emaUpdateInPlace(
  ema: Record<string, FloatArray>,
  current: WeightMap,
  decay: number,
  opts: EmaOptions = {},
): void {
  const d = effectiveEmaDecay(decay, opts);
  for (const k of checkMaps(ema, current)) {
    const e = ema[k],
      c = current[k];
    for (let j = 0; j < e.length; j++) e[j] = d * e[j] + (1 - d) * c[j];
  }
}
