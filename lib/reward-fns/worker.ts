/**
 * The worker thread a function reward runs in (see function-worker.ts): loads the built-in or
 * the user module named by workerData, then answers one message per sample with its outcome.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { rewardFns, loadRewardModule, applyRewardFn, type RewardFn, type RewardInput } from './index.ts';
import { errorMessage } from '../errors.ts';

const spec = workerData as { path: string | null; name: string | null };
const port = parentPort!;
let fn: RewardFn | null = null;
try {
  fn = spec.path ? await loadRewardModule(spec.path, spec.name) : rewardFns.get(spec.name!);
  port.postMessage({ ready: true });
} catch (e) {
  port.postMessage({ loadError: errorMessage(e) });
}
port.on('message', (m: { seq: number; input: RewardInput }) => {
  void applyRewardFn(fn!, m.input).then(
    (outcome) => port.postMessage({ seq: m.seq, outcome }),
    (e: unknown) =>
      port.postMessage({ seq: m.seq, outcome: { ok: false, reason: `reward function failed: ${errorMessage(e)}` } }),
  );
});
