/**
 * Starting stages by name (the one place that knows all five): used by the embedded runner, which
 * starts all of them in one process, and by `rlstream serve <stage>`, which starts one.
 */
import type { Pipeline, StageRun } from '../lib/pipeline/runtime.ts';
import { tokenizerFor } from '../lib/pipeline/policy.ts';
import { loadRunData } from '../lib/pipeline/data.ts';
import { startController } from './controller/main.ts';
import { startRollout } from './rollout/main.ts';
import { startReward, createRewardBackend } from './reward/main.ts';
import { startAdvantage } from './advantage/main.ts';
import { startUpdate } from './update/main.ts';
import { ConfigError } from '../lib/errors.ts';

export const STAGES = ['controller', 'rollout', 'reward', 'advantage', 'update'] as const;
export type StageName = (typeof STAGES)[number];

export interface StartedStage {
  name: string;
  run: StageRun;
  close(): Promise<void>;
}

export async function startStage(
  p: Pipeline,
  name: string,
  opts: { replica?: number; replay?: boolean; rolloutInProcess?: boolean } = {},
): Promise<StartedStage> {
  const replica = opts.replica ?? 0;
  switch (name) {
    case 'controller': {
      const data = await loadRunData(p.cfg, tokenizerFor(p.cfg));
      return { name, run: startController(p, data, { replay: opts.replay }), close: async () => {} };
    }
    case 'rollout':
      return { name, run: startRollout(p, { replica: String(replica) }), close: async () => {} };
    case 'reward': {
      const backend = await createRewardBackend(p, replica);
      return { name, run: startReward(p, backend, { replica: String(replica) }), close: () => backend.close() };
    }
    case 'advantage':
      return { name, run: startAdvantage(p), close: async () => {} };
    case 'update': {
      const data = await loadRunData(p.cfg, tokenizerFor(p.cfg));
      const run = await startUpdate(p, {
        trainSize: data.train.length,
        rolloutInProcess: opts.rolloutInProcess === true,
      });
      return { name, run, close: async () => {} };
    }
    default:
      throw new ConfigError(`unknown stage "${name}" — valid: ${STAGES.join(', ')}`);
  }
}
