/**
 * The tools environment (lib/env/tools-env.ts) and its executors: it passes the environment
 * contract suite wrapping the guess-number module (calls never made, every message goes to the
 * inner environment); a calc episode through runEpisodes with the module executor and with HTTP
 * endpoints, where malformed calls, unknown tools, a throwing, hanging, 5xx or unreachable tool are
 * answered to the model as `Error: …` tool messages, recorded on their turns (name, arguments,
 * error, latency) and counted (env/tool_calls_mean, env/tool_error_rate), never an episode failure.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { createMultiTurnEnvironment, type MultiTurnEnvConfig } from '../../../lib/env/index.ts';
import { runEpisodes, episodeMetrics, type TurnRequest } from '../../../lib/env/episodes.ts';
import { EpisodeTokenizer } from '../../../lib/model/episode-tokens.ts';
import { createTokenizer } from '../../../lib/model/index.ts';
import { envContract, row } from '../../support/env-contract.ts';

const EXAMPLES = join(import.meta.dirname, '../../../examples');
const CALC_TOOL = {
  type: 'function',
  function: { name: 'calc', parameters: { type: 'object', properties: { expression: { type: 'string' } } } },
};
const config = (over: Partial<MultiTurnEnvConfig> = {}): MultiTurnEnvConfig => ({
  interaction: { type: 'module', path: null, url: null, timeout_s: 5, max_retries: 0 },
  format: 'hermes',
  tool_config_path: null,
  tools: [CALC_TOOL],
  max_parallel_calls: 2,
  tool_executor: {
    type: 'module',
    path: join(EXAMPLES, 'calculator/calc.ts'),
    url: null,
    timeout_s: 0.3,
    max_retries: 1,
  },
  ...over,
});

envContract('tools adapter (wrapping the guess-number module)', async () => ({
  env: await createMultiTurnEnvironment(
    config({
      interaction: {
        type: 'module',
        path: join(EXAMPLES, 'guess-number/env.ts'),
        url: null,
        timeout_s: 5,
        max_retries: 0,
      },
    }),
  ),
  close: async () => {},
}));

const tok = createTokenizer({ type: 'byte' });
const call = (expression: string) =>
  `<tool_call>{"name": "calc", "arguments": {"expression": "${expression}"}}</tool_call>`;

/** A scripted policy: the assistant texts of each episode, turn by turn. */
function scripted(script: Record<string, string[]>) {
  return async (_key: string, reqs: TurnRequest[]) =>
    reqs.map((r) => {
      const [ep, t] = r.id.split('/t');
      const ids = [...tok.encode(script[ep][Number(t)]), tok.eos];
      return {
        id: r.id,
        tokens: Int32Array.from(ids),
        logprobs: new Float32Array(ids.length).fill(-1),
        finishReason: 'eos' as const,
      };
    });
}

async function play(
  env: Awaited<ReturnType<typeof createMultiTurnEnvironment>>,
  script: Record<string, string[]>,
  answer = '5535',
  limits: { maxAssistantTurns?: number; maxResponseTokens?: number } = {},
) {
  return runEpisodes(
    Object.keys(script).map((id) => ({
      id,
      prompt: tok.encode('123*45=', { addSpecialTokens: true }),
      samplingKey: 'k',
      row: { ...row(1, id), ground_truth: answer },
    })),
    {
      env,
      tokens: new EpisodeTokenizer(tok),
      decode: (ids) => tok.decode(ids),
      generate: scripted(script),
      maxResponseTokens: 1000,
      maxTokensPerTurn: null,
      maxAssistantTurns: 4,
      maxUserTurns: 4,
      gamma: 1,
      maxInFlight: 8,
      maxBatch: 8,
      now: () => performance.now(),
      ...limits,
    },
  );
}

