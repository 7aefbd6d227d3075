/**
 * HTTP reward client against scripted servers (an injected fetch): response mapping, request
 * presets/templates, malformed responses, retry/failover, 4xx, 429, timeouts, breaker with
 * probes, batch budget, batching, auth, affinity. Real servers are in test/int/reward/.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import pino from 'pino';
import { createRemoteRewardClient, mapResponse } from '../../../lib/reward/http-client.ts';
import {
  withRemoteDefaults,
  type RemoteRewardOptions,
  type RewardOutcome,
  type RewardRequestItem,
} from '../../../lib/reward/types.ts';
import type { FetchLike } from '../../../lib/reward/transport.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { makePng } from '../../../devkit/reward-png.ts';

type Handler = (body: any, call: number) => Response | 'stall' | 'refuse' | Promise<Response | 'stall' | 'refuse'>;

interface Scripted {
  fetch: FetchLike;
  calls: { server: string; path: string; body: any; headers: Record<string, string> }[];
}

/** A fetch that routes `http://sN/...` to handler N; `/healthz` answers `health(N)` (default 200). */
function scripted(handlers: Record<string, Handler>, health: (server: string) => number = () => 200): Scripted {
  const calls: Scripted['calls'] = [];
  const perServer = new Map<string, number>();
  const fetch: FetchLike = async (url, init) => {
    const u = new URL(url);
    const server = u.host;
    if (u.pathname === '/healthz') return new Response('{"status":"ok"}', { status: health(server) });
    const body = init.body ? JSON.parse(init.body) : undefined;
    calls.push({ server, path: u.pathname, body, headers: init.headers });
    const n = (perServer.get(server) ?? 0) + 1;
    perServer.set(server, n);
    const h = handlers[server];
    if (!h) throw new Error(`no handler for ${server}`);
    const r = await h(body, n);
    if (r === 'refuse')
      throw Object.assign(new TypeError('fetch failed'), {
        cause: Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }),
      });
    if (r === 'stall') {
      return new Promise((_, reject) =>
        init.signal.addEventListener('abort', () => reject(new DOMException('aborted', 'AbortError'))),
      );
    }
    return r;
  };
  return { fetch, calls };
}

const json = (v: unknown, status = 200, headers: Record<string, string> = {}) =>
  new Response(typeof v === 'string' ? v : JSON.stringify(v), {
    status,
    headers: { 'content-type': 'application/json', ...headers },
  });
const good =
  (v = 0.8, o = 0.6) =>
  () =>
    json({ vlm_score: v, ocr_confidence: o, extra: 'kept' });

function opts(
  over: Partial<Omit<RemoteRewardOptions, 'breaker'>> & { breaker?: Partial<RemoteRewardOptions['breaker']> } = {},
): RemoteRewardOptions {
  return withRemoteDefaults({
    enabled: true,
    urls: ['http://s0', 'http://s1'],
    backoff_initial_ms: 1,
    backoff_max_ms: 5,
    timeout_ms: 2000,
    batch_budget_ms: 20_000,
    ...over,
  });
}

const items = (n: number, extra: Partial<RewardRequestItem> = {}): RewardRequestItem[] =>
  Array.from({ length: n }, (_, i) => ({
    id: `t${i}`,
    step: 3,
    prompt_text: `prompt ${i}`,
    response_text: `response ${i}`,
    ground_truth: `gt ${i}`,
    ...extra,
  }));

function assertNoFabricated(outs: RewardOutcome[]): void {
  for (const o of outs)
    if (!o.ok)
      assert.equal((o as Record<string, unknown>).reward, undefined, 'a failed outcome must not carry a reward');
}

test('weighted sum of the mapped fields; every returned field kept in details; seed preset body', async () => {
  const png = makePng(4, 3);
  const s = scripted({ s0: good(0.8, 0.6), s1: good(0.8, 0.6) });
  const c = createRemoteRewardClient(
    opts({ response_mapping: { weights: { vlm_score: 0.25, ocr_confidence: 0.75 } } }),
    { replicaIndex: 0, fetchImpl: s.fetch },
  );
  const [o] = await c.scoreBatch(items(1, { images: [png] }));
  c.close();
  assert.ok(o.ok);
  assert.ok(Math.abs(o.reward - (0.25 * 0.8 + 0.75 * 0.6)) < 1e-12);
  assert.deepEqual(o.details, { vlm_score: 0.8, ocr_confidence: 0.6, extra: 'kept' });
  assert.equal(o.server, 's0');
  assert.deepEqual(s.calls[0].body, { image: png.toString('base64'), prompt: 'prompt 0' });
  assert.equal(s.calls[0].path, '/score');
});

