/**
 * Controller stage: reads the datasets, and turns policy versions, refill requests and scored
 * validation groups into prompt batches, validation rounds and the run's lifecycle events
 * (decide logic in ./logic.ts). Its state is saved with each batch it processes, so a restarted
 * controller continues where it was.
 */
import { forStage } from '../../lib/log.ts';
import { runStage, type Pipeline, type StageContext, type StageRun } from '../../lib/pipeline/runtime.ts';
import { StageMetrics } from '../../lib/pipeline/metrics.ts';
import { loadStageState, saveStageState } from '../../lib/pipeline/stage-state.ts';
import { planFromConfig, stepCapNotice, stepsPerEpoch } from '../../lib/pipeline/plan.ts';
import { startStepFromCheckpoint } from '../../lib/pipeline/checkpoints.ts';
import type { RunData } from '../../lib/pipeline/data.ts';
import { dataNotes } from '../../lib/pipeline/data.ts';
import type { PromptImageRow, TrajectoryRow } from '../../lib/store/index.ts';
import type {
  ControlEventOf,
  ControlPayloads,
  ControlType,
  ControlEvent,
  PolicyVersion,
  PromptBatch,
  ScoredGroup,
} from '../../lib/contracts/index.ts';
import {
  addValGroup,
  controllerEvent,
  decide,
  initialState,
  promptBatch,
  totalSteps,
  valRoundResult,
  valRoundRows,
  valTrajectoryRows,
  type ControllerCommand,
  type ControllerEvent,
  type ControllerState,
  type PromptRef,
  type ValRound,
} from './logic.ts';

export interface ControllerStageState {
  ctl: ControllerState;
  started: boolean;
  val: Record<string, ValRound>;
}

