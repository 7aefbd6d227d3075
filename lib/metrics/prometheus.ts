/**
 * The Prometheus metrics of one `rlstream serve` process (prom-client), labelled with `run_id` and
 * `stage`. They are fed through the Telemetry port (lib/pipeline/telemetry.ts) with the values the
 * stage writes to the store, so /metrics and `rlstream sql … step_metrics` agree:
 *
 *   rlstream_batches_total, rlstream_records_total, rlstream_samples_total   batches handled
 *   rlstream_errors_total{kind}            retriable | fatal | poison batch failures
 *   rlstream_dead_letters_total            messages the stage dead-lettered
 *   rlstream_consumer_lag{topic,partition} end offset − committed offset of the stage's group (at scrape)
 *   rlstream_phase_seconds_total{phase}    the `timing/<stage>/<phase>_s` increments
 *   rlstream_metric{name}                  every value a stage sets for a step (`actor/pg_loss`, `reward/mean`, …; last write)
 *   rlstream_metric_total{name}            every counter a stage adds (`perf/rollout_tokens`, `reward/failures`, …)
 *   rlstream_step                          the newest step the stage wrote metrics for
 *   rlstream_policy_version                the policy version the stage works with
 *   rlstream_reward_server_breaker_open{server}, rlstream_reward_server_latency_seconds{server,quantile}
 *   rlstream_ready, rlstream_run_finished{status}   readiness and the run's end
 *   process_* / nodejs_*                   prom-client's default process metrics
 */
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import type { Kind } from '../contracts/index.ts';
import type { MetricRow } from '../store/port.ts';
import type { ErrorKind, Telemetry } from '../pipeline/telemetry.ts';

export interface LagSource {
  /** Committed offsets of the stage's group and the topics' end offsets (partition = index). */
  lag(): Promise<Array<{ topic: string; partition: number; lag: number }>>;
}

const TIMING = /^timing\/[^/]+\/(.+)_s$/;
const SERVER = /^reward_server\/(.+)\/(breaker_open|latency_p50_ms|latency_p99_ms)$/;

export class PrometheusTelemetry implements Telemetry {
  readonly registry = new Registry();
  private readonly labels: { run_id: string; stage: string };
  private lagSource: LagSource | null = null;
  private readonly steps = new Map<string, number>();
  private readonly batches: Counter<'run_id' | 'stage'>;
  private readonly records: Counter<'run_id' | 'stage'>;
  private readonly samples: Counter<'run_id' | 'stage'>;
  private readonly errors: Counter<'run_id' | 'stage' | 'kind'>;
  private readonly deadLetters: Counter<'run_id' | 'stage'>;
  private readonly phase: Counter<'run_id' | 'stage' | 'phase'>;
  private readonly metric: Gauge<'run_id' | 'stage' | 'name'>;
  private readonly metricTotal: Counter<'run_id' | 'stage' | 'name'>;
  private readonly step: Gauge<'run_id' | 'stage'>;
  private readonly version: Gauge<'run_id' | 'stage'>;
  private readonly breaker: Gauge<'run_id' | 'stage' | 'server'>;
  private readonly latency: Gauge<'run_id' | 'stage' | 'server' | 'quantile'>;
  private readonly ready: Gauge<'run_id' | 'stage'>;
  private readonly finished: Gauge<'run_id' | 'stage' | 'status'>;

