/**
 * Advantage stage: collects each training step's scored groups (durably, in stage_pending, so a
 * crash loses nothing), filters them (reward failures, online filtering) and asks the controller
 * for refills until rollout_batch_size groups are kept, computes reference log-probs with the
 * frozen initial policy (v0) when KL is used, the advantages with the configured estimator, and
 * publishes update groups (kept and filtered, flagged). With algorithm.vppo.enable it scores the
 * kept samples again with real and perturbed prompt images (lib/pipeline/vppo.ts) and attaches
 * VPPO's token masks and trajectory scaling factors (attachVppo). It writes every trajectory of
 * the step to the store, exactly once.
 */
import { forStage } from '../../lib/log.ts';
import { runStage, type Pipeline, type StageRun } from '../../lib/pipeline/runtime.ts';
import { StageMetrics } from '../../lib/pipeline/metrics.ts';
import { crashPoint } from '../../lib/pipeline/crash-points.ts';
import { readCheckpointPath } from '../../lib/pipeline/checkpoints.ts';
import { AdvantageScorers } from '../../lib/pipeline/advantage-scoring.ts';
import { loadStageState, saveStageState, PendingBatch } from '../../lib/pipeline/stage-state.ts';
import {
  controlEvent,
  refillId,
  type PolicyVersion,
  type ScoredGroup,
  type UpdateGroup,
} from '../../lib/contracts/index.ts';
import { sampleRow } from '../../lib/pipeline/rows.ts';
import type { TrajectoryRow } from '../../lib/store/port.ts';
import type { Config } from '../../lib/config/index.ts';
import { ConfigError } from '../../lib/errors.ts';
import type { VppoScores } from '../../lib/pipeline/vppo.ts';
import {
  settle,
  computeStep,
  attachVppo,
  filterReason,
  mustDefer,
  shortfallReason,
  initialAdvantageState,
  type AdvantageSettings,
  type AdvantageState,
} from './logic.ts';

export function advantageSettings(cfg: Config): AdvantageSettings {
  const a = cfg.algorithm;
  return {
    rolloutBatchSize: cfg.data.rollout_batch_size,
    estimator: a.adv_estimator,
    gamma: a.gamma,
    lam: a.lam,
    normAdvByStd: a.norm_adv_by_std_in_grpo,
    onlineFiltering: a.online_filtering,
    filterSemantics: a.filter_semantics,
    filterKey: a.filter_key,
    filterLow: a.filter_low,
    filterHigh: a.filter_high,
    overlong: {
      enable: a.overlong.enable,
      maxLength: a.overlong.max_length ?? cfg.data.max_response_length,
      bufferLength: a.overlong.buffer_length,
      penaltyFactor: a.overlong.penalty_factor,
    },
    useKlInReward: a.use_kl_in_reward,
    klPenalty: a.kl_penalty,
    klType: a.kl_type,
    klCoef: a.kl_coef,
    klTarget: a.kl_target,
    klHorizon: a.kl_horizon,
  };
}

/**
 * `vppo`: what the stage's VPPO passes computed besides the update — log π_old with the real image
 * (trajectories.old_logprobs) and, with entropy filtering, the token entropies (vppo_entropies).
 */
function trajectoryRows(
  runId: string,
  u: UpdateGroup,
  step: number,
  rewardText: ReadonlyMap<string, Record<string, string>>,
  vppo: VppoScores | null,
): TrajectoryRow[] {
  return u.samples.map((x) =>
    sampleRow(runId, u, x, rewardText.get(x.id), {
      step,
      refLogprobs: x.ref_logprobs.length ? x.ref_logprobs : null,
      oldLogprobs: vppo?.old.get(x.id) ?? null,
      advantages: u.filtered ? null : x.advantages,
      advantage: u.filtered || x.advantages.length === 0 ? null : x.advantages[0],
      returns: u.filtered ? null : x.returns,
      filtered: u.filtered,
      filterReason: u.filter_reason,
      staleness: Math.max(0, step - 1 - u.policy_version),
      vppoPerturbedLogprobs: x.vppo?.perturbed_logprobs ?? null,
      vppoTokenMask: x.vppo ? x.vppo.token_mask : null,
      vppoScalingFactor: x.vppo?.scaling_factor ?? null,
      vppoEntropies: (x.vppo && vppo?.perturbed.get(x.id)?.entropies) ?? null,
    }),
  );
}

