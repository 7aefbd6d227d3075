/**
 * What a stage process reports about itself while it runs, for live observers (the Prometheus
 * endpoint of `rlstream serve`, lib/metrics/prometheus.ts). It is fed from the values the stages
 * already produce — the metric rows StageMetrics writes to the store (same numbers, same names),
 * the batches runStage hands to a stage, the errors and dead letters it sees — never from a
 * second bookkeeping. A process without observers uses NO_TELEMETRY.
 */
import type { Kind } from '../contracts/index.ts';
import type { MetricRow } from '../store/port.ts';

export type ErrorKind = 'retriable' | 'fatal' | 'poison';

export interface Telemetry {
  /** A batch a stage handled (committed or about to be): its records and the samples they carry. */
  batch(stage: string, records: number, samples: number): void;
  /** A batch that failed: retried (retriable), split and retried per message (fatal), or an undecodable message (poison). */
  error(stage: string, kind: ErrorKind): void;
  /** A message a stage dead-lettered. */
  deadLetter(stage: string): void;
  /** The metric rows of one step as StageMetrics writes them to the store (set values, counter and timing increments). */
  metricRows(stage: string, kind: Kind, step: number, rows: readonly MetricRow[]): void;
  /** The policy version a stage now works with (update: published; rollout: sampling with). */
  policyVersion(stage: string, version: number): void;
}

export const NO_TELEMETRY: Telemetry = {
  batch() {},
  error() {},
  deadLetter() {},
  metricRows() {},
  policyVersion() {},
};
