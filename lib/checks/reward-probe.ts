/**
 * The run's function reward, opened outside a run to call it on chosen responses (`rlstream check
 * data`: the ground truths and empty responses): the same function the reward stage would load —
 * a Python module in the Python pool, a JS/TS module or built-in in its worker thread — with
 * reward.timeout_s and reward.reward_fn_kwargs. HTTP servers and ONNX reward models are not
 * probed (null with the reason).
 */
import type { Config } from '../config/index.ts';
import { FunctionRewardWorker } from '../reward-fns/function-worker.ts';
import { rewardFns } from '../reward-fns/index.ts';
import { PythonRewardPool, isPythonRewardPath } from '../reward-fns/python-pool.ts';
import { isRemoteRewardEnabled } from '../reward/types.ts';

export interface ProbeInput {
  prompt: string;
  response: string;
  ground_truth: string;
  data_source?: string;
  extra_info?: Record<string, unknown>;
  images?: Uint8Array[];
}

export type ProbeOutcome =
  { ok: true; reward: number; metrics: Record<string, number | string> } | { ok: false; reason: string };

export interface RewardProbe {
  /** What is called, e.g. `python score.py:compute_score (verl)` or `built-in gsm8k`. */
  name: string;
  score(inputs: ProbeInput[]): Promise<ProbeOutcome[]>;
  close(): Promise<void>;
}

/** The probe, or `{ skipped }` saying why the reward is not a function here. Throws (ConfigError) when it cannot start. */
export async function openRewardProbe(
  cfg: Config,
  opts: { warn?: (m: string) => void; stderr?: (line: string) => void; env?: NodeJS.ProcessEnv } = {},
): Promise<RewardProbe | { skipped: string }> {
  const r = cfg.reward;
  if (r.type === 'model') return { skipped: `reward.type = model (the ONNX reward model ${r.model.path})` };
  if (r.type === 'remote' && isRemoteRewardEnabled(r.remote, opts.env ?? process.env))
    return { skipped: 'reward.type = remote (HTTP reward servers)' };
  const kwargs = r.reward_fn_kwargs as Record<string, unknown>;
  if (r.reward_fn_path && isPythonRewardPath(r.reward_fn_path)) {
    const pool = new PythonRewardPool({
      path: r.reward_fn_path,
      name: r.reward_fn_name,
      form: r.reward_fn_form,
      python: r.python,
      workers: 1,
      timeoutS: r.timeout_s,
      kwargs,
      warn: opts.warn,
      stderr: opts.stderr,
    });
    await pool.start();
    return {
      name: `python ${r.reward_fn_path}:${r.reward_fn_name ?? 'compute_score'} (${r.reward_fn_form}, Python ${pool.pythonVersion})`,
      score: (inputs) => pool.score(inputs),
      close: () => pool.close(),
    };
  }
  const builtIn =
    r.reward_fn ?? (cfg.data.task !== null && rewardFns.has(cfg.data.task) ? cfg.data.task : 'exact_match');
  const spec = r.reward_fn_path ? { path: r.reward_fn_path, name: r.reward_fn_name } : { path: null, name: builtIn };
  const worker = new FunctionRewardWorker(spec, r.timeout_s * 1000);
  await worker.start();
  return {
    name: r.reward_fn_path ? `module ${r.reward_fn_path}` : `built-in ${builtIn}`,
    async score(inputs) {
      const out: ProbeOutcome[] = [];
      for (const x of inputs)
        out.push(
          await worker.score({
            prompt: x.prompt,
            response: x.response,
            ground_truth: x.ground_truth,
            data_source: x.data_source ?? '',
            extra_info: x.extra_info ?? {},
            kwargs,
          }),
        );
      return out;
    },
    close: () => worker.close(),
  };
}
