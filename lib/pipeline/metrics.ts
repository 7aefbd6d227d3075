/**
 * Stage metrics: accumulated per step in the stage, written to the store in the batch's
 * transaction, and published on the metrics topic for live consumers (the progress bar,
 * dashboards). Names are stable (`actor/pg_loss`, `reward/mean`, `timing/<stage>/<phase>_s`).
 *
 * Several replicas of a stage (two rollout processes) write the same names for the same step, so
 * every writer stores its own partial, keyed by (stage, replica), with how partials combine
 * (`metricAgg`): counters and tokens are summed, times take the slowest replica (max), rates
 * and fractions a weighted mean; the store's `step_metrics` view combines them on read
 * (migrations/20261122_0005_metric_parts.sql). Counters and timings are written as increments
 * since the last flush (added to the stored partial in the batch's transaction), never as this
 * process's running total, so a restarted stage adds to what was durably counted before the crash
 * instead of overwriting it with a smaller total. Metrics are only written, never read back by a
 * stage: they cannot influence training.
 */
import { metricsId, type Kind } from '../contracts/index.ts';
import type { MetricAgg, MetricRow } from '../store/port.ts';
import type { Pipeline, StageContext } from './runtime.ts';

interface StepAcc {
  kind: Kind;
  /** This process's running values (what the metrics topic carries). */
  values: Record<string, number>;
  timing: Record<string, number>;
  /** Not yet written: counter increments, timing increments (ms) and set values. */
  sums: Record<string, number>;
  timingMs: Record<string, number>;
  sets: Record<string, number>;
  dirty: boolean;
}

/**
 * How replicas' partials of a `set` value combine (counters from `add` are always summed and
 * timings take the max). Per-process totals (`*_total`, `reward/scored`, request counts and
 * rates, requests in flight) add up; latencies and breaker states take the worst replica; an
 * error rate is the mean weighted by that server's requests (`weightOf`); any other value is a
 * single writer's (`last`).
 */
export function metricAgg(name: string): MetricAgg {
  if (/(_total|\/requests_per_s|\/outstanding)$/.test(name)) return 'sum';
  if (/^reward\/(scored|failures|retries|remote_requests|remote_failures_total)$/.test(name)) return 'sum';
  if (/^perf\/.*tokens$/.test(name)) return 'sum';
  if (/(_ms|_s|\/breaker_open|\/breaker_half_open)$/.test(name)) return 'max';
  if (/\/error_rate$/.test(name)) return 'mean';
  return 'last';
}

/** The weight of a `mean` partial: `<server>/error_rate` is weighted by `<server>/requests_total`. */
export function weightOf(name: string, values: Readonly<Record<string, number>>): number {
  if (name.endsWith('/error_rate')) {
    const w = values[`${name.slice(0, -'/error_rate'.length)}/requests_total`];
    if (w !== undefined && Number.isFinite(w) && w >= 0) return w;
  }
  return 1;
}

/** The store rows of one step's pending changes (pure; see StageMetrics.flush). */
export function metricRows(
  runId: string,
  stage: string,
  replica: string,
  step: number,
  pending: { sums: Record<string, number>; timingMs: Record<string, number>; sets: Record<string, number> },
): MetricRow[] {
  const base = { runId, step, stage, replica };
  const rows: MetricRow[] = [];
  for (const [name, value] of Object.entries(pending.sets))
    rows.push({ ...base, name, value, agg: metricAgg(name), weight: weightOf(name, pending.sets) });
  for (const [name, value] of Object.entries(pending.sums))
    rows.push({ ...base, name, value, agg: 'sum', increment: true });
  let total = 0,
    busy = 0;
  for (const [phase, ms] of Object.entries(pending.timingMs)) {
    rows.push({ ...base, name: `timing/${stage}/${phase}_s`, value: ms / 1000, agg: 'max', increment: true });
    // the time a stage spent on the step: its phases, not the idle wait before it
    if (phase !== WAIT_PHASE) {
      total += ms;
      busy++;
    }
  }
  if (busy) rows.push({ ...base, name: `perf/step_time_s/${stage}`, value: total / 1000, agg: 'max', increment: true });
  return rows;
}