test('text preset and a custom template map trajectory fields to the body', async () => {
  const s = scripted({ s0: good(), s1: good() });
  let c = createRemoteRewardClient(opts({ request_preset: 'text' }), { replicaIndex: 0, fetchImpl: s.fetch });
  await c.scoreBatch(items(1));
  c.close();
  assert.deepEqual(s.calls[0].body, { prompt: 'prompt 0', response: 'response 0', ground_truth: 'gt 0' });
  c = createRemoteRewardClient(
    opts({
      request_template: { q: 'prompt_text', a: 'response_text', uid: 'id', step: 'step', image: 'image_base64_png' },
    }),
    { replicaIndex: 0, fetchImpl: s.fetch },
  );
  await c.scoreBatch(items(1));
  c.close();
  assert.deepEqual(
    s.calls[1].body,
    { q: 'prompt 0', a: 'response 0', uid: 't0', step: 3 },
    'a field without a value (no image) is left out',
  );
  assert.throws(
    () =>
      createRemoteRewardClient(opts({ request_template: { q: 'prompt' as never } }), {
        replicaIndex: 0,
        fetchImpl: s.fetch,
      }),
    (e: Error) => e instanceof ConfigError && /unknown trajectory field "prompt".*prompt_text/.test(e.message),
  );
});

test('mapResponse: missing, non-number, NaN, out of range and non-object are malformed; range is configurable', () => {
  const w: [string, number][] = [['vlm_score', 1]];
  assert.match((mapResponse({}, w) as { reason: string }).reason, /"vlm_score" is missing/);
  assert.match((mapResponse({ vlm_score: '0.5' }, w) as { reason: string }).reason, /expected a number/);
  assert.match((mapResponse({ vlm_score: null }, w) as { reason: string }).reason, /is null/);
  assert.match((mapResponse({ vlm_score: Number.NaN }, w) as { reason: string }).reason, /NaN, outside \[0, 1\]/);
  assert.match((mapResponse({ vlm_score: 1.0001 }, w) as { reason: string }).reason, /outside \[0, 1\]/);
  assert.match((mapResponse([1], w) as { reason: string }).reason, /an array/);
  assert.deepEqual(mapResponse({ vlm_score: 5 }, w, [0, 10]), { ok: true, reward: 5, details: { vlm_score: 5 } });
  assert.deepEqual(
    mapResponse({ vlm_score: 0 }, w),
    { ok: true, reward: 0, details: { vlm_score: 0 } },
    'a real zero is a reward',
  );
});

for (const [name, body, reason] of [
  ['not JSON', '<html>oops</html>', /malformed response: response is not valid JSON/],
  ['NaN literal', '{"vlm_score": NaN, "ocr_confidence": 0.5}', /NaN\/Infinity/],
  ['missing field', '{"vlm_score": 0.5}', /"ocr_confidence" is missing/],
  ['out of range', '{"vlm_score": 0.5, "ocr_confidence": -0.1}', /outside \[0, 1\]/],
] as const) {
  test(`malformed response (${name}) is a failure with the body recorded, never a reward`, async () => {
    const s = scripted({ s0: () => json(body), s1: () => json(body) });
    const c = createRemoteRewardClient(opts({ max_retries: 2 }), { replicaIndex: 0, fetchImpl: s.fetch });
    const [o] = await c.scoreBatch(items(1));
    const m = c.metrics();
    c.close();
    assert.equal(o.ok, false);
    assertNoFabricated([o]);
    if (o.ok) return;
    assert.match(o.reason, reason);
    assert.match(o.reason, /gave up after 3 attempts/);
    assert.equal(o.body, body);
    assert.equal(o.retriable, false, 'a server that keeps answering garbage is not fixed by retrying later');
    assert.equal(s.calls.length, 3, 'max_retries = 2 → 3 attempts');
    assert.deepEqual(
      new Set(s.calls.map((x) => x.server)),
      new Set(['s0', 's1']),
      'retries fail over to the other server',
    );
    assert.equal(m['reward/failures'], 1);
  });
}

