/**
 * A run directory as `rlstream train` leaves it for serve-policy (for tests): the resolved
 * config.yaml of a run config (default examples/number-game.yaml, with overrides) and policy/v000000 with initial
 * weights; `writeVersion` adds further versions (fresh weights from another seed).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { formatResolvedConfig, loadConfig, type Config } from '../../lib/config/index.ts';
import { saveCheckpoint } from '../../lib/model/checkpoint.ts';
import { initWeights } from '../../lib/model/init.ts';
import type { ModelConfig } from '../../lib/model/config.ts';
import type { Weights } from '../../lib/model/params.ts';
import { policyDir, policyModelConfig, tokenizerFor } from '../../lib/pipeline/policy.ts';

const ROOT = join(import.meta.dirname, '../..');

export interface PolicyRunDir {
  dir: string;
  cfg: Config;
  model: ModelConfig;
  weights: Weights;
  writeVersion(version: number, seed: number): Promise<Weights>;
}

export async function makePolicyRunDir(
  dir: string,
  overrides: string[] = [],
  file = join(ROOT, 'examples/number-game.yaml'),
): Promise<PolicyRunDir> {
  mkdirSync(dir, { recursive: true });
  const cfg = loadConfig({
    file,
    overrides: [`trainer.run_dir=${dir}`, ...overrides],
  });
  const model = policyModelConfig(cfg, tokenizerFor(cfg));
  const weights = initWeights(model, cfg.actor.model.init_seed);
  await saveCheckpoint(policyDir(dir, 0), model, weights);
  writeFileSync(join(dir, 'config.yaml'), formatResolvedConfig(cfg));
  return {
    dir,
    cfg,
    model,
    weights,
    async writeVersion(version, seed) {
      const w = initWeights(model, seed);
      await saveCheckpoint(policyDir(dir, version), model, w);
      return w;
    },
  };
}
