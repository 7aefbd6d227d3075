/**
 * Example scorer for `rlstream reward-server --scorer examples/reward-server/overlap-scorer.ts`.
 * Deterministic and dependency-free, so it doubles as the test and benchmark scorer.
 *
 *  - vlm_score: word-level F1 between the candidate text and the reference, in [0, 1].
 *    candidate = response (or the prompt when no response is sent, as in the default {image, prompt}
 *    body); reference = ground_truth, else the prompt.
 *  - ocr_confidence: share of the candidate's characters that are legible (letters, digits,
 *    whitespace, common punctuation), in [0, 1]; 0 for an empty candidate.
 *  - extra fields, kept by the client in the reward details: `words` (candidate word count) and,
 *    with an image, `image_width` / `image_height` read from the PNG header.
 */
import type { ScoreRequest, ScoreResult } from '../../lib/reward/scorer.ts';

function words(s: string): string[] {
  return s
    .toLowerCase()
    .split(/[^\p{L}\p{N}]+/u)
    .filter(Boolean);
}

/** Word-level F1 (bag of words, clipped counts), as used for SQuAD-style answer overlap. */
export function wordF1(candidate: string, reference: string): number {
  const c = words(candidate),
    r = words(reference);
  if (c.length === 0 || r.length === 0) return c.length === r.length ? 1 : 0;
  const counts = new Map<string, number>();
  for (const w of r) counts.set(w, (counts.get(w) ?? 0) + 1);
  let common = 0;
  for (const w of c) {
    const n = counts.get(w) ?? 0;
    if (n > 0) {
      common++;
      counts.set(w, n - 1);
    }
  }
  if (common === 0) return 0;
  const precision = common / c.length,
    recall = common / r.length;
  return (2 * precision * recall) / (precision + recall);
}

export function legibility(s: string): number {
  const chars = Array.from(s);
  if (chars.length === 0) return 0;
  const ok = chars.filter((ch) => /[\p{L}\p{N}\s.,;:!?'"()\-+*/=%]/u.test(ch)).length;
  return ok / chars.length;
}

export default function score(req: ScoreRequest): ScoreResult {
  const candidate = req.response ?? req.prompt;
  const reference = req.ground_truth ?? req.prompt;
  const out: ScoreResult = {
    vlm_score: wordF1(candidate, reference),
    ocr_confidence: legibility(candidate),
    words: words(candidate).length,
  };
  // PNG: 8-byte signature, then the IHDR chunk (length, "IHDR", width, height — big-endian).
  if (req.image && req.image.length >= 24 && req.image.toString('latin1', 12, 16) === 'IHDR') {
    out.image_width = req.image.readUInt32BE(16);
    out.image_height = req.image.readUInt32BE(20);
  }
  return out;
}