/** The phase name of a stage's idle time before a batch (`timing/<stage>/wait_s`); not part of perf/step_time_s. */
export const WAIT_PHASE = 'wait';

export class StageMetrics {
  private readonly steps = new Map<string, StepAcc>();
  /** The idle time before the current batch, not yet attributed to a step. */
  private pendingWaitMs: number | null = null;
  constructor(
    private readonly p: Pipeline,
    private readonly stage: string,
    private readonly replica = '',
  ) {}

  /** A batch begins after `waitedMs` idle (StageContext.waitedMs): logged as the wait phase of the batch's first step that gets timings. */
  beginBatch(waitedMs: number): void {
    this.pendingWaitMs = waitedMs;
  }

  /** Adds counters (summed, also across replicas) and phase timings in ms (summed; the slowest replica's total is the stage's) for a step. */
  add(step: number, sums: Record<string, number>, timingMs: Record<string, number> = {}, kind: Kind = 'train'): void {
    if (this.pendingWaitMs !== null && Object.keys(timingMs).length) {
      timingMs = { ...timingMs, [WAIT_PHASE]: this.pendingWaitMs };
      this.pendingWaitMs = null;
    }
    const a = this.acc(step, kind);
    for (const [k, v] of Object.entries(sums)) {
      a.values[k] = (a.values[k] ?? 0) + v;
      a.sums[k] = (a.sums[k] ?? 0) + v;
    }
    for (const [k, v] of Object.entries(timingMs)) {
      a.timing[k] = (a.timing[k] ?? 0) + v;
      a.timingMs[k] = (a.timingMs[k] ?? 0) + v;
    }
    a.dirty = true;
  }

  /** Sets values (last write wins for this writer; replicas combine by `metricAgg`) for a step. */
  set(step: number, values: Record<string, number>, kind: Kind = 'train'): void {
    const a = this.acc(step, kind);
    Object.assign(a.values, values);
    Object.assign(a.sets, values);
    a.dirty = true;
  }

  private acc(step: number, kind: Kind): StepAcc {
    const key = `${kind}:${step}`;
    let a = this.steps.get(key);
    if (!a) {
      a = { kind, values: {}, timing: {}, sums: {}, timingMs: {}, sets: {}, dirty: false };
      this.steps.set(key, a);
    }
    return a;
  }

  /**
   * Writes every changed step to the store and the metrics topic (through the batch context).
   * The pending increments are taken before writing: if the batch fails and is retried, its
   * transaction is rolled back and the retry adds them again.
   */
  async flush(ctx: StageContext, nowMs = Date.now()): Promise<void> {
    const rows: MetricRow[] = [];
    const observed: Array<[Kind, number, MetricRow[]]> = [];
    for (const [key, a] of this.steps) {
      if (!a.dirty) continue;
      a.dirty = false;
      const step = Number(key.slice(key.indexOf(':') + 1));
      const pending = { sums: a.sums, timingMs: a.timingMs, sets: a.sets };
      a.sums = {};
      a.timingMs = {};
      a.sets = {};
      const stepRows = metricRows(this.p.runId, this.stage, this.replica, step, pending).filter(
        (r) => a.kind === 'train' || r.name.startsWith('val/'),
      );
      rows.push(...stepRows);
      observed.push([a.kind, step, stepRows]);
      ctx.emit('metrics', {
        run_id: this.p.runId,
        id: metricsId(this.p.runId, this.stage + (this.replica ? `.${this.replica}` : ''), a.kind, step),
        step,
        policy_version: step,
        kind: a.kind,
        stage: this.stage,
        replica: this.replica,
        values: { ...a.values },
        timing_ms: { ...a.timing },
        time_ms: nowMs,
      });
    }
    if (rows.length) await this.p.store.insertMetrics(rows, { tx: ctx.tx });
    // live observers see the rows the store was given (counted again if the batch is retried: Prometheus counters are per process)
    for (const [kind, step, r] of observed) this.p.telemetry?.metricRows(this.stage, kind, step, r);
    // keep memory bounded: forget old steps (their totals are in the store)
    if (this.steps.size > 64)
      for (const k of [...this.steps.keys()].slice(0, this.steps.size - 64)) this.steps.delete(k);
  }
}
