/**
 * Pluggable scorers for `rlstream reward-server`. A scorer turns validated `/score` requests into
 * result objects such as `{vlm_score: 0.85, ocr_confidence: 0.92}`:
 *  - a function module (`.js`/`.mjs`/`.ts`): default export (or `score` export) is
 *    `(req: ScoreRequest) => ScoreResult | Promise<ScoreResult>`;
 *  - an ONNX sequence scorer (`.onnx`, run by onnxruntime-node): `{[score_field]: score}` where the
 *    text is prompt followed by response (see onnx-scorer.ts).
 */
import { existsSync } from 'node:fs';
import { extname, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ConfigError } from '../errors.ts';

/** One validated request as a scorer sees it. */
export interface ScoreRequest {
  prompt: string;
  response?: string;
  ground_truth?: string;
  id?: string | number;
  /** Decoded PNG bytes of `image`, when sent. */
  image?: Buffer;
  /** Any other fields of the request body, as sent. */
  extra: Record<string, unknown>;
}

/** What a scorer returns per request: plain JSON; every number must be finite. */
export type ScoreResult = Record<string, unknown>;

export interface Scorer {
  /** Shown by /healthz and in logs. */
  name: string;
  /** One result per request, in order. Throwing fails the whole HTTP request with 500. */
  score(reqs: ScoreRequest[]): Promise<ScoreResult[]>;
  close?(): Promise<void>;
}

export type ScoreFn = (req: ScoreRequest) => ScoreResult | Promise<ScoreResult>;

export interface OnnxScorerFlags {
  transform: 'none' | 'sigmoid';
  scale: number;
  threshold: number | null;
  /** Name of the returned field holding the model's score. */
  scoreField: string;
  maxLength: number;
  threads: number;
}

export function functionScorer(name: string, fn: ScoreFn): Scorer {
  return {
    name,
    async score(reqs) {
      return Promise.all(reqs.map(async (r) => fn(r)));
    },
  };
}

/** Loads `--scorer <module.js|module.ts|model.onnx>`. */
export async function loadScorer(spec: string, onnx: OnnxScorerFlags): Promise<Scorer> {
  const abs = resolve(spec);
  if (!existsSync(abs))
    throw new ConfigError(
      `--scorer: file not found: ${abs} (a scorer module such as examples/reward-server/overlap-scorer.ts, or an .onnx model)`,
    );
  if (extname(abs).toLowerCase() === '.onnx') {
    // Loaded lazily so that function-module servers do not pay for onnxruntime-node.
    const { loadOnnxSequenceScorer } = await import('./onnx-scorer.ts');
    const model = await loadOnnxSequenceScorer({
      path: abs,
      transform: onnx.transform,
      scale: onnx.scale,
      threshold: onnx.threshold,
      maxLength: onnx.maxLength,
      threads: onnx.threads,
    });
    return {
      name: `onnx:${abs}`,
      async score(reqs) {
        const scores = await model.scoreTexts(reqs.map((r) => ({ prompt: r.prompt, response: r.response ?? '' })));
        return scores.map((s) => ({ [onnx.scoreField]: s }));
      },
      close: () => model.close(),
    };
  }
  let mod: Record<string, unknown>;
  try {
    mod = await import(pathToFileURL(abs).href);
  } catch (e) {
    throw new ConfigError(`--scorer: cannot load ${abs}: ${(e as Error).message}`);
  }
  const fn = (typeof mod.default === 'function' ? mod.default : mod.score) as ScoreFn | undefined;
  if (typeof fn !== 'function')
    throw new ConfigError(
      `--scorer: ${abs} must export a function (default export or \`export function score\`) taking {prompt, response?, ground_truth?, image?} and returning e.g. {vlm_score, ocr_confidence}`,
    );
  return functionScorer(`module:${abs}`, fn);
}

/**
 * Checks a scorer's result: a plain object whose numbers are all finite. Returns the reason it is
 * unusable, or null. (Range checks belong to the client's response mapping.)
 */
export function invalidResult(r: unknown): string | null {
  if (r === null || typeof r !== 'object' || Array.isArray(r))
    return `expected an object such as {vlm_score, ocr_confidence}, got ${Array.isArray(r) ? 'an array' : (JSON.stringify(r) ?? String(r))}`;
  let numbers = 0;
  for (const [k, v] of Object.entries(r)) {
    if (typeof v === 'number') {
      if (!Number.isFinite(v)) return `field "${k}" is ${v}`;
      numbers++;
    } else if (typeof v === 'bigint' || typeof v === 'function' || typeof v === 'symbol') {
      return `field "${k}" is a ${typeof v}, not JSON`;
    }
  }
  if (numbers === 0) return `no numeric field in ${JSON.stringify(r).slice(0, 120)}`;
  return null;
}
