/**
 * Stage metrics: accumulated per step in the stage, written to the store (upsert by run, step,
 * name — the cumulative value wins) in the batch's transaction, and published on the metrics
 * topic for live consumers (the progress bar, dashboards). Names are stable (`actor/pg_loss`,
 * `reward/mean`, `timing/<stage>/<phase>_s`).
 */
import { metricsId, type Kind } from '../contracts/index.ts';
import type { Pipeline, StageContext } from './runtime.ts';

interface StepAcc { kind: Kind; values: Record<string, number>; timing: Record<string, number>; dirty: boolean }

export class StageMetrics {
  private readonly steps = new Map<string, StepAcc>();
  constructor(private readonly p: Pipeline, private readonly stage: string, private readonly replica = '') {}

  /** Adds counters (summed) and phase timings in ms (summed) for a step. */
  add(step: number, sums: Record<string, number>, timingMs: Record<string, number> = {}, kind: Kind = 'train'): void {
    const a = this.acc(step, kind);
    for (const [k, v] of Object.entries(sums)) a.values[k] = (a.values[k] ?? 0) + v;
    for (const [k, v] of Object.entries(timingMs)) a.timing[k] = (a.timing[k] ?? 0) + v;
    a.dirty = true;
  }

  /** Sets values (last write wins) for a step. */
  set(step: number, values: Record<string, number>, kind: Kind = 'train'): void {
    const a = this.acc(step, kind);
    Object.assign(a.values, values);
    a.dirty = true;
  }

  private acc(step: number, kind: Kind): StepAcc {
    const key = `${kind}:${step}`;
    let a = this.steps.get(key);
    if (!a) { a = { kind, values: {}, timing: {}, dirty: false }; this.steps.set(key, a); }
    return a;
  }

  /** Writes every changed step to the store and the metrics topic (through the batch context). */
  async flush(ctx: StageContext, nowMs = Date.now()): Promise<void> {
    for (const [key, a] of this.steps) {
      if (!a.dirty) continue;
      a.dirty = false;
      const step = Number(key.slice(key.indexOf(':') + 1));
      const rows = Object.entries(a.values).map(([name, value]) => ({ runId: this.p.runId, step, name, value, stage: this.stage }));
      let total = 0;
      for (const [phase, ms] of Object.entries(a.timing)) {
        rows.push({ runId: this.p.runId, step, name: `timing/${this.stage}/${phase}_s`, value: ms / 1000, stage: this.stage });
        total += ms;
      }
      if (Object.keys(a.timing).length) rows.push({ runId: this.p.runId, step, name: `perf/step_time_s/${this.stage}`, value: total / 1000, stage: this.stage });
      const finite = rows.filter((r) => a.kind === 'train' || r.name.startsWith('val/'));
      if (finite.length) await this.p.store.insertMetrics(finite, { tx: ctx.tx });
      ctx.emit('metrics', {
        run_id: this.p.runId, id: metricsId(this.p.runId, this.stage + (this.replica ? `.${this.replica}` : ''), a.kind, step), step, policy_version: step,
        kind: a.kind, stage: this.stage, replica: this.replica, values: { ...a.values }, timing_ms: { ...a.timing }, time_ms: nowMs,
      });
    }
    // keep memory bounded: forget old steps
    if (this.steps.size > 64) for (const k of [...this.steps.keys()].slice(0, this.steps.size - 64)) this.steps.delete(k);
  }
}