test('a long offending body is truncated in the failure record', async () => {
  const long = `<html>${'x'.repeat(5000)}</html>`;
  const s = scripted({ s0: () => json(long), s1: () => json(long) });
  const c = createRemoteRewardClient(opts({ max_retries: 0 }), { replicaIndex: 0, fetchImpl: s.fetch });
  const [o] = await c.scoreBatch(items(1));
  c.close();
  assert.ok(!o.ok && o.body !== undefined && o.body.length < 600 && o.body.includes('(5013 chars)'));
});

test("a 400 is final: no retry, the server's reason is kept", async () => {
  const s = scripted({ s0: () => json({ error: 'prompt: is required (a string)' }, 400), s1: good() });
  const c = createRemoteRewardClient(opts(), { replicaIndex: 0, fetchImpl: s.fetch });
  const [o] = await c.scoreBatch(items(1));
  c.close();
  assert.equal(s.calls.length, 1);
  assert.ok(!o.ok);
  assert.equal(o.retriable, false);
  assert.match(o.reason, /s0: HTTP 400: prompt: is required/);
});

test('5xx and refused connections are retried on the other server (failover)', async () => {
  const s = scripted({ s0: () => json({ error: 'boom' }, 503), s1: good(0.5, 0.5) });
  const c = createRemoteRewardClient(opts(), { replicaIndex: 0, fetchImpl: s.fetch });
  const outs = await c.scoreBatch(items(6));
  const m = c.metrics();
  c.close();
  for (const o of outs) {
    assert.ok(o.ok);
    assert.equal(o.server, 's1');
    assert.equal(o.reward, 0.5);
  }
  assert.ok(m['reward/retries'] >= 1);
  assert.ok(m['reward_server/s0/error_rate'] > 0);
  assert.equal(m['reward_server/s1/error_rate'], 0);

  const r = scripted({ s0: () => 'refuse', s1: good() });
  const c2 = createRemoteRewardClient(opts(), { replicaIndex: 0, fetchImpl: r.fetch });
  const [o] = await c2.scoreBatch(items(1));
  c2.close();
  assert.ok(o.ok && o.server === 's1');
});

test('429 with Retry-After is retried; a server that stays down ends in a retriable failure', async () => {
  const s = scripted({
    s0: (_b, n) => (n === 1 ? json({ error: 'slow down' }, 429, { 'retry-after': '0' }) : good(0.2, 0.4)()),
  });
  const c = createRemoteRewardClient(opts({ urls: ['http://s0'] }), { replicaIndex: 0, fetchImpl: s.fetch });
  const [o] = await c.scoreBatch(items(1));
  c.close();
  assert.ok(o.ok);
  assert.equal(s.calls.length, 2);

  const d = scripted({ s0: () => 'refuse' });
  const c2 = createRemoteRewardClient(
    opts({ urls: ['http://s0'], max_retries: 2, breaker: { failure_threshold: 100 } }),
    { replicaIndex: 0, fetchImpl: d.fetch },
  );
  const [f] = await c2.scoreBatch(items(1));
  c2.close();
  assert.ok(!f.ok);
  assert.equal(f.retriable, true);
  assert.match(f.reason, /s0: connection failed: ECONNREFUSED.*gave up after 3 attempts/);
});

test('a request that stalls past timeout_ms is a timeout, retried elsewhere', async () => {
  const s = scripted({ s0: () => 'stall', s1: good(0.9, 0.9) });
  const c = createRemoteRewardClient(opts({ timeout_ms: 100 }), { replicaIndex: 0, fetchImpl: s.fetch });
  const [o] = await c.scoreBatch(items(1));
  c.close();
  assert.ok(o.ok && o.server === 's1');
  assert.equal(s.calls[0].server, 's0');
});