test('module tools: results and errors come back as tool messages, recorded and counted; the final answer goes to the inner environment', async () => {
  const env = await createMultiTurnEnvironment(
    config({
      interaction: {
        type: 'module',
        path: join(EXAMPLES, 'calculator/env.ts'),
        url: null,
        timeout_s: 5,
        max_retries: 0,
      },
    }),
  );
  const rs = await play(env, {
    good: [call('123*45'), '5535'],
    errors: [
      `${call('12/3')}<tool_call>{"name": "calc", "arguments": {"expression": "1+"</tool_call>`,
      '<tool_call>{"name": "sqrt", "arguments": {"x": 4}}</tool_call>',
      `${call('1')}${call('2')}${call('3')}`,
      '17',
    ],
  });
  const [good, errors] = rs;
  assert.equal(good.episode.failure, null);
  assert.equal(good.episode.reward, 1);
  assert.equal(good.episode.done, true);
  assert.deepEqual([good.episode.tool_calls, good.episode.tool_errors], [1, 0]);
  const tool = good.episode.turns.find((t) => t.role === 'tool')!;
  assert.deepEqual(
    [tool.text, tool.tool_name, tool.arguments, tool.error],
    ['5535', 'calc', '{"expression":"123*45"}', null],
  );
  // the tool's answer is environment tokens, exactly its text: mask 0 over "5535"
  const seg = good.tokens.slice(tool.start, tool.end);
  assert.equal(tok.decode(seg), '5535');
  assert.ok([...good.mask.slice(tool.start, tool.end)].every((m) => m === 0));

  assert.equal(errors.episode.failure, null);
  assert.equal(errors.episode.reward, 0);
  const tools = errors.episode.turns.filter((t) => t.role === 'tool');
  assert.deepEqual(
    tools.map((t) => [t.tool_name, t.error?.replace(/ \(.*$|:.*$/, '') ?? null]),
    [
      ['calc', 'calc'], // calc threw: only integers, + - * and ( ) are allowed
      [null, 'malformed tool call'],
      ['sqrt', 'unknown tool "sqrt"'],
      ['calc', null],
      ['calc', null],
      ['calc', 'only 2 tool call(s) per message are run; this one was not'],
    ],
  );
  assert.ok(tools.every((t) => (t.error === null) === !t.text.startsWith('Error: ')));
  assert.match(tools[0].text, /^Error: calc: only integers/);
  assert.deepEqual([errors.episode.tool_calls, errors.episode.tool_errors], [6, 4]);
  const m = episodeMetrics(rs);
  assert.equal(m['env/tool_calls_mean'], 3.5);
  assert.equal(m['env/tool_error_rate'], 4 / 7);
});

test('calls made on the last allowed turn, or answered past the token budget, keep their per-call records', async () => {
  const env = await createMultiTurnEnvironment(config());
  const script = { e: [`${call('691*453')}${call('1/2')}`] };
  const expected = [
    ['tool', 'calc', '{"expression":"691*453"}', null, '313023'],
    ['tool', 'calc', '{"expression":"1/2"}', 'calc', 'Error'],
  ];
  const records = (r: Awaited<ReturnType<typeof play>>[number]) => {
    const tools = r.episode.turns.filter((t) => t.role === 'tool');
    for (const t of tools) {
      assert.ok(t.latency_ms >= 0);
      assert.equal(t.start, t.end, 'no tokens: nothing follows the answer');
    }
    return tools.map((t) => [
      t.role,
      t.tool_name,
      t.arguments,
      t.error?.replace(/:.*$/, '') ?? null,
      t.text.replace(/:.*$/, ''),
    ]);
  };
  // max_assistant_turns: 1 — the calls run and are answered, but no turn follows
  const [last] = await play(env, script, '313023', { maxAssistantTurns: 1 });
  assert.equal(last.episode.assistant_turns, 1);
  assert.deepEqual([last.episode.tool_calls, last.episode.tool_errors], [2, 1]);
  assert.deepEqual(records(last), expected);
  assert.equal(tok.decode(last.tokens), call('691*453') + call('1/2') + tok.decode([tok.eos]));
  // a token budget the answers do not fit: the same records, then the cut as a system turn
  const [cut] = await play(env, script, '313023', { maxResponseTokens: last.tokens.length + 3 });
  assert.deepEqual(records(cut), expected);
  const end = cut.episode.turns.at(-1)!;
  assert.deepEqual([end.role, end.tool_name], ['system', null]);
  assert.match(end.error!, /does not fit the episode token budget/);
  assert.equal(cut.finishReason, 'length');
});

test('without an interaction the first message without a call ends the episode; a hanging tool times out as a tool error', async () => {
  const { mkdtempSync, writeFileSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const dir = mkdtempSync(join(tmpdir(), 'tools-'));
  writeFileSync(join(dir, 'slow.mjs'), 'export const calc = () => new Promise(() => {});\n');
  const env = await createMultiTurnEnvironment(
    config({
      tool_executor: { type: 'module', path: join(dir, 'slow.mjs'), url: null, timeout_s: 0.1, max_retries: 0 },
    }),
  );
  const [r] = await play(env, { hang: [call('1+1'), 'no idea'] });
  assert.equal(r.episode.failure, null);
  assert.equal(r.episode.done, true);
  assert.equal(r.episode.assistant_turns, 2);
  assert.match(r.episode.turns[1].error!, /no answer within 100 ms/);
  await assert.rejects(
    createMultiTurnEnvironment(
      config({
        tool_executor: { type: 'module', path: join(dir, 'slow.mjs'), url: null, timeout_s: 1, max_retries: 0 },
        tools: [CALC_TOOL, { type: 'function', function: { name: 'now' } }],
      }),
    ),
    /must export a function per tool; missing: now/,
  );
  await assert.rejects(
    createMultiTurnEnvironment(config({ tools: [{ type: 'function', function: {} }] })),
    /rollout\.multi_turn\.tools\[0\]/,
  );
});

test('HTTP tools: POST <url>/<name>; a 5xx is retried, {error} / 4xx / bad JSON / unreachable are tool errors', async () => {
  let calls = 0;
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      calls++;
      const { arguments: a, episode_id } = JSON.parse(body) as {
        arguments: { expression: string };
        episode_id: string;
      };
      assert.equal(req.url, '/calc');
      assert.ok(episode_id.startsWith('h'));
      const e = a.expression;
      if (e === 'flaky' && calls % 2 === 1) {
        res.statusCode = 503;
        return res.end('busy');
      }
      if (e === 'flaky') return res.end(JSON.stringify({ result: 'ok after a retry' }));
      if (e === 'err') return res.end(JSON.stringify({ error: 'division by zero' }));
      if (e === 'json') return res.end('{"result": ');
      if (e === '400') {
        res.statusCode = 400;
        return res.end('bad expression');
      }
      res.end(JSON.stringify({ result: Number(e) * 2 }));
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    const env = await createMultiTurnEnvironment(
      config({ tool_executor: { type: 'http', path: null, url, timeout_s: 2, max_retries: 1 } }),
    );
    const rs = await play(env, {
      h1: [call('21'), call('flaky'), call('err'), call('json')],
      h2: [call('400'), 'done'],
    });
    const texts = rs.map((r) => r.episode.turns.filter((t) => t.role === 'tool').map((t) => t.text));
    assert.deepEqual(texts[0].slice(0, 3), ['42', 'ok after a retry', 'Error: division by zero']);
    assert.match(texts[0][3], /^Error: .*not JSON/);
    assert.match(texts[1][0], /^Error: .*HTTP 400: bad expression/);
    assert.deepEqual(
      rs.map((r) => [r.episode.tool_calls, r.episode.tool_errors, r.episode.failure]),
      [
        [4, 2, null],
        [1, 1, null],
      ],
    );
  } finally {
    server.close();
  }
  const gone = await createMultiTurnEnvironment(
    config({ tool_executor: { type: 'http', path: null, url, timeout_s: 1, max_retries: 1 } }),
  );
  const [r] = await play(gone, { h3: [call('1'), 'x'] });
  assert.equal(r.episode.failure, null);
  assert.match(r.episode.turns[1].text, /^Error: .*after 2 attempts/);
});
