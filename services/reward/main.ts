/**
 * Reward stage: scores trajectory groups with function rewards (built-in registry or a user
 * module), HTTP reward servers, or an in-process ONNX reward model, and publishes scored groups
 * (training → `scored`, validation → `validation`). A trajectory that cannot be scored is a
 * recorded failure, and reward.on_failure decides: retry (re-score the failed samples up to
 * reward.max_retries_later more rounds, backing off), drop_group (publish it with its failures;
 * the advantage stage filters it out and asks for a refill), or stop (the run fails with the
 * message naming the servers and errors; the group is still published with its failures, so
 * the log keeps it).
 */
import { forStage } from '../../lib/log.ts';
import { runStage, type Pipeline, type StageRun } from '../../lib/pipeline/runtime.ts';
import { StageMetrics } from '../../lib/pipeline/metrics.ts';
import { crashPoint } from '../../lib/pipeline/crash-points.ts';
import { rewardFns, parseExtraInfo } from '../../lib/reward-fns/index.ts';
import { FunctionRewardWorker, type FunctionRewardSpec } from '../../lib/reward-fns/function-worker.ts';
import { createPythonRewardBackend, isPythonRewardPath } from '../../lib/reward-fns/python-pool.ts';
import { createRemoteRewardClient, type RemoteRewardClient } from '../../lib/reward/http-client.ts';
import { createModelRewardScorer, type TokenRewardItem } from '../../lib/reward/onnx-scorer.ts';
import { tokenizerFor } from '../../lib/pipeline/policy.ts';
import { decideOnFailures } from '../../lib/reward/failure-policy.ts';
import { isRemoteRewardEnabled, type RewardOutcome } from '../../lib/reward/types.ts';
import { ConfigError } from '../../lib/errors.ts';
import type { TrajectoryGroup } from '../../lib/contracts/index.ts';
import { controlEvent, controlId } from '../../lib/contracts/index.ts';
import { rewardItems, samplesToScore, scoredGroup, failedSamples } from './logic.ts';

export interface RewardBackend {
  name: string;
  /** Items carry the trajectory's texts and its token ids; each backend uses what it needs. */
  score(items: TokenRewardItem[]): Promise<RewardOutcome[]>;
  /** Cumulative client gauges and counters (remote servers: `reward_server/<host:port>/…`). */
  metrics?(): Record<string, number>;
  close(): Promise<void>;
}

/**
 * The reward backend of `reward.type`. Remote servers are skipped when switched off
 * (`reward.remote.enabled: false`, or `DISABLE_RL_REWARD_MODEL=true` in this process's
 * environment — debug mode): rewards then come from the reward function.
 */
