/**
 * serve-policy over real HTTP (in this process): OpenAI shapes, token ids in and out, sampling
 * identical to the rollout's Sampler for the same (seed, sequence id), batching of concurrent
 * requests, SSE streaming, OpenAI-style errors, reload by request and by following the run.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sampler } from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { stopTokenIds } from '../../../lib/model/config.ts';
import { openServedPolicy } from '../../../lib/inference/served-policy.ts';
import { startPolicyServer, type PolicyServer } from '../../../lib/inference/policy-server.ts';
import { tokenizerFor } from '../../../lib/pipeline/policy.ts';
import { makePolicyRunDir, type PolicyRunDir } from '../../support/policy-run-dir.ts';

const dir = join(import.meta.dirname, '../../.tmp', `policy-server-${process.pid}`);
let run: PolicyRunDir;
let server: PolicyServer;
let model: string;

before(async () => {
  run = await makePolicyRunDir(dir);
  const tpl = join(dir, 'chat.jinja');
  writeFileSync(tpl, '{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}:{% endif %}');
  const { policy, initial } = await openServedPolicy(dir, { chatTemplateFile: tpl });
  model = policy.name;
  server = await startPolicyServer({
    policy,
    initial,
    port: 0,
    followMs: 100,
    maxBodyBytes: 64 * 1024,
    batchWindowMs: 100,
  });
});
after(async () => {
  await server?.close();
  rmSync(dir, { recursive: true, force: true });
});

async function post(path: string, body: unknown): Promise<{ status: number; json: any; headers: Headers }> {
  const r = await fetch(server.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, json: text.startsWith('data:') ? text : JSON.parse(text), headers: r.headers };
}

const tok = () => tokenizerFor(run.cfg);
const promptIds = () => Array.from(tok().encode('3 7 1:', { addSpecialTokens: true }));

test('models, health and a token-id completion that is the Sampler’s own draw', async () => {
  const models = (await (await fetch(server.url + '/v1/models')).json()) as { data: Array<{ id: string }> };
  assert.equal(models.data[0].id, model);
  assert.equal((await fetch(server.url + '/health')).status, 200);
  const ids = promptIds();
  const r = await post('/v1/completions', {
    model,
    prompt: ids,
    max_tokens: 4,
    temperature: 1,
    request_id: 'sample-a',
    rlstream_seed: 7,
    return_token_ids: true,
    logprobs: 0,
  });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal(r.json.object, 'text_completion');
  assert.equal(r.json.policy_version, 0);
  assert.equal(r.headers.get('x-rlstream-policy-version'), '0');
  const ch = r.json.choices[0];
  assert.deepEqual(ch.prompt_token_ids, ids);
  const [ref] = await new Sampler(run.model).generate(run.weights, [{ id: 'sample-a', prompt: ids }], {
    maxNewTokens: 4,
    temperature: 1,
    seed: 7,
    eosTokenIds: stopTokenIds(run.model),
  });
  assert.deepEqual(ch.token_ids, Array.from(ref.tokens));
  assert.deepEqual(ch.logprobs.token_logprobs, Array.from(ref.logprobs));
  assert.equal(ch.finish_reason, ref.finishReason === 'eos' ? 'stop' : 'length');
  assert.equal(r.json.usage.completion_tokens, ref.tokens.length);
});

test('n choices, text prompts, stop strings, concurrent requests', async () => {
  const r = await post('/v1/completions', { model, prompt: '3 7 1:', n: 3, max_tokens: 3, seed: 1 });
  assert.equal(r.status, 200);
  assert.deepEqual(
    r.json.choices.map((c: { index: number }) => c.index),
    [0, 1, 2],
  );
  const before = await batches();
  const rs = await Promise.all(
    Array.from({ length: 12 }, (_, i) =>
      post('/v1/completions', { model, prompt: promptIds(), max_tokens: 3, request_id: `c${i}`, rlstream_seed: 1 }),
    ),
  );
  assert.ok(rs.every((x) => x.status === 200));
  const after = await batches();
  // each decode run samples one token per running sequence; concurrent requests share runs
  // (test/unit/inference/batcher.test.ts checks when a request joins)
  const tokens = rs.reduce((n, x) => n + x.json.usage.completion_tokens, 0);
  assert.equal(after.sum - before.sum, tokens);
  assert.ok(after.count - before.count < tokens, `${after.count - before.count} runs for ${tokens} tokens`);
  // the same request id and seed give the same sample, whichever batch it ran in
  const again = await post('/v1/completions', {
    model,
    prompt: promptIds(),
    max_tokens: 3,
    request_id: 'c5',
    rlstream_seed: 1,
  });
  assert.equal(again.json.choices[0].text, rs[5].json.choices[0].text);
  const s = await post('/v1/completions', {
    model,
    prompt: promptIds(),
    max_tokens: 6,
    seed: 3,
    temperature: 1,
    stop: ['1', '2', '0'],
    return_token_ids: true,
  });
  const text: string = s.json.choices[0].text;
  assert.ok(!/[012]/.test(text), `stop strings cut the text: ${JSON.stringify(text)}`);
});

async function batches(): Promise<{ count: number; sum: number }> {
  const m = await (await fetch(server.url + '/metrics')).text();
  const v = (k: string) =>
    Number(new RegExp(`^rlstream_policy_server_batch_sequences_${k} (\\S+)$`, 'm').exec(m)?.[1] ?? 0);
  return { count: v('count'), sum: v('sum') };
}

test('chat completions through the chat template, streamed and not', async () => {
  const body = {
    model,
    messages: [{ role: 'user', content: '3 7 1' }],
    max_tokens: 3,
    request_id: 'chat-1',
    rlstream_seed: 2,
    return_token_ids: true,
    logprobs: true,
  };
  const r = await post('/v1/chat/completions', body);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal(r.json.object, 'chat.completion');
  assert.deepEqual(r.json.prompt_token_ids, Array.from(tok().encode('3 7 1:', { addSpecialTokens: false })));
  const ch = r.json.choices[0];
  assert.equal(ch.logprobs.content.length, ch.token_ids.length);
  const sse = await post('/v1/chat/completions', { ...body, stream: true });
  const chunks = (sse.json as string)
    .split('\n\n')
    .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
    .map((l) => JSON.parse(l.slice(6)));
  assert.ok((sse.json as string).trimEnd().endsWith('data: [DONE]'));
  assert.equal(chunks.map((c) => c.choices[0].delta.content ?? '').join(''), ch.message.content);
  assert.deepEqual(
    chunks.flatMap((c) => c.choices[0].token_ids ?? []),
    ch.token_ids,
  );
});

test('bad requests get OpenAI-style 4xx errors and the server keeps serving', async () => {
  const cases: Array<[unknown, number, RegExp]> = [
    [{ model: 'nope', prompt: 'x' }, 404, /does not exist/],
    [{ model, prompt: promptIds(), max_tokens: 1000 }, 400, /maximum context length is 32/],
    [{ model, prompt: 'x', temperature: -1 }, 400, /temperature/],
    [{ model, prompt: 'x', top_p: 0 }, 400, /top_p/],
    [{ model, prompt: [99999] }, 400, /outside the vocabulary/],
    ['{"model": ', 400, /not valid JSON/],
  ];
  for (const [body, status, msg] of cases) {
    const r = await post('/v1/completions', body);
    assert.equal(r.status, status, JSON.stringify(r.json));
    assert.match(r.json.error.message, msg);
    assert.equal(typeof r.json.error.type, 'string');
  }
  const big = await post('/v1/completions', JSON.stringify({ model, prompt: 'x'.repeat(100_000) }));
  assert.equal(big.status, 413);
  const chat = await post('/v1/chat/completions', { model, messages: [], max_tokens: 1 });
  assert.equal(chat.status, 400);
  assert.equal((await fetch(server.url + '/health')).status, 200);
});

test('logprobs with top_logprobs in both endpoints are the Scorer’s recomputation; out-of-range counts are 400', async () => {
  const ids = promptIds();
  const body = { model, max_tokens: 3, temperature: 0.9, rlstream_seed: 4, return_token_ids: true };
  const cmp = await post('/v1/completions', { ...body, prompt: ids, request_id: 'lp-a', logprobs: 3 });
  assert.equal(cmp.status, 200, JSON.stringify(cmp.json));
  const chat = await post('/v1/chat/completions', {
    ...body,
    messages: [{ role: 'user', content: '3 7 1' }],
    request_id: 'lp-a',
    logprobs: true,
    top_logprobs: 3,
  });
  assert.equal(chat.status, 200, JSON.stringify(chat.json));
  const scorer = new Scorer(run.model);
  const t = tok();
  /** The 3 most likely tokens at response position k, recomputed by a full forward per candidate. */
  const ranked = async (prompt: number[], response: number[], k: number) => {
    const all = await scorer.score(
      run.weights,
      Array.from({ length: run.model.vocabSize }, (_, v) => ({ prompt, response: [...response.slice(0, k), v] })),
      { temperature: 0.9, entropy: false },
    );
    const lp = all.map((s) => s.logprobs[k]);
    return {
      sampled: lp[response[k]],
      top: lp
        .map((l, v) => ({ v, lp: l }))
        .sort((a, b) => b.lp - a.lp)
        .slice(0, 3),
    };
  };
  const c0 = cmp.json.choices[0];
  const h0 = chat.json.choices[0];
  const content = h0.logprobs.content;
  assert.equal(content.length, h0.token_ids.length);
  for (let k = 0; k < h0.token_ids.length; k++) {
    const want = await ranked(chat.json.prompt_token_ids, h0.token_ids, k);
    const got = content[k].top_logprobs as Array<{ token: string; logprob: number; bytes: number[] }>;
    assert.deepEqual(
      got.map((x) => x.token),
      want.top.map((x) => t.decode([x.v])),
    );
    got.forEach((x, i) => assert.ok(Math.abs(x.logprob - want.top[i].lp) < 1e-4, `chat ${k} ${i}`));
    assert.ok(Math.abs(content[k].logprob - want.sampled) < 1e-4);
  }
  for (let k = 0; k < c0.token_ids.length; k++) {
    const want = await ranked(ids, c0.token_ids, k);
    const dict = c0.logprobs.top_logprobs[k] as Record<string, number>;
    for (const x of want.top) assert.ok(Math.abs(dict[t.decode([x.v])] - x.lp) < 1e-4, `completion ${k}`);
    assert.ok(t.decode([c0.token_ids[k]]) in dict, 'the sampled token is always listed');
  }
  for (const [path, extra] of [
    ['/v1/completions', { prompt: ids, logprobs: 21 }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: 21 }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], top_logprobs: 2 }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: -1 }],
  ] as const) {
    const r = await post(path, { model, max_tokens: 1, ...extra });
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.match(r.json.error.message, /logprobs/);
  }
});