test('breaker: opens after failure_threshold consecutive failures, probes, half-opens, a good trial closes it', async () => {
  let s0Healthy = false;
  const s = scripted({ s0: () => (s0Healthy ? good(0.1, 0.1)() : json({ error: 'down' }, 500)), s1: good() });
  const c = createRemoteRewardClient(
    opts({ concurrency_per_server: 1, breaker: { failure_threshold: 2, reset_timeout_ms: 30, probe_interval_ms: 10 } }),
    { replicaIndex: 0, fetchImpl: s.fetch },
  );
  const first = await c.scoreBatch(items(2));
  assert.ok(first.every((o) => o.ok && o.server === 's1'));
  // sequential requests return to s0 (affinity) once its short cool-down is over; the second failure opens it
  for (let i = 0; i < 50 && c.metrics()['reward_server/s0/breaker_open'] !== 1; i++) {
    const [o] = await c.scoreBatch([{ ...items(1)[0], id: `x${i}` }]);
    assert.ok(o.ok && o.server === 's1');
    await new Promise((r) => setTimeout(r, 6));
  }
  assert.equal(c.metrics()['reward_server/s0/breaker_open'], 1);
  assert.equal(c.metrics()['reward_server/s0/errors_total'], 2);
  const callsBefore = s.calls.filter((x) => x.server === 's0').length;
  await c.scoreBatch([{ ...items(1)[0], id: 'y3' }]);
  assert.equal(s.calls.filter((x) => x.server === 's0').length, callsBefore, 'no traffic to an open server');
  s0Healthy = true;
  // wait (bounded) for a probe to half-open it
  for (let i = 0; i < 200 && c.metrics()['reward_server/s0/breaker_half_open'] !== 1; i++)
    await new Promise((r) => setTimeout(r, 10));
  assert.equal(c.metrics()['reward_server/s0/breaker_half_open'], 1);
  const [t] = await c.scoreBatch([{ ...items(1)[0], id: 'y4' }]);
  assert.ok(t.ok && t.server === 's0', 'the trial request goes to the half-open server (affinity)');
  assert.equal(c.metrics()['reward_server/s0/breaker_open'], 0);
  c.close();
});

test('all breakers open → items fail with a retriable reason naming every server (bounded wait)', async () => {
  const s = scripted(
    { s0: () => json({ error: 'down' }, 500), s1: () => json({ error: 'also down' }, 502) },
    () => 503,
  );
  const c = createRemoteRewardClient(
    opts({ max_retries: 3, breaker: { failure_threshold: 1, reset_timeout_ms: 20, probe_interval_ms: 10 } }),
    { replicaIndex: 0, fetchImpl: s.fetch },
  );
  const outs = await c.scoreBatch(items(3));
  c.close();
  assertNoFabricated(outs);
  for (const o of outs) {
    assert.ok(!o.ok);
    assert.equal(o.retriable, true);
    assert.match(
      o.reason,
      /no reward server available: all 2 circuit breakers open \(s0: HTTP 500: down; s1: HTTP 502: also down\)/,
    );
  }
});