export async function createRewardBackend(
  p: Pipeline,
  replicaIndex: number,
  env: NodeJS.ProcessEnv = process.env,
): Promise<RewardBackend> {
  const r = p.cfg.reward;
  if (r.type === 'remote' && isRemoteRewardEnabled(r.remote, env)) {
    const client: RemoteRewardClient = createRemoteRewardClient(r.remote as never, {
      replicaIndex,
      log: forStage(p.log, 'reward'),
      env,
    });
    return {
      name: 'http:remote',
      score: (items) => client.scoreBatch(items),
      async close() {
        client.close();
      },
      // the client's reward/failures counts failed outcomes over the whole run; the stage's
      // per-step reward/failures (samples left without a reward) keeps that name
      metrics: () =>
        Object.fromEntries(
          Object.entries(client.metrics()).map(([k, v]) => [
            k === 'reward/failures' ? 'reward/remote_failures_total' : k,
            v,
          ]),
        ),
    };
  }
  if (r.type === 'model') {
    // the trajectories' own token ids are scored: pad with the run's tokenizer's pad unless the model declares its own
    const tok = tokenizerFor(p.cfg);
    const scorer = await createModelRewardScorer(r.model, { padId: tok.pad });
    const { vocabSize } = scorer.limits;
    if (vocabSize !== null && vocabSize !== tok.vocabSize) {
      forStage(p.log, 'reward').warn(
        { model: r.model.path, model_vocab_size: vocabSize, tokenizer_vocab_size: tok.vocabSize },
        `reward model ${r.model.path} declares a vocabulary of ${vocabSize} ids but the run's tokenizer (actor.model.tokenizer = ${p.cfg.actor.model.tokenizer}) has ${tok.vocabSize}: it was probably built for another tokenizer; ids ≥ ${vocabSize} fail to score`,
      );
    }
    return { name: `onnx:${r.model.path}`, score: (items) => scorer.scoreBatch(items), close: () => scorer.close() };
  }
  if (r.reward_fn_path && isPythonRewardPath(r.reward_fn_path)) {
    // a Python module: a pool of long-lived Python workers (lib/reward-fns/python-pool.ts)
    const log = forStage(p.log, 'reward');
    return createPythonRewardBackend({ ...r, reward_fn_path: r.reward_fn_path }, (m) => log.warn(m));
  }
  let fn: FunctionRewardSpec;
  let name: string;
  // remote servers switched off: the reward function (or data.task's reward, as the config loader fills it)
  const fnName =
    r.reward_fn ??
    (r.type === 'remote' && p.cfg.data.task !== null && rewardFns.has(p.cfg.data.task) ? p.cfg.data.task : null);
  if (r.reward_fn_path) {
    fn = { path: r.reward_fn_path, name: r.reward_fn_name };
    name = `fn:${r.reward_fn_path}`;
  } else if (fnName) {
    rewardFns.get(fnName);
    fn = { path: null, name: fnName };
    name = `fn:${fnName}`;
  } else if (r.type === 'remote') {
    throw new ConfigError(
      `reward.type = remote with the reward servers switched off (${r.remote.enabled === false ? 'reward.remote.enabled: false' : 'DISABLE_RL_REWARD_MODEL=true'}) needs a reward function: set reward.reward_fn (built-in: ${rewardFns.names().join(', ')}) or reward.reward_fn_path, or turn the servers back on`,
    );
  } else {
    fn = { path: null, name: 'exact_match' };
    name = 'fn:exact_match';
  }
  const kwargs = r.reward_fn_kwargs as Record<string, unknown>;
  // in a worker thread with reward.timeout_s per sample: a function that never returns cannot block the stage
  const worker = new FunctionRewardWorker(fn, r.timeout_s * 1000);
  await worker.start();
  return {
    name,
    async score(items) {
      const out: RewardOutcome[] = [];
      for (const it of items) {
        const o = await worker.score({
          prompt: it.prompt_text,
          response: it.response_text,
          ground_truth: it.ground_truth ?? '',
          data_source: it.data_source ?? '',
          extra_info: parseExtraInfo(it.extra_info),
          kwargs,
        });
        out.push(
          o.ok
            ? { id: it.id, ok: true, reward: o.reward, details: o.metrics, server: name }
            : { id: it.id, ok: false, reason: o.reason, retriable: false, server: name },
        );
      }
      return out;
    },
    close: () => worker.close(),
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function startReward(p: Pipeline, backend: RewardBackend, opts: { replica?: string } = {}): StageRun {
  const metrics = new StageMetrics(p, 'reward', opts.replica ?? '');
  const log = forStage(p.log, 'reward');
  const r = p.cfg.reward;
  return runStage(p, 'reward', ['trajectories'], async (records, ctx) => {
    metrics.beginBatch(ctx.waitedMs);
    crashPoint('reward:start');
    const t0 = performance.now();
    const groups = records.map((x) => x.value as TrajectoryGroup);
    const items = groups.flatMap(rewardItems);
    let outcomes = await backend.score(items);
    // retry: re-score failed samples a bounded number of rounds, backing off between rounds
    for (let round = 1; r.on_failure === 'retry' && round <= r.max_retries_later; round++) {
      const failed = outcomes.filter((o) => !o.ok);
      if (failed.length === 0 || ctx.signal.aborted) break;
      await sleep(Math.min(r.remote.backoff_max_ms, r.remote.backoff_initial_ms * 2 ** round));
      const again = await backend.score(items.filter((it) => failed.some((f) => f.id === it.id)));
      const byId = new Map(again.map((o) => [o.id, o]));
      outcomes = outcomes.map((o) => (!o.ok && byId.get(o.id)?.ok ? byId.get(o.id)! : o));
    }
    crashPoint('reward:scored');
    const byId = new Map(outcomes.map((o) => [o.id, o]));
    const scored = [];
    for (const g of groups) {
      const all = samplesToScore(g);
      const gOut = all.map((s) => byId.get(s.id)!).filter(Boolean);
      const decision = decideOnFailures(
        gOut,
        {
          group_id: g.id,
          expected_ids: all.map((s) => s.id),
          attempt: r.max_retries_later,
          max_attempts: r.max_retries_later,
        },
        r.on_failure,
      );
      if (decision.action === 'stop') {
        ctx.emit(
          'control',
          controlEvent(
            'run_failed',
            { stage: 'reward', code: 'ERR_REWARD', message: `reward.on_failure = stop: ${decision.message}` },
            {
              run_id: p.runId,
              id: controlId(
                p.runId,
                'run_failed',
                `reward.${g.id.slice(p.runId.length + 1).replace(/[^A-Za-z0-9._-]/g, '.')}`,
              ),
              step: g.step,
              policy_version: g.policy_version,
              time_ms: Date.now(),
            },
          ),
        );
        log.error({ group: g.id }, `reward.on_failure = stop: ${decision.message}`);
      }
      const sg = scoredGroup(g, gOut, backend.name, r.on_failure === 'retry' ? r.max_retries_later + 1 : 1);
      scored.push(sg);
      ctx.emit(g.kind === 'val' ? 'validation' : 'scored', sg);
    }
    const train = scored.filter((g) => g.kind === 'train');
    const client = backend.metrics?.();
    for (const step of new Set(train.map((g) => g.step))) {
      metrics.add(
        step,
        { 'reward/failures': failedSamples(train.filter((g) => g.step === step)) },
        { compute: performance.now() - t0 },
      );
      if (client) metrics.set(step, client);
    }
    log.debug({ groups: groups.length, ms: Math.round(performance.now() - t0) }, 'scored');
    await metrics.flush(ctx);
  });
}
