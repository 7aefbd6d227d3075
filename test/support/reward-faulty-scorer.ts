/**
 * TEST FIXTURE — a scorer module that injects faults into a real `rlstream reward-server`
 * (`--scorer test/support/reward-faulty-scorer.ts`). Not part of the production path. The fault
 * is chosen by the server process's environment, REWARD_FAULT:
 *   (unset)      score like the example scorer;
 *   stall        never answer (the client must time out);
 *   throw        throw → the server answers 500 {"error": "scorer failed: …"};
 *   nan          return {vlm_score: NaN} → the server refuses it with a 500;
 *   delay=MS     answer correctly after MS milliseconds.
 */
import score from '../../examples/reward-server/overlap-scorer.ts';
import type { ScoreRequest, ScoreResult } from '../../lib/reward/scorer.ts';

const fault = process.env.REWARD_FAULT ?? '';

export default async function faultyScore(req: ScoreRequest): Promise<ScoreResult> {
  if (fault === 'stall')
    return new Promise<ScoreResult>(() => {
      /* never settles */
    });
  if (fault === 'throw') throw new Error('injected fault: scorer crashed');
  if (fault === 'nan') return { vlm_score: Number.NaN, ocr_confidence: 0.5 };
  const delay = /^delay=(\d+)$/.exec(fault);
  if (delay) await new Promise((r) => setTimeout(r, Number(delay[1])));
  else if (fault) throw new Error(`unknown REWARD_FAULT "${fault}" — valid: stall, throw, nan, delay=MS`);
  return score(req);
}
