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
  // how many batches depends on arrival times (test/unit/inference/batcher.test.ts checks the grouping)
  assert.ok(after.count - before.count <= 12);
  assert.equal(after.sum - before.sum, 12);
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
