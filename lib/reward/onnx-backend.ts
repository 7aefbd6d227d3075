/**
 * Reward backend `reward.type: model`: an ONNX sequence scorer run in the reward stage's process
 * (onnx-scorer.ts) on each trajectory's own token ids, padded with the run's tokenizer's pad id
 * unless the model declares its own.
 */
import { forStage } from '../log.ts';
import { tokenizerFor } from '../pipeline/policy.ts';
import { createModelRewardScorer } from './onnx-scorer.ts';
import type { RewardBackend, RewardBackendContext } from './port.ts';

export async function createOnnxRewardBackend({ cfg, log }: RewardBackendContext): Promise<RewardBackend> {
  const r = cfg.reward;
  const tok = tokenizerFor(cfg);
  const scorer = await createModelRewardScorer(r.model, { padId: tok.pad });
  const { vocabSize } = scorer.limits;
  if (vocabSize !== null && vocabSize !== tok.vocabSize) {
    forStage(log, 'reward').warn(
      { model: r.model.path, model_vocab_size: vocabSize, tokenizer_vocab_size: tok.vocabSize },
      `reward model ${r.model.path} declares a vocabulary of ${vocabSize} ids but the run's tokenizer (actor.model.tokenizer = ${cfg.actor.model.tokenizer}) has ${tok.vocabSize}: it was probably built for another tokenizer; ids ≥ ${vocabSize} fail to score`,
    );
  }
  return { name: `onnx:${r.model.path}`, score: (items) => scorer.scoreBatch(items), close: () => scorer.close() };
}
