/**
 * The glyphs example's reward function (reward.reward_fn_path) for `rlstream train
 * examples/glyphs/glyphs.yaml`: the generated image (the sample's PNG) scored by the recogniser
 * that examples/glyphs/run.ts trains and exports (reward.reward_fn_kwargs.recogniser: the path of
 * its recogniser.onnx). reward = ocr_confidence = the recogniser's probability of the requested
 * character (the row's answer); metrics: ocr_confidence, vlm_score (cleanliness: mean |pixel|,
 * 1 = pure black and white) and accuracy (the recogniser's top class is the requested one).
 */
import { readFileSync } from 'node:fs';
import type { InferenceSession } from 'onnxruntime-node';
import { pngToImage } from '../../lib/image/png.ts';
import { createSession, tensor } from '../../lib/onnx/runtime.ts';
import { CHARS } from './glyphs.ts';

const sessions = new Map<string, Promise<InferenceSession>>();

export default async function reward(a: {
  ground_truth: string;
  images?: Uint8Array[];
  kwargs: Record<string, unknown>;
}): Promise<{ reward: number; metrics: Record<string, number> }> {
  if (!a.images?.length) throw new Error('glyphs reward: the sample has no image (it scores an image policy)');
  const path = a.kwargs.recogniser;
  if (typeof path !== 'string')
    throw new Error('glyphs reward: set reward.reward_fn_kwargs.recogniser to the recogniser.onnx path');
  let session = sessions.get(path);
  if (!session) {
    session = createSession(readFileSync(path), { threads: 1 });
    sessions.set(path, session);
  }
  const { x, size } = await pngToImage(a.images[0], 1);
  const out = await (await session).run({ image: tensor('float32', x, [1, 1, size, size]) });
  const probs = out.probs.data as Float32Array;
  const c = CHARS.indexOf(a.ground_truth);
  if (c < 0 || c >= probs.length)
    throw new Error(`glyphs reward: "${a.ground_truth}" is not one of the recogniser's ${probs.length} characters`);
  let top = 0;
  for (let k = 1; k < probs.length; k++) if (probs[k] > probs[top]) top = k;
  const clean = x.reduce((s, v) => s + Math.abs(v), 0) / x.length;
  return {
    reward: probs[c],
    metrics: { ocr_confidence: probs[c], vlm_score: clean, accuracy: top === c ? 1 : 0 },
  };
}
