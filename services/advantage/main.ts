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
import { advantageScorers } from '../../lib/pipeline/advantage-scoring.ts';
import { memMark } from '../../lib/pipeline/mem-trace.ts';
import { loadStageState, saveStageState, PendingBatch } from '../../lib/pipeline/stage-state.ts';
import type { PolicyVersion, ScoredGroup } from '../../lib/contracts/index.ts';
import { ConfigError } from '../../lib/errors.ts';
import {
  advantageSettings,
  attachVppo,
  baselineRows,
  generatedImageRows,
  computeStep,
  estimatorRefusal,
  failureRows,
  initialAdvantageState,
  mustDefer,
  refillRequest,
  settle,
  stepBucket,
  stepDone,
  trajectoryRows,
  trimAdvantageState,
  type AdvantageState,
} from './logic.ts';

export function startAdvantage(p: Pipeline): StageRun {
  const refusal = estimatorRefusal(p.cfg.algorithm.adv_estimator);
  if (refusal) throw new ConfigError(refusal);
  const settings = advantageSettings(p.cfg);
  const scorers = advantageScorers(p.cfg, p.policies, p.runId);
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
    for (const r of fresh) touched.add((r.value as ScoredGroup).step);
    pending.add(
      fresh.map((r) => ({
        bucket: stepBucket((r.value as ScoredGroup).step),
        id: (r.value as ScoredGroup).id,
        payload: r.message.value,
        headers: r.message.headers,
      })),
    );
    const failures = failureRows(
      p.runId,
      fresh.map((r) => r.value as ScoredGroup),
      settings,
    );
    // groups with reward failures are never trained on: their samples are stored now (with the failure, so v_reward_failures shows them)
    if (failures.length) await p.store.insertTrajectories(failures, { tx: ctx.tx });
    for (const step of [...touched].sort((a, b) => a - b)) {
      const t0 = performance.now();
      const bucket = stepBucket(step);
      const items = await pending.items(bucket);
      const groups: ScoredGroup[] = [];
      for (const it of items) groups.push(await codec.decode(it.payload, it.headers));
      const refills = state.refills[step] ?? [];
      const decision = settle(groups, refills, settings);
      if (decision.kind === 'wait') continue;
      if (decision.kind === 'refill') {
        const request = refills.length + 1;
        state.refills[step] = [...refills, decision.needed];
        ctx.emit('control', refillRequest(p.runId, step, request, decision.needed, groups, settings, Date.now()));
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
      memMark('advantage:start', { step });
      const ref = await scorers.referenceLogprobs(decision.kept, ctx.db);
      memMark('advantage:reference-scored', { step });
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
      // an image policy's generated images, once by hash, before the rows that name them
      const generated = generatedImageRows(p.runId, res.updates);
      if (generated.length) await p.store.insertPromptImages(generated, { tx: ctx.tx });
      await p.store.insertTrajectories(
        [...res.updates.flatMap((u) => trajectoryRows(p.runId, u, step, rewardText, vppoPasses)), ...baselines],
        { tx: ctx.tx },
      );
      metrics.set(step, res.metrics);
      metrics.add(step, {}, { compute: performance.now() - t0 });
      stepDone(state, step, res.klValue, settings.klCoef);
      pending.settle(bucket);
      log.debug({ step, kept: decision.kept.length, filtered: decision.filtered.length }, 'advantages computed');
    }
    await metrics.flush(ctx);
    await ctx.flush();
    trimAdvantageState(state);
    await saveStageState(ctx.db, p.runId, 'advantage', state);
    // only after the state that marks the steps done (Kafka: a crash in between would lose their groups)
    await pending.persist();
  });
}