/**
 * The remax greedy baselines of the step's groups as trajectory rows: stored for analysis (reward,
 * tokens), flagged filtered with a reason saying what they are, since they are never trained on.
 */
export function baselineRows(runId: string, groups: readonly ScoredGroup[], step: number): TrajectoryRow[] {
  return groups.flatMap((g) =>
    (g.baseline ? [g.baseline] : []).map((x) =>
      sampleRow(runId, g, x, x.reward_text, {
        step,
        filtered: true,
        filterReason: BASELINE_REASON,
        staleness: Math.max(0, step - 1 - g.policy_version),
      }),
    ),
  );
}

/** filter_reason of a stored remax baseline trajectory. */
export const BASELINE_REASON =
  'remax greedy baseline (temperature 0): its reward is the baseline of the group; never trained on';

/** Estimators whose extra inputs the pipeline does not produce yet, and what they need. */
const NOT_IN_PIPELINE: Record<string, string> = {
  optimal_token_baseline: 'Σπ² per position from full distributions (sum_pi_squared)',
  tir_optimal_token_baseline: 'Σπ² per position from full distributions (sum_pi_squared)',
};

export function startAdvantage(p: Pipeline): StageRun {
  const need = NOT_IN_PIPELINE[p.cfg.algorithm.adv_estimator];
  if (need)
    throw new ConfigError(
      `algorithm.adv_estimator = ${p.cfg.algorithm.adv_estimator} is in lib/rl but the pipeline does not compute its extra input yet: ${need}; use grpo, grpo_vectorized, grpo_passk, rloo, rloo_vectorized, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, opo, gpg or gae`,
    );
  const settings = advantageSettings(p.cfg);
  const scorers = new AdvantageScorers(p.cfg, p.policies, p.runId);
  const metrics = new StageMetrics(p, 'advantage');
  const log = forStage(p.log, 'advantage');
  const codec = p.codecs.scored;
  // a run started from trainer.load_checkpoint_path carries over the checkpoint's KL controller value
  const fromCheckpoint = p.cfg.trainer.load_checkpoint_path
    ? readCheckpointPath(p.cfg.trainer.load_checkpoint_path).state
    : null;
  const initialKl =
    fromCheckpoint && settings.useKlInReward && settings.klType === 'adaptive'
      ? Number(fromCheckpoint.kl_ctl_state.value)
      : null;
  // scoring with the weights that generated a step (VPPO, the critic) waits for that version's announcement
  const needsVersion = scorers.needsVersion;
  return runStage(p, 'advantage', needsVersion ? ['scored', 'policy'] : ['scored'], async (records, ctx) => {
    metrics.beginBatch(ctx.waitedMs);
    const state = (await loadStageState<AdvantageState>(ctx.db, p.runId, 'advantage')) ?? {
      ...initialAdvantageState(),
      klValue: initialKl,
    };
    for (const r of records)
      if (r.topic === 'policy')
        state.policySeen = Math.max(state.policySeen ?? -1, (r.value as PolicyVersion).policy_version);
    const pending = new PendingBatch(ctx.db, p.runId, 'advantage');
    const touched = new Set<number>(state.deferred ?? []);
    state.deferred = [];
    const fresh = records.filter((r) => r.topic === 'scored' && !state.done.includes((r.value as ScoredGroup).step));
    pending.add(
      fresh.map((r) => {
        const g = r.value as ScoredGroup;
        touched.add(g.step);
        return {
          bucket: `step:${String(g.step).padStart(8, '0')}`,
          id: g.id,
          payload: r.message.value,
          headers: r.message.headers,
        };
      }),
    );
    // groups with reward failures are never trained on: store their samples now (with the
    // failure, so v_reward_failures shows them) rather than when the step settles — a run that
    // stops because its rewards keep failing never settles the step
    const failedGroups = fresh
      .map((r) => r.value as ScoredGroup)
      .filter((g) => g.samples.some((x) => x.failure) || g.baseline?.failure);
    if (failedGroups.length) {
      await p.store.insertTrajectories(
        [
          ...failedGroups.flatMap((g) =>
            g.samples.map((x) =>
              sampleRow(p.runId, g, x, x.reward_text, {
                step: g.step,
                filtered: true,
                filterReason: filterReason(g, settings),
                staleness: Math.max(0, g.step - 1 - g.policy_version),
              }),
            ),
          ),
          ...failedGroups.flatMap((g) => baselineRows(p.runId, [g], g.step)),
        ],
        { tx: ctx.tx },
      );
    }
    for (const step of [...touched].sort((a, b) => a - b)) {
      const t0 = performance.now();
      const bucket = `step:${String(step).padStart(8, '0')}`;
      const items = await pending.items(bucket);
      const groups: ScoredGroup[] = [];
      for (const it of items) groups.push(await codec.decode(it.payload, it.headers));
      const refills = state.refills[step] ?? [];
      const decision = settle(groups, refills, settings);
      if (decision.kind === 'wait') continue;
      if (decision.kind === 'refill') {
        const request = refills.length + 1;
        state.refills[step] = [...refills, decision.needed];
        ctx.emit(
          'control',
          controlEvent(
            'refill_request',
            {
              request,
              needed: decision.needed,
              filtered_group_ids: groups.map((g) => g.id),
              reason: shortfallReason(groups, settings),
            },
            {
              run_id: p.runId,
              id: refillId(p.runId, step, request),
              step,
              policy_version: groups[0]?.policy_version ?? 0,
              time_ms: Date.now(),
            },
          ),
        );
        log.info({ step, needed: decision.needed, request }, 'asking the controller for more prompts');
        continue;
      }
      if (
        needsVersion &&
        mustDefer(
          decision.kept.map((g) => g.policy_version),
          state.policySeen ?? -1,
          state.deferred.length > 0,
        )
      ) {
        state.deferred.push(step);
        log.debug(
          { step, policy_seen: state.policySeen ?? null },
          'waiting for the policy version that generated the step',
        );
        continue;
      }
      crashPoint('advantage:start');
      const ref = await scorers.referenceLogprobs(decision.kept, ctx.db);
      const values = await scorers.values(decision.kept, ctx.db);
      const res = computeStep(decision.kept, decision.filtered, ref, settings, state.klValue, values);
      const vppoPasses = await scorers.vppoPasses(decision.kept, ctx.db);
      if (vppoPasses) {
        const v = attachVppo(res.updates, vppoPasses.perturbed, scorers.vppo!.stage, vppoPasses.old);
        res.updates = v.updates;
        Object.assign(res.metrics, v.metrics);
      }
      crashPoint('advantage:computed');
      for (const u of res.updates) ctx.emit('updates', u);
      const scoredGroups = [...decision.kept, ...decision.filtered.map((f) => f.group)];
      const baselines = baselineRows(p.runId, scoredGroups, step);
      const rewardText = new Map(scoredGroups.flatMap((g) => g.samples.map((x) => [x.id, x.reward_text] as const)));
      await p.store.insertTrajectories(
        [...res.updates.flatMap((u) => trajectoryRows(p.runId, u, step, rewardText, vppoPasses)), ...baselines],
        { tx: ctx.tx },
      );
      metrics.set(step, res.metrics);
      metrics.add(step, {}, { compute: performance.now() - t0 });
      state.klValue = res.klValue;
      state.klByStep = { ...(state.klByStep ?? {}), [String(step)]: res.klValue ?? settings.klCoef };
      state.done.push(step);
      delete state.refills[step];
      pending.settle(bucket);
      log.debug({ step, kept: decision.kept.length, filtered: decision.filtered.length }, 'advantages computed');
    }
    await metrics.flush(ctx);
    await ctx.flush();
    if (state.done.length > 256) state.done = state.done.slice(-256);
    if (state.klByStep)
      state.klByStep = Object.fromEntries(
        Object.entries(state.klByStep)
          .sort((a, b) => Number(a[0]) - Number(b[0]))
          .slice(-64),
      );
    await saveStageState(ctx.db, p.runId, 'advantage', state);
    // only after the state that marks the steps done (Kafka: a crash in between would lose their groups)
    await pending.persist();
  });
}
