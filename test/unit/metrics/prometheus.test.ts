/**
 * The Prometheus metrics of a served stage (lib/metrics/prometheus.ts) and its HTTP endpoints
 * (lib/http/health-server.ts): metric rows map to the documented series with run_id and stage,
 * readiness answers 503 with a reason until ready.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PrometheusTelemetry } from '../../../lib/metrics/prometheus.ts';
import { startHealthServer } from '../../../lib/http/health-server.ts';
import { metricRows } from '../../../lib/pipeline/metrics.ts';

test('metric rows become the documented series, labelled with run_id and stage', async () => {
  const t = new PrometheusTelemetry('run-1', 'reward', { defaultMetrics: false });
  // the rows StageMetrics writes to the store for one step
  const rows = metricRows('run-1', 'reward', '0', 4, {
    sums: { 'reward/failures': 2 },
    timingMs: { compute: 1500, wait: 250 },
    sets: {
      'reward/mean': 0.25,
      'reward_server/127.0.0.1:8000/breaker_open': 1,
      'reward_server/127.0.0.1:8000/latency_p99_ms': 120,
    },
  });
  t.metricRows('reward', 'train', 4, rows);
  t.metricRows('reward', 'train', 3, []); // an older step does not move rlstream_step back
  t.batch('reward', 3, 12);
  t.error('reward', 'retriable');
  t.error('reward', 'poison');
  t.deadLetter('reward');
  t.setLagSource({ lag: async () => [{ topic: 'p.run-1.trajectories', partition: 1, lag: 7 }] });
  t.setFinished('completed');
  const text = await t.metrics();
  const has = (line: string) => assert.ok(text.includes(line), `missing ${line} in\n${text}`);
  has('rlstream_metric{run_id="run-1",stage="reward",name="reward/mean"} 0.25');
  has('rlstream_metric_total{run_id="run-1",stage="reward",name="reward/failures"} 2');
  has('rlstream_phase_seconds_total{run_id="run-1",stage="reward",phase="compute"} 1.5');
  has('rlstream_phase_seconds_total{run_id="run-1",stage="reward",phase="wait"} 0.25');
  has('rlstream_reward_server_breaker_open{run_id="run-1",stage="reward",server="127.0.0.1:8000"} 1');
  has(
    'rlstream_reward_server_latency_seconds{run_id="run-1",stage="reward",server="127.0.0.1:8000",quantile="0.99"} 0.12',
  );
  has('rlstream_step{run_id="run-1",stage="reward"} 4');
  has('rlstream_batches_total{run_id="run-1",stage="reward"} 1');
  has('rlstream_records_total{run_id="run-1",stage="reward"} 3');
  has('rlstream_samples_total{run_id="run-1",stage="reward"} 12');
  has('rlstream_errors_total{run_id="run-1",stage="reward",kind="retriable"} 1');
  has('rlstream_errors_total{run_id="run-1",stage="reward",kind="poison"} 1');
  has('rlstream_dead_letters_total{run_id="run-1",stage="reward"} 1');
  has('rlstream_consumer_lag{run_id="run-1",stage="reward",topic="p.run-1.trajectories",partition="1"} 7');
  has('rlstream_run_finished{run_id="run-1",stage="reward",status="completed"} 1');
  // perf/step_time_s/reward is a timing increment too, not a phase
  has('rlstream_metric_total{run_id="run-1",stage="reward",name="perf/step_time_s/reward"} 1.5');
});

test('the HTTP endpoints: healthz, readyz with a reason, metrics, 404 and 405', async () => {
  const t = new PrometheusTelemetry('run-2', 'update');
  let reason: string | null = 'waiting for migrations x.sql';
  const s = await startHealthServer({
    port: 0,
    host: '127.0.0.1',
    readiness: { notReadyReason: () => reason },
    metrics: t,
  });
  try {
    const at = (path: string, init?: RequestInit) => fetch(`http://127.0.0.1:${s.port}${path}`, init);
    assert.equal((await at('/healthz')).status, 200);
    const r = await at('/readyz');
    assert.equal(r.status, 503);
    assert.deepEqual(await r.json(), { ready: false, reason: 'waiting for migrations x.sql' });
    reason = null;
    assert.equal((await at('/readyz')).status, 200);
    const m = await at('/metrics');
    assert.equal(m.status, 200);
    assert.match(m.headers.get('content-type') ?? '', /text\/plain/);
    assert.match(await m.text(), /process_cpu_user_seconds_total\{run_id="run-2",stage="update"\}/);
    assert.equal((await at('/nope')).status, 404);
    assert.equal((await at('/readyz', { method: 'POST' })).status, 405);
  } finally {
    await s.close();
  }
});