test('stream: true sends each token as it is sampled, before the generation ends', async () => {
  const r = await fetch(server.url + '/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: promptIds(), max_tokens: 20, ignore_eos: true, stream: true, seed: 9 }),
  });
  assert.equal(r.headers.get('content-type'), 'text/event-stream');
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  const first = dec.decode((await reader.read()).value);
  assert.match(first, /^data: \{/);
  assert.ok(!first.includes('[DONE]'), 'the first read holds the first tokens, not the whole answer');
  let rest = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    rest += dec.decode(value);
  }
  const events = (first + rest).split('\n\n').filter((l) => l.startsWith('data: '));
  assert.equal(events.at(-1), 'data: [DONE]');
  const chunks = events.slice(0, -1).map((l) => JSON.parse(l.slice(6)));
  assert.equal(chunks.length, 20);
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
  const whole = await post('/v1/completions', {
    model,
    prompt: promptIds(),
    max_tokens: 20,
    ignore_eos: true,
    seed: 9,
  });
  assert.equal(chunks.map((ch) => ch.choices[0].text).join(''), whole.json.choices[0].text);
});

test('update_weights_from_disk loads a version; a new version in the run directory is followed', async () => {
  await run.writeVersion(1, 11);
  const r = await post('/update_weights_from_disk', { model_path: join(dir, 'policy/v000001'), weight_version: '1' });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  assert.equal(r.json.success, true);
  const c = await post('/v1/completions', { model, prompt: promptIds(), max_tokens: 2 });
  assert.equal(c.json.policy_version, 1);
  const missing = await post('/update_weights_from_disk', { model_path: join(dir, 'policy/v000099') });
  assert.equal(missing.status, 404);
  assert.equal(missing.json.success, false);
  await run.writeVersion(2, 12);
  const t0 = Date.now();
  while (server.version() !== 2 && Date.now() - t0 < 10_000) await new Promise((res) => setTimeout(res, 50));
  assert.equal(server.version(), 2, 'the server follows the run to version 2');
  const h = (await (await fetch(server.url + '/health')).json()) as { policy_version: number };
  assert.equal(h.policy_version, 2);
});