test('jobs queued behind a busy server learn when every breaker opens (no wait for the whole budget)', async () => {
  const s = scripted({ s0: () => 'refuse' }, () => 503);
  const c = createRemoteRewardClient(
    opts({
      urls: ['http://s0'],
      concurrency_per_server: 1,
      max_retries: 2,
      batch_budget_ms: 3000,
      breaker: { failure_threshold: 1, reset_timeout_ms: 20, probe_interval_ms: 10 },
    }),
    { replicaIndex: 0, fetchImpl: s.fetch },
  );
  const outs = await c.scoreBatch(items(4));
  c.close();
  assertNoFabricated(outs);
  for (const o of outs) {
    assert.ok(!o.ok);
    assert.doesNotMatch(o.reason, /budget/, 'queued jobs must not sit out the batch budget');
    assert.match(
      o.reason,
      /no reward server available: all 1 circuit breakers open \(s0: connection failed: ECONNREFUSED/,
    );
  }
});

test('batch_budget_ms bounds a whole scoreBatch: unscored items fail (retriable), none get a reward', async () => {
  const s = scripted({ s0: () => 'stall', s1: () => 'stall' });
  const c = createRemoteRewardClient(opts({ timeout_ms: 60_000, batch_budget_ms: 150 }), {
    replicaIndex: 0,
    fetchImpl: s.fetch,
  });
  const outs = await c.scoreBatch(items(4));
  c.close();
  assert.equal(outs.length, 4);
  assertNoFabricated(outs);
  for (const o of outs) {
    assert.ok(!o.ok);
    assert.equal(o.retriable, true);
    assert.match(o.reason, /batch time budget of 150 ms exceeded|timeout/);
  }
});

test('batch_size > 1 sends {items} and reads {results}; a bad item is retried alone', async () => {
  let calls = 0;
  const s = scripted({
    s0: (body) => {
      calls++;
      // first request: the second result is garbage
      return json({
        results: body.items.map((it: { prompt: string }, i: number) =>
          calls === 1 && i === 1
            ? { vlm_score: 'x' }
            : { vlm_score: 0.5, ocr_confidence: Number(it.prompt.split(' ')[1]) / 10 },
        ),
      });
    },
    s1: (body) => json({ results: body.items.map(() => ({ vlm_score: 1, ocr_confidence: 1 })) }),
  });
  const c = createRemoteRewardClient(opts({ batch_size: 3, request_preset: 'text' }), {
    replicaIndex: 0,
    fetchImpl: s.fetch,
  });
  const outs = await c.scoreBatch(items(5));
  c.close();
  assert.deepEqual(
    s.calls[0].body.items.map((x: { prompt: string }) => x.prompt),
    ['prompt 0', 'prompt 1', 'prompt 2'],
  );
  assert.ok(outs.every((o) => o.ok));
  assert.equal((outs[0] as { reward: number }).reward, 0.5 * 0.5 + 0.5 * 0);
  assert.equal(outs[1].ok && outs[1].server, 's1', 'the malformed item went elsewhere');
  assert.equal(s.calls.find((x) => x.server === 's1')!.body.items.length, 1);
  // wrong result count is malformed
  const w = scripted({ s0: () => json({ results: [] }) });
  const c2 = createRemoteRewardClient(opts({ urls: ['http://s0'], batch_size: 2, max_retries: 0 }), {
    replicaIndex: 0,
    fetchImpl: w.fetch,
  });
  const bad = await c2.scoreBatch(items(2));
  c2.close();
  assert.ok(bad.every((o) => !o.ok && /0 results for 2 items/.test(o.reason)));
});

test('auth header from the environment variable, with the scheme; a missing variable is a ConfigError; the token is never logged', async () => {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      lines.push(chunk.toString());
      cb();
    },
  });
  const log = pino({ level: 'debug' }, sink);
  const s = scripted({ s0: () => json({ error: 'nope' }, 500), s1: good() });
  const o = opts({ auth_token_env: 'RM_TOKEN', max_retries: 1 });
  const c = createRemoteRewardClient(o, { replicaIndex: 0, fetchImpl: s.fetch, env: { RM_TOKEN: 'sekrit-123' }, log });
  const outs = await c.scoreBatch(items(2));
  c.close();
  assert.ok(outs.every((x) => x.ok));
  assert.equal(s.calls[0].headers.authorization, 'Bearer sekrit-123');
  assert.ok(lines.length > 0);
  assert.ok(!lines.join('\n').includes('sekrit-123'));
  const c2 = createRemoteRewardClient(
    { ...o, auth_header: 'X-Api-Key', auth_scheme: '' },
    { replicaIndex: 0, fetchImpl: s.fetch, env: { RM_TOKEN: 'k' } },
  );
  await c2.scoreBatch([{ ...items(1)[0], id: 'k' }]);
  c2.close();
  assert.equal(s.calls.at(-1)!.headers['x-api-key'], 'k');
  assert.throws(
    () => createRemoteRewardClient(o, { replicaIndex: 0, fetchImpl: s.fetch, env: {} }),
    (e: Error) => e instanceof ConfigError && /RM_TOKEN is not set/.test(e.message),
  );
});

