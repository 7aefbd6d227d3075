/**
 * Vision number-game scorer for `rlstream reward-server --scorer examples/number-game-vision-remote/scorer.ts`:
 * the reward looks at the prompt image. From a `/score` request `{image, prompt, response,
 * ground_truth}` (the request_template in config.yaml; the image is the real prompt image, the
 * controller's normalised PNG, base64) it decodes the PNG, reads the three digits back with the
 * game's own reader (lib/tasks/number-game-vision.ts: threshold, ink box per third of the width,
 * 5×7 glyph match) and returns, per trajectory:
 *
 *  - vlm_score      1 when the response is the index (0/1/2) of the largest digit the image
 *                   shows, else 0 — the accuracy, judged from the pixels, not from ground_truth;
 *  - ocr_confidence the fraction of the three digits read (each third of the image that holds one
 *                   glyph of the font); 1 for every image the game draws;
 *  - format         1 when the trimmed response is a bare integer, else 0;
 *  - agrees_with_ground_truth  1 when the digits read give the recorded answer (a check on the
 *                   data: it is 1 for every game image), unweighted;
 *  - server_pid     unweighted, to see which server scored what.
 *
 * config.yaml weights {vlm_score: 1.0, format: 0.1}: the built-in number_game_vision reward
 * (accuracy + 0.1 · format), computed from the image out of process.
 */
import sharp from 'sharp';
import type { ScoreRequest, ScoreResult } from '../../lib/reward/scorer.ts';
import { readNumberGameDigits } from '../../lib/tasks/number-game-vision.ts';

export function formatScore(response: string): number {
  return /^-?\d+$/.test(response.trim()) ? 1 : 0;
}

export default async function score(req: ScoreRequest): Promise<ScoreResult> {
  if (!req.image)
    throw new Error(
      'vision number-game scorer needs the prompt image: map "image" to image_base64_png in reward.remote.request_template (or use request_preset: seed_image_prompt plus response)',
    );
  if (req.response === undefined)
    throw new Error(
      'vision number-game scorer needs "response" in the request (map it to response_text in reward.remote.request_template)',
    );
  const { data, info } = await sharp(req.image).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  const digits = readNumberGameDigits({
    width: info.width,
    height: info.height,
    data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
  });
  const read = digits.filter((d) => d !== null).length;
  const answer = read === 3 ? digits.indexOf(Math.max(...(digits as number[]))) : null;
  const response = req.response.trim();
  return {
    vlm_score: answer !== null && response === String(answer) ? 1 : 0,
    ocr_confidence: read / 3,
    format: formatScore(response),
    agrees_with_ground_truth:
      answer !== null && req.ground_truth !== undefined && req.ground_truth.trim() === String(answer) ? 1 : 0,
    server_pid: process.pid,
  };
}
