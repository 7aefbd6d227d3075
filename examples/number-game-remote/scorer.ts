/**
 * Number-game scorer for `rlstream reward-server --scorer examples/number-game-remote/scorer.ts`.
 * Deterministic, dependency-free. From a `/score` request `{prompt, response, ground_truth}` (the
 * `text` request preset) it returns, per trajectory:
 *
 *  - accuracy  1 when the trimmed response equals the trimmed ground truth (the index 0/1/2 of
 *              the largest number), else 0;
 *  - format    1 when the trimmed response is a bare integer (the answer's shape), else 0 —
 *              empty, several numbers, ':' …;
 *  - server_pid the process id of the server that scored it — not weighted into the reward, but
 *              kept in the trajectory's reward_details, so routing and failover can be checked in
 *              the store (`select reward_details->>'server_pid', count(*) …`).
 *
 * The config maps these to the scalar reward with `response_mapping.weights: {accuracy: 1.0,
 * format: 0.1}`: exactly the built-in `number_game` reward function (accuracy + 0.1 · format),
 * computed out of process — so a run scored by the servers trains exactly like one scored by the
 * function. Both weighted fields are in [0, 1], as the client's range check requires.
 */
import type { ScoreRequest, ScoreResult } from '../../lib/reward/scorer.ts';

export function accuracy(response: string, groundTruth: string): number {
  return response.trim() === groundTruth.trim() ? 1 : 0;
}

export function formatScore(response: string): number {
  return /^-?\d+$/.test(response.trim()) ? 1 : 0;
}

export default function score(req: ScoreRequest): ScoreResult {
  if (req.response === undefined || req.ground_truth === undefined) {
    // The default {image, prompt} body (request_preset: seed_image_prompt) carries neither: use request_preset: text.
    throw new Error(
      'number-game scorer needs "response" and "ground_truth" in the request (set reward.remote.request_preset: text)',
    );
  }
  return {
    accuracy: accuracy(req.response, req.ground_truth),
    format: formatScore(req.response),
    server_pid: process.pid,
  };
}
