/**
 * The full protocol against real `rlstream reward-server` processes on loopback: 4 servers from
 * one launcher (--count 4), 2 reward replicas (clients) — affinity respected, load spread, every
 * reward equal to what the scorer computes, every returned field kept; the text preset and the
 * batch form; an ONNX model served; graceful SIGTERM (in-flight request answered, exit 0).
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createRemoteRewardClient } from '../../../lib/reward/http-client.ts';
import { withRemoteDefaults, type RewardRequestItem } from '../../../lib/reward/types.ts';
import { createModelRewardScorer } from '../../../lib/reward/onnx-scorer.ts';
import { decideOnFailures } from '../../../lib/reward/failure-policy.ts';
import exampleScore from '../../../examples/reward-server/overlap-scorer.ts';
import { FAULTY_SCORER, startRewardServers, type ServerGroup } from '../../../devkit/reward-procs.ts';
import { makePng } from '../../../devkit/reward-png.ts';
import { writeScorerModel } from '../../support/reward-onnx-model.ts';

let dir = '';
let four: ServerGroup | undefined;
const started: ServerGroup[] = [];

before(async () => {
  mkdirSync('test/.tmp', { recursive: true });
  dir = mkdtempSync(join('test/.tmp', 'reward-protocol-'));
  four = await startRewardServers({ count: 4, logDir: dir });
  started.push(four);
});

after(async () => {
  for (const g of started) await g.stop('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

function makeItems(prefix: string, n: number): RewardRequestItem[] {
  return Array.from({ length: n }, (_, i) => ({
    id: `${prefix}-${i}`,
    step: 1,
    prompt_text: `draw ${i % 3 === 0 ? 'a red square' : `the number ${i}`}`,
    response_text: `a red ${i % 2 ? 'square' : 'circle'}`,
    ground_truth: 'a red square',
    images: [makePng(2 + (i % 5), 3 + (i % 4), i)],
  }));
}

/** What the example scorer gives for the seed preset body {image, prompt}, with weights 0.5/0.5. */
function expectedSeed(it: RewardRequestItem) {
  const r = exampleScore({ prompt: it.prompt_text, image: it.images![0], extra: {} }) as Record<string, number>;
  return { reward: 0.5 * r.vlm_score + 0.5 * r.ocr_confidence, details: r };
}

test('4 servers, 2 reward replicas: affinity respected, load spread, every reward right, every field kept', async () => {
  const urls = four!.servers.map((s) => s.url);
  const opts = withRemoteDefaults({ enabled: true, urls, concurrency_per_server: 2, timeout_ms: 20_000 });
  const replicas = [0, 1].map((replicaIndex) => createRemoteRewardClient(opts, { replicaIndex }));
  try {
    // one at a time: each replica sticks to its own server
    for (const [r, c] of replicas.entries()) {
      for (const it of makeItems(`seq${r}`, 3)) {
        const [o] = await c.scoreBatch([it]);
        assert.ok(o.ok, JSON.stringify(o));
        assert.equal(o.server, four!.servers[r].key, `replica ${r} prefers server ${r}`);
      }
    }
    // bursts from both replicas at once: spread over all four servers
    const batches = [makeItems('a', 48), makeItems('b', 48)];
    const outs = await Promise.all(replicas.map((c, r) => c.scoreBatch(batches[r])));
    for (const [r, batch] of batches.entries()) {
      assert.equal(outs[r].length, batch.length);
      for (const [i, o] of outs[r].entries()) {
        assert.ok(o.ok, JSON.stringify(o));
        assert.equal(o.id, batch[i].id);
        const want = expectedSeed(batch[i]);
        assert.ok(Math.abs(o.reward - want.reward) < 1e-12);
        assert.deepEqual(o.details, want.details, 'every returned field is kept, image size included');
        assert.equal(o.details.image_width, 2 + (i % 5));
      }
    }
    const perServer = four!.servers.map((s) =>
      replicas.reduce((n, c) => n + c.metrics()[`reward_server/${s.key}/requests_total`], 0),
    );
    assert.equal(
      perServer.reduce((a, b) => a + b, 0),
      6 + 96,
    );
    for (const [i, n] of perServer.entries()) assert.ok(n >= 4, `server ${i} got ${n} requests — load must spread`);
    const m = replicas[0].metrics();
    assert.equal(m['reward/failures'], 0);
    assert.equal(m['reward/scored'], 3 + 48);
    const k0 = four!.servers[0].key;
    assert.ok(
      m[`reward_server/${k0}/latency_p99_ms`] >= m[`reward_server/${k0}/latency_p50_ms`] &&
        m[`reward_server/${k0}/latency_p50_ms`] > 0,
    );
    assert.ok(m[`reward_server/${k0}/requests_per_s`] > 0);
    assert.equal(m[`reward_server/${k0}/breaker_open`], 0);
    assert.equal(
      decideOnFailures(
        outs[0],
        { group_id: 'g', expected_ids: batches[0].map((b) => b.id), attempt: 0, max_attempts: 3 },
        'stop',
      ).action,
      'emit',
    );
  } finally {
    for (const c of replicas) c.close();
  }
});

