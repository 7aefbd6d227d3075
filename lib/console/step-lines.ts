/**
 * One log line per trained step for `rlstream train` off a terminal (the progress bar's place):
 * the step's train metrics of every stage are gathered from the metrics topic, and when the update
 * stage's record of step s arrives (it trains after rollout, reward and advantage reported s) the
 * line for s is made: reward, accuracy, KL, entropy, response length and the wall time since the
 * previous step's line.
 */
import type { MetricsRecord } from '../contracts/index.ts';

/** The metrics a step line shows, by their stable names (the first present of each list). */
export const STEP_LINE_METRICS: ReadonlyArray<[label: string, names: readonly string[]]> = [
  ['reward', ['reward/mean']],
  ['accuracy', ['reward/accuracy']],
  ['kl', ['kl/mean', 'actor/kl_loss']],
  ['entropy', ['actor/entropy']],
  ['response_length', ['response_length/mean']],
];

export interface StepLine {
  step: number;
  fields: Record<string, number>;
  text: string;
}

export class StepLines {
  private readonly values = new Map<number, Record<string, number>>();
  private readonly done = new Set<number>();
  private lastMs: number;

  constructor(
    private readonly totalSteps: () => number,
    startMs: number,
  ) {
    this.lastMs = startMs;
  }

  /** Takes one metrics record; returns the line of the step it completes, if any. */
  add(r: MetricsRecord, nowMs: number): StepLine | null {
    if (r.kind !== 'train' || this.done.has(r.step)) return null;
    const v = this.values.get(r.step) ?? {};
    Object.assign(v, r.values);
    this.values.set(r.step, v);
    if (r.stage !== 'update') return null;
    this.values.delete(r.step);
    this.done.add(r.step);
    const fields: Record<string, number> = {};
    for (const [label, names] of STEP_LINE_METRICS) {
      const name = names.find((n) => v[n] !== undefined);
      if (name) fields[label] = v[name];
    }
    fields.step_time_s = (nowMs - this.lastMs) / 1000;
    this.lastMs = nowMs;
    const shown = Object.entries(fields).map(([k, x]) =>
      k === 'step_time_s' ? `step time ${x.toFixed(2)} s` : `${k.replace('_', ' ')} ${fmt(x)}`,
    );
    return { step: r.step, fields, text: `step ${r.step}/${this.totalSteps()}: ${shown.join(', ')}` };
  }
}

function fmt(x: number): string {
  if (!Number.isFinite(x)) return String(x);
  return Math.abs(x) >= 100 ? x.toFixed(1) : Math.abs(x) >= 0.01 || x === 0 ? x.toFixed(3) : x.toExponential(2);
}