  constructor(runId: string, stage: string, opts: { defaultMetrics?: boolean } = {}) {
    this.labels = { run_id: runId, stage };
    const r = [this.registry];
    const L = ['run_id', 'stage'] as const;
    this.batches = new Counter({
      name: 'rlstream_batches_total',
      help: 'Batches the stage handled',
      labelNames: L,
      registers: r,
    });
    this.records = new Counter({
      name: 'rlstream_records_total',
      help: 'Records (messages) in the batches the stage handled',
      labelNames: L,
      registers: r,
    });
    this.samples = new Counter({
      name: 'rlstream_samples_total',
      help: 'Samples in the records the stage handled (a group counts its samples, other records 1)',
      labelNames: L,
      registers: r,
    });
    this.errors = new Counter({
      name: 'rlstream_errors_total',
      help: 'Failed batches by kind: retriable (redelivered after a backoff), fatal (split and retried per message), poison (an undecodable or foreign message)',
      labelNames: [...L, 'kind'],
      registers: r,
    });
    this.deadLetters = new Counter({
      name: 'rlstream_dead_letters_total',
      help: 'Messages the stage dead-lettered',
      labelNames: L,
      registers: r,
    });
    this.phase = new Counter({
      name: 'rlstream_phase_seconds_total',
      help: 'Time per phase: the timing/<stage>/<phase>_s values the stage writes to the store, summed',
      labelNames: [...L, 'phase'],
      registers: r,
    });
    this.metric = new Gauge({
      name: 'rlstream_metric',
      help: 'The last value the stage set for a step metric (name as in the store: actor/pg_loss, reward/mean, …)',
      labelNames: [...L, 'name'],
      registers: r,
    });
    this.metricTotal = new Counter({
      name: 'rlstream_metric_total',
      help: 'Counter increments the stage added to a step metric (name as in the store)',
      labelNames: [...L, 'name'],
      registers: r,
    });
    this.step = new Gauge({
      name: 'rlstream_step',
      help: 'The newest training step the stage wrote metrics for',
      labelNames: L,
      registers: r,
    });
    this.version = new Gauge({
      name: 'rlstream_policy_version',
      help: 'The policy version the stage works with (update: the newest published)',
      labelNames: L,
      registers: r,
    });
    this.breaker = new Gauge({
      name: 'rlstream_reward_server_breaker_open',
      help: 'Reward server circuit breaker: 1 open or half-open, 0 closed',
      labelNames: [...L, 'server'],
      registers: r,
    });
    this.latency = new Gauge({
      name: 'rlstream_reward_server_latency_seconds',
      help: 'Reward server request latency quantiles over the last step',
      labelNames: [...L, 'server', 'quantile'],
      registers: r,
    });
    this.ready = new Gauge({
      name: 'rlstream_ready',
      help: '1 when the stage is ready (bus and store connected, migrations applied, consumer joined)',
      labelNames: L,
      registers: r,
    });
    this.finished = new Gauge({
      name: 'rlstream_run_finished',
      help: '1 once the run has finished (status completed or failed); the stage then stays up idle',
      labelNames: [...L, 'status'],
      registers: r,
    });
    const lagOf = () => this.lagSource;
    const labels = this.labels;
    new Gauge({
      name: 'rlstream_consumer_lag',
      help: "Messages not yet consumed by the stage's consumer group, per input partition (end offset − committed offset)",
      labelNames: [...L, 'topic', 'partition'],
      registers: r,
      async collect() {
        this.reset();
        const source = lagOf();
        if (!source) return;
        try {
          for (const x of await source.lag())
            this.set({ ...labels, topic: x.topic, partition: String(x.partition) }, x.lag);
        } catch {
          /* bus unreachable: no lag sample this scrape */
        }
      },
    });
    this.ready.set(this.labels, 0);
    if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry, labels: this.labels });
  }

  setLagSource(s: LagSource | null): void {
    this.lagSource = s;
  }
  setReady(ready: boolean): void {
    this.ready.set(this.labels, ready ? 1 : 0);
  }
  setFinished(status: 'completed' | 'failed'): void {
    this.finished.set({ ...this.labels, status }, 1);
  }

  batch(stage: string, records: number, samples: number): void {
    const l = { ...this.labels, stage };
    this.batches.inc(l);
    this.records.inc(l, records);
    this.samples.inc(l, samples);
  }

  error(stage: string, kind: ErrorKind): void {
    this.errors.inc({ ...this.labels, stage, kind });
  }
  deadLetter(stage: string): void {
    this.deadLetters.inc({ ...this.labels, stage });
  }
  policyVersion(stage: string, version: number): void {
    this.version.set({ ...this.labels, stage }, version);
  }

  metricRows(stage: string, kind: Kind, step: number, rows: readonly MetricRow[]): void {
    const l = { ...this.labels, stage };
    if (kind === 'train' && step >= (this.steps.get(stage) ?? 0)) {
      this.steps.set(stage, step);
      this.step.set(l, step);
    }
    for (const row of rows) {
      const t = TIMING.exec(row.name);
      if (t && row.increment) {
        this.phase.inc({ ...l, phase: t[1] }, Math.max(0, row.value));
        continue;
      }
      if (row.increment) {
        if (row.value >= 0) this.metricTotal.inc({ ...l, name: row.name }, row.value);
        continue;
      }
      this.metric.set({ ...l, name: row.name }, row.value);
      const s = SERVER.exec(row.name);
      if (s?.[2] === 'breaker_open') this.breaker.set({ ...l, server: s[1] }, row.value);
      else if (s)
        this.latency.set(
          { ...l, server: s[1], quantile: s[2] === 'latency_p50_ms' ? '0.5' : '0.99' },
          row.value / 1000,
        );
    }
  }

  metrics(): Promise<string> {
    return this.registry.metrics();
  }
  get contentType(): string {
    return this.registry.contentType;
  }
}