test('text preset, and the batch form {items} → {results}, against the real servers', async () => {
  const urls = four!.servers.map((s) => s.url);
  for (const batch_size of [1, 4]) {
    const c = createRemoteRewardClient(
      withRemoteDefaults({
        enabled: true,
        urls,
        request_preset: 'text',
        batch_size,
        response_mapping: { weights: { vlm_score: 1 } },
      }),
      { replicaIndex: 2 },
    );
    const items = makeItems(`text${batch_size}`, 10);
    const outs = await c.scoreBatch(items);
    c.close();
    for (const [i, o] of outs.entries()) {
      const r = exampleScore({
        prompt: items[i].prompt_text,
        response: items[i].response_text,
        ground_truth: items[i].ground_truth,
        extra: {},
      }) as Record<string, number>;
      assert.ok(o.ok, JSON.stringify(o));
      assert.equal(o.reward, r.vlm_score);
      assert.equal(o.details.image_width, undefined, 'the text preset sends no image');
    }
  }
});

test('each server of the launcher logs to its own file, named by its port', () => {
  for (const s of four!.servers) {
    assert.equal(s.log, resolve(dir, `reward-server-${s.key.split(':')[1]}.log`));
    assert.ok(existsSync(s.log));
    const first = JSON.parse(readFileSync(s.log, 'utf8').split('\n')[0]);
    assert.equal(first.url, s.url);
    assert.equal(first.pid, s.pid);
  }
  assert.equal(new Set(four!.servers.map((s) => s.pid)).size, 4, 'one process per server');
});

test("an ONNX sequence scorer served by reward-server gives the in-process model's rewards", async () => {
  const model = writeScorerModel(join(dir, 'rm.onnx'));
  const g = await startRewardServers({
    scorer: model,
    logDir: dir,
    args: ['--transform', 'sigmoid', '--scale', '1', '--score-field', 'rm_score'],
  });
  started.push(g);
  const c = createRemoteRewardClient(
    withRemoteDefaults({
      enabled: true,
      urls: [g.servers[0].url],
      request_preset: 'text',
      response_mapping: { weights: { rm_score: 1 } },
    }),
    { replicaIndex: 0 },
  );
  const local = await createModelRewardScorer({ path: model, transform: 'sigmoid', scale: 1, threshold: null });
  const items = makeItems('onnx', 12);
  const [remote, inproc] = await Promise.all([c.scoreBatch(items), local.scoreBatch(items)]);
  c.close();
  await local.close();
  for (let i = 0; i < items.length; i++) {
    assert.ok(remote[i].ok && inproc[i].ok, JSON.stringify([remote[i], inproc[i]]));
    assert.ok(Math.abs((remote[i] as { reward: number }).reward - (inproc[i] as { reward: number }).reward) < 1e-6);
  }
  assert.equal(await g.stop(), 0);
});

test('SIGTERM: the in-flight request is answered, new connections are refused, exit code 0', async () => {
  const g = await startRewardServers({ scorer: FAULTY_SCORER, logDir: dir, env: { REWARD_FAULT: 'delay=1500' } });
  started.push(g);
  const url = g.servers[0].url;
  const pending = fetch(`${url}/score`, {
    method: 'POST',
    body: JSON.stringify({ prompt: 'a b c', response: 'a b c' }),
  });
  let inFlight = 0;
  for (let i = 0; i < 100 && inFlight === 0; i++) {
    await new Promise((r) => setTimeout(r, 20));
    inFlight = ((await (await fetch(`${url}/healthz`)).json()) as { in_flight: number }).in_flight;
  }
  assert.equal(inFlight, 1);
  process.kill(g.servers[0].pid, 'SIGTERM');
  const res = await pending;
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { vlm_score: 1, ocr_confidence: 1, words: 3 });
  assert.equal(await g.exited, 0);
  await assert.rejects(fetch(`${url}/healthz`), 'the port is closed after shutdown');
  assert.match(readFileSync(g.servers[0].log, 'utf8'), /"clean":true,"msg":"reward server stopped"/);
});

test('the launcher forwards SIGTERM to all 4 servers and exits 0 when they have', async () => {
  assert.equal(await four!.stop('SIGTERM'), 0);
  for (const s of four!.servers) assert.throws(() => process.kill(s.pid, 0), /ESRCH/, `server pid ${s.pid} is gone`);
});