/** `replay`: validation rounds only, as a replay's policy versions appear (app/replay.ts). */
export function startController(p: Pipeline, data: RunData, opts: { replay?: boolean } = {}): StageRun {
  const cfg = p.cfg;
  const plan = {
    ...planFromConfig(cfg, p.runId, data.train.length, data.val.length),
    replayValidation: opts.replay === true,
  };
  const metrics = new StageMetrics(p, 'controller');
  const log = forStage(p.log, 'controller');
  // a run started from trainer.load_checkpoint_path continues after the checkpoint's step (same dataset position)
  const start = startStepFromCheckpoint(cfg.trainer.load_checkpoint_path, plan);
  for (const note of dataNotes(data, cfg)) log.warn({ dropped: data.dropped }, note);
  const capped = stepCapNotice(plan);
  if (capped) log.warn({ max_steps: plan.maxSteps, total_epochs: plan.totalEpochs, steps: totalSteps(plan) }, capped);
  const control = <T extends ControlType>(
    type: T,
    step: number,
    version: number,
    payload: ControlPayloads[T],
    detail?: string,
  ): ControlEventOf<T> => controllerEvent(p.runId, type, step, version, payload, Date.now(), detail);

  // a prompt's images go to prompt_images (once per run: the store skips those it has) in the
  // transaction that emits the prompt, so a trajectory's image_hashes always find their rows
  let batchImages: PromptImageRow[] = [];
  const withImages = data.train.some((r) => r.images.length > 0) || data.val.some((r) => r.images.length > 0);
  if (withImages && !data.visionPolicy)
    log.warn(
      'images are stored but the policy is text-only: prompts carry their images (prompt_images, trajectories.image_hashes), the model does not see them',
    );

  /** One prompt batch of `refs`; its prompts' images are stored with the batch's outputs. */
  function batchOf(
    kind: 'train' | 'val',
    step: number,
    epoch: number,
    attempt: number,
    version: number,
    refs: PromptRef[],
  ): PromptBatch {
    const { batch, images } = promptBatch(cfg, p.runId, data, { kind, step, epoch, attempt, version }, refs);
    batchImages.push(...images);
    return batch;
  }

  /** A complete validation round: its metrics and generations stored, val_round_done published, a line logged. */
  async function finishValRound(version: number, round: ValRound, ctx: StageContext): Promise<void> {
    const { values, level, message } = valRoundResult(round, version);
    metrics.set(version, values, 'val');
    const rows = valRoundRows(p.runId, version, values, round);
    await p.store.insertMetrics(rows.metrics, { tx: ctx.tx });
    await p.store.recordValGenerations(rows.generations, { tx: ctx.tx });
    const done = {
      round: version,
      groups: round.groups.length,
      samples: round.n + round.failures,
      failures: round.failures,
    };
    ctx.emit('control', control('val_round_done', version, version, done, String(version)));
    log[level]({ version, ...values }, message);
  }

  return runStage(p, 'controller', ['policy', 'control', 'validation'], async (records, ctx) => {
    batchImages = [];
    const st: ControllerStageState = (await loadStageState<ControllerStageState>(ctx.db, p.runId, 'controller')) ?? {
      ctl: { ...initialState(), emittedStep: start.step },
      started: false,
      val: {},
    };
    if (!st.started) {
      st.started = true;
      ctx.emit(
        'control',
        control('run_started', start.step, start.step, {
          config_json: '{}',
          config_sha256: '',
          seed: cfg.data.seed,
          total_steps: totalSteps(plan),
          steps_per_epoch: stepsPerEpoch(plan),
          resumed_from: start.state ? start.state.run_id : null,
        }),
      );
      log.info(
        { train: data.train.length, val: data.val.length, steps: totalSteps(plan), dropped: data.dropped },
        'run started',
      );
    }
    const events: ControllerEvent[] = [];
    const valTrajectories: TrajectoryRow[] = [];
    for (const r of records) {
      if (r.topic === 'policy') {
        const v = r.value as PolicyVersion;
        events.push({
          type: 'policy',
          policy: { version: v.policy_version, step: v.step, path: v.checkpoint_path, sha256: v.sha256 },
        });
      } else if (r.topic === 'control') {
        const c = r.value as ControlEvent;
        if (c.type === 'refill_request')
          events.push({
            type: 'refill',
            step: c.step,
            needed: c.refill_request.needed,
            request: c.refill_request.request,
            reason: c.refill_request.reason,
          });
        // rlstream train publishes run_started again when it extends a finished run
        if (c.type === 'run_started' && st.ctl.done) events.push({ type: 'extend' });
      } else if (r.topic === 'validation') {
        const g = r.value as ScoredGroup;
        const round = addValGroup(st.val, g, cfg.trainer.val_generations_to_log);
        if (!round) continue;
        valTrajectories.push(...valTrajectoryRows(p.runId, g));
        if (round.groups.length === data.val.length) {
          await finishValRound(g.step, round, ctx);
          delete st.val[String(g.step)];
          events.push({ type: 'val_done', version: g.step });
        }
      }
    }
    // every validation sample lands in the store too, in one write per batch (write-once by id:
    // a redelivery is a no-op; Kafka: before the batch's outputs are flushed)
    if (valTrajectories.length) await p.store.insertTrajectories(valTrajectories, { tx: ctx.tx });
    const commands: ControllerCommand[] = [];
    for (const e of events) {
      const r = decide(plan, st.ctl, e);
      st.ctl = r.state;
      commands.push(...r.commands);
    }
    for (const c of commands) {
      if (c.type === 'train_prompts') {
        if (c.attempt === 0 && (c.step - 1) % stepsPerEpoch(plan) === 0)
          ctx.emit(
            'control',
            control('epoch_started', c.step, c.policy.version, { epoch: c.epoch, first_step: c.step }, String(c.epoch)),
          );
        for (const ref of c.prompts)
          ctx.emit('prompts', batchOf('train', c.step, c.epoch, c.attempt, c.policy.version, [ref]));
      } else if (c.type === 'val_prompts') {
        const size = cfg.data.val_batch_size > 0 ? cfg.data.val_batch_size : c.prompts.length;
        for (let i = 0; i < c.prompts.length; i += size)
          ctx.emit('prompts', batchOf('val', c.version, 0, 0, c.version, c.prompts.slice(i, i + size)));
      } else if (c.type === 'run_done') {
        // one run_done per final version: an extended run ends with a second one
        ctx.emit(
          'control',
          control(
            'run_done',
            c.finalVersion,
            c.finalVersion,
            { final_version: c.finalVersion, steps: totalSteps(plan) },
            String(c.finalVersion),
          ),
        );
        await p.store.setRunStatus(p.runId, 'completed', undefined, { tx: ctx.tx });
        log.info({ finalVersion: c.finalVersion }, 'run done');
      } else if (c.type === 'fail') {
        ctx.emit(
          'control',
          control('run_failed', st.ctl.emittedStep, st.ctl.latest?.version ?? 0, {
            stage: 'controller',
            code: 'ERR_CONTROLLER',
            message: c.message,
          }),
        );
        await p.store.setRunStatus(p.runId, 'failed', { error: c.message }, { tx: ctx.tx });
        log.error(c.message);
      }
    }
    if (batchImages.length) {
      const images = batchImages;
      batchImages = [];
      await p.store.insertPromptImages(images, { tx: ctx.tx });
    }
    await metrics.flush(ctx);
    await ctx.flush();
    await saveStageState(ctx.db, p.runId, 'controller', st);
  });
}
