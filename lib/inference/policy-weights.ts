/**
 * A served policy version: its number and directory (all the HTTP thread of serve-policy keeps),
 * and its weights as the decode thread (decode-worker.ts) reads them. Apart from served-policy.ts
 * so the decode thread loads weights without the run-config and tokenizer modules.
 */
import { existsSync } from 'node:fs';
import { RlError } from '../errors.ts';
import { loadCheckpoint, readModelDirConfig } from '../model/checkpoint.ts';
import type { ModelConfig } from '../model/config.ts';
import type { Weights } from '../model/params.ts';

/** A policy version by its directory (what the HTTP thread keeps; the decode thread loads the weights). */
export interface PolicyRef {
  version: number;
  dir: string;
}

export interface PolicyWeights extends PolicyRef {
  weights: Weights;
}

/**
 * Loads a policy directory's weights, checked against the served architecture (its config.json
 * first, so a directory of another model is refused before its weights are read).
 */
export async function loadPolicyWeights(dir: string, expect: ModelConfig, version: number): Promise<PolicyWeights> {
  if (!existsSync(dir))
    throw new RlError(`model_path ${dir} does not exist`, { retriable: false, code: 'ERR_NO_MODEL_PATH' });
  const c = (await readModelDirConfig(dir)).config;
  if (
    c.vocabSize !== expect.vocabSize ||
    c.hiddenSize !== expect.hiddenSize ||
    c.numHiddenLayers !== expect.numHiddenLayers
  )
    throw new RlError(
      `${dir} does not match the served model (vocab ${c.vocabSize}/${expect.vocabSize}, d_model ${c.hiddenSize}/${expect.hiddenSize}, layers ${c.numHiddenLayers}/${expect.numHiddenLayers})`,
      { retriable: false, code: 'ERR_MODEL_MISMATCH' },
    );
  const ck = await loadCheckpoint(dir, { optimizer: false });
  return { version, weights: ck.weights, dir };
}