test('affinity: replica i prefers server i mod N; a burst spreads by least outstanding; concurrency capped', async () => {
  let inFlight: Record<string, number> = {};
  let maxSeen: Record<string, number> = {};
  const slow: Handler = async () => {
    await new Promise((r) => setTimeout(r, 5));
    return good()();
  };
  const track =
    (name: string): Handler =>
    async (b, n) => {
      inFlight[name] = (inFlight[name] ?? 0) + 1;
      maxSeen[name] = Math.max(maxSeen[name] ?? 0, inFlight[name]);
      try {
        return await slow(b, n);
      } finally {
        inFlight[name]--;
      }
    };
  const urls = ['http://s0', 'http://s1', 'http://s2', 'http://s3'];
  const s = scripted({ s0: track('s0'), s1: track('s1'), s2: track('s2'), s3: track('s3') });
  const c = createRemoteRewardClient(opts({ urls, concurrency_per_server: 2 }), {
    replicaIndex: 5,
    fetchImpl: s.fetch,
  });
  for (let i = 0; i < 4; i++) await c.scoreBatch([{ ...items(1)[0], id: `seq${i}` }]);
  assert.deepEqual(
    s.calls.map((x) => x.server),
    ['s1', 's1', 's1', 's1'],
    'replica 5 of 4 servers → s1',
  );
  inFlight = {};
  maxSeen = {};
  const outs = await c.scoreBatch(items(40));
  c.close();
  assert.ok(outs.every((o) => o.ok));
  const burst = s.calls.slice(4);
  for (const srv of ['s0', 's1', 's2', 's3'])
    assert.ok(
      burst.some((x) => x.server === srv),
      `${srv} got part of the burst`,
    );
  for (const v of Object.values(maxSeen))
    assert.ok(v <= 2, 'never more than concurrency_per_server in flight per server');
});

test('scoreBatch rejects duplicate ids; outcomes come back in item order', async () => {
  const s = scripted({
    s0: (b) => json({ vlm_score: Number(b.prompt.split(' ')[1]) / 10, ocr_confidence: 0 }),
    s1: (b) => json({ vlm_score: Number(b.prompt.split(' ')[1]) / 10, ocr_confidence: 0 }),
  });
  const c = createRemoteRewardClient(opts(), { replicaIndex: 0, fetchImpl: s.fetch });
  const outs = await c.scoreBatch(items(8));
  assert.deepEqual(
    outs.map((o) => o.id),
    items(8).map((i) => i.id),
  );
  outs.forEach((o, i) => assert.ok(o.ok && Math.abs(o.reward - 0.5 * (i / 10)) < 1e-12));
  await assert.rejects(c.scoreBatch([items(1)[0], items(1)[0]]), /appears twice/);
  c.close();
  await assert.rejects(c.scoreBatch(items(1)), /closed/);
});

test('a partial outage (500 only for prompts starting with 7) does not open the breaker for everyone; a bad item in a batch does not fail the others', async () => {
  const bad = (b: { prompt?: string; items?: Array<{ prompt: string }> }) =>
    (b.items ?? [b as { prompt: string }]).some((x) => x.prompt.startsWith('7'));
  const handler = (b: unknown) =>
    bad(b as never)
      ? json({ error: 'cannot score this one' }, 500)
      : (b as { items?: unknown[] }).items
        ? json({ results: (b as { items: unknown[] }).items.map(() => ({ vlm_score: 0.5, ocr_confidence: 0.5 })) })
        : good(0.5, 0.5)();
  const list = Array.from({ length: 60 }, (_, i) => ({
    ...items(1)[0],
    id: `p${i}`,
    prompt_text: `${i % 10} prompt ${i}`,
  }));
  for (const batch_size of [1, 4]) {
    const s = scripted({ s0: handler });
    const c = createRemoteRewardClient(
      opts({
        urls: ['http://s0'],
        batch_size,
        concurrency_per_server: 4,
        max_retries: 5,
        breaker: { failure_threshold: 5, reset_timeout_ms: 60_000, probe_interval_ms: 60_000 },
      }),
      { replicaIndex: 0, fetchImpl: s.fetch },
    );
    const outs = await c.scoreBatch(list);
    const m = c.metrics();
    c.close();
    assertNoFabricated(outs);
    for (const [i, o] of outs.entries()) {
      if (list[i].prompt_text.startsWith('7'))
        assert.ok(
          !o.ok && /HTTP 500: cannot score this one/.test(o.reason),
          `batch_size ${batch_size}, ${o.id}: ${JSON.stringify(o)}`,
        );
      else
        assert.ok(
          o.ok,
          `batch_size ${batch_size}: ${o.id} is scored, not failed by another prompt's fault: ${JSON.stringify(o)}`,
        );
    }
    assert.equal(m['reward_server/s0/breaker_open'], 0, `batch_size ${batch_size}: the breaker stayed closed`);
  }
});
