/**
 * Multi-turn episodes (lib/env/episodes.ts): token-exact assembly with the policy-token mask,
 * turn records, discounted rewards, limits, failures stored with their reason, and continuous
 * batching (an episode waiting on a slow environment does not stall the others).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createTokenizer } from '../../../lib/model/index.ts';
import { EpisodeTokenizer } from '../../../lib/model/episode-tokens.ts';
import { runEpisodes, episodeMetrics, type EpisodeOptions, type TurnRequest } from '../../../lib/env/episodes.ts';
import { EnvError, type Environment, type EnvStep } from '../../../lib/env/index.ts';

const tok = createTokenizer({ type: 'alphabet', alphabet: '0123456789:<>?' });

/** A "policy" that guesses by binary search from the answers in its prompt (so the test knows its tokens). */
function searchPolicy(calls: Array<{ at: number; ids: string[] }>, t0: number) {
  return async (_key: string, reqs: TurnRequest[]) => {
    calls.push({ at: performance.now() - t0, ids: reqs.map((r) => r.id) });
    return reqs.map((r) => {
      const text = tok.decode(r.prompt);
      let lo = 1,
        hi = 16;
      for (const m of text.matchAll(/(\d+)([<>])/g)) {
        const g = Number(m[1]);
        if (m[2] === '>') lo = g + 1;
        else hi = g - 1;
      }
      const ids = [...tok.encode(String(Math.floor((lo + hi) / 2))), tok.eos].slice(0, r.maxNewTokens);
      return {
        id: r.id,
        tokens: Int32Array.from(ids),
        logprobs: Float32Array.from(ids, (_, i) => -0.5 - i),
        finishReason: ids[ids.length - 1] === tok.eos ? ('eos' as const) : ('length' as const),
      };
    });
  };
}

function game(
  delayMs: (id: string) => number = () => 0,
  fault?: (id: string, turn: number) => Error | null,
): Environment {
  return {
    name: 'test:guess',
    async start(row) {
      const secret = Number(row.ground_truth);
      let turn = 0;
      return {
        async step(m): Promise<EnvStep> {
          const f = fault?.(row.episode_id, turn);
          turn++;
          if (f) throw f;
          await new Promise((r) => setTimeout(r, delayMs(row.episode_id)));
          const g = Number(m.content);
          if (g === secret) return { messages: [], reward: 1, done: true, metrics: { solved: 1 } };
          return { messages: [{ role: 'user', content: g < secret ? '>' : '<' }], reward: 0, done: false, metrics: {} };
        },
        async close() {},
      };
    },
    async close() {},
  };
}

const spec = (id: string, secret: number) => ({
  id,
  prompt: tok.encode(':', { addSpecialTokens: true }),
  samplingKey: 'k',
  row: {
    episode_id: id,
    sample_index: 0,
    prompt_text: ':',
    ground_truth: String(secret),
    data_source: null,
    extra_info: {},
    kwargs: {},
  },
});

function options(
  env: Environment,
  generate: EpisodeOptions['generate'],
  over: Partial<EpisodeOptions> = {},
): EpisodeOptions {
  return {
    env,
    tokens: new EpisodeTokenizer(tok),
    decode: (ids) => tok.decode(ids),
    generate,
    maxResponseTokens: 40,
    maxTokensPerTurn: 3,
    maxAssistantTurns: 6,
    maxUserTurns: 6,
    gamma: 0.5,
    maxInFlight: 64,
    maxBatch: 64,
    now: () => performance.now(),
    ...over,
  };
}

test('an episode is the sampled ids and the environment segments, with the policy-token mask and turn spans', async () => {
  const calls: Array<{ at: number; ids: string[] }> = [];
  const [r] = await runEpisodes([spec('e', 11)], options(game(), searchPolicy(calls, performance.now())));
  // 8 > 12 < 10 > 11 (done)
  assert.equal(tok.decode(r.tokens), '8>12<10>11');
  const eos = tok.eos;
  const expectIds = [...tok.encode('8'), eos, ...tok.encode('>'), ...tok.encode('12'), eos, ...tok.encode('<')];
  assert.deepEqual([...r.tokens.subarray(0, expectIds.length)], expectIds);
  assert.deepEqual([...r.mask], [1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1]);
  r.mask.forEach((m, t) => {
    if (m === 0) assert.equal(r.logprobs[t], 0);
    else assert.ok(r.logprobs[t] < 0);
  });
  assert.equal(r.finishReason, 'eos');
  assert.equal(r.episode.assistant_turns, 4);
  assert.equal(r.episode.done, true);
  assert.equal(r.episode.reward, 0.5 ** 3); // the right guess at turn 3
  assert.equal(r.episode.failure, null);
  assert.deepEqual(r.episode.metrics, { solved: 1 });
  const roles = r.episode.turns.map((t) => `${t.role}:${t.text}:${t.start}-${t.end}`);
  assert.deepEqual(roles, [
    'assistant:8:0-2',
    'user:>:2-3',
    'assistant:12:3-6',
    'user:<:6-7',
    'assistant:10:7-10',
    'user:>:10-11',
    'assistant:11:11-14',
    'user::14-14',
  ]);
  // each turn's request carries the episode so far (its own randomness key per turn)
  assert.deepEqual(
    calls.map((c) => c.ids[0]),
    ['e/t0', 'e/t1', 'e/t2', 'e/t3'],
  );
});

test('max_assistant_turns and the token budget end an episode', async () => {
  const [short] = await runEpisodes([spec('a', 16)], options(game(), searchPolicy([], 0), { maxAssistantTurns: 2 }));
  assert.equal(short.episode.assistant_turns, 2);
  assert.equal(short.episode.done, false);
  assert.equal(short.episode.reward, 0);
  assert.equal(tok.decode(short.tokens), '8>12'); // no answer after the last turn
  const [cut] = await runEpisodes([spec('b', 16)], options(game(), searchPolicy([], 0), { maxResponseTokens: 5 }));
  assert.equal(cut.finishReason, 'length');
  assert.ok(cut.tokens.length <= 5);
});

test('an environment failure is stored on the episode with its reason (no reward), and counted', async () => {
  const env = game(
    () => 0,
    (id, turn) =>
      id === 'hang' && turn === 1
        ? new EnvError('timeout', 'test:guess step: no answer within 10 ms')
        : id === 'crash' && turn === 0
          ? new EnvError('crash', 'test:guess step threw: boom')
          : null,
  );
  const rs = await runEpisodes(
    [spec('hang', 13), spec('crash', 13), spec('ok', 13)],
    options(env, searchPolicy([], 0)),
  );
  assert.match(rs[0].episode.failure!, /^timeout: .*no answer within 10 ms/);
  assert.equal(rs[0].episode.timed_out, true);
  assert.equal(rs[0].episode.assistant_turns, 2);
  assert.match(rs[1].episode.failure!, /^crash: .*boom/);
  assert.equal(rs[2].episode.failure, null);
  const m = episodeMetrics(rs);
  assert.equal(m['env/timeouts'], 1);
  assert.equal(m['env/failures'], 2);
  // a non-environment error (a bug) is not an episode failure: it fails the batch
  const bad: Environment = { ...env, start: async () => Promise.reject(new Error('bug')) };
  await assert.rejects(runEpisodes([spec('x', 1)], options(bad, searchPolicy([], 0))), /bug/);
});

test('continuous batching: episodes waiting on a slow environment do not stall the others', async () => {
  const calls: Array<{ at: number; ids: string[] }> = [];
  const t0 = performance.now();
  const specs = [spec('slow', 1), ...Array.from({ length: 7 }, (_, i) => spec(`fast${i}`, 1 + 2 * i))];
  const rs = await runEpisodes(
    specs,
    options(
      game((id) => (id === 'slow' ? 400 : 0)),
      searchPolicy(calls, t0),
    ),
  );
  const slowEnd = rs[0].episode.turns.filter((t) => t.role === 'assistant').length;
  assert.ok(slowEnd >= 3);
  // every fast episode finished (all its turns generated) before the slow one's first answer came back
  const lastFast = Math.max(...calls.filter((c) => c.ids.some((id) => id.startsWith('fast'))).map((c) => c.at));
  const slowSecond = calls.find((c) => c.ids.includes('slow/t1'))!.at;
  assert.ok(lastFast < slowSecond, `fast episodes done at ${lastFast} ms, slow turn 2 at ${slowSecond} ms`);
  // the first turn of all 8 episodes was one batch
  assert.equal(calls[0].ids.length, 8);
  assert.ok(rs.every((r) => r.episode.done));
  // results do not depend on the batching: each episode alone gives the same tokens
  for (const [i, s] of specs.entries()) {
    const [alone] = await runEpisodes([s], options(game(), searchPolicy([], 0)));
    assert.deepEqual(alone.tokens, rs[i].tokens);
  }
});

test('a generate call holds requests of one token cap only: a first turn is not cut to another episode’s smaller remaining budget', async () => {
  // without a per-turn cap each turn may use what is left of the episode's budget, so episodes
  // whose guesses differ in length reach their next turn together with different caps
  const calls: number[][] = [];
  const policy = searchPolicy([], 0);
  const specs = Array.from({ length: 16 }, (_, i) => spec(`e${i}`, i + 1));
  const o = options(
    game(),
    async (key, reqs) => {
      calls.push(reqs.map((r) => r.maxNewTokens));
      // an engine samples a whole call with one cap (the rollout stage passes the first request's)
      return policy(
        key,
        reqs.map((r) => ({ ...r, maxNewTokens: reqs[0].maxNewTokens })),
      );
    },
    { maxTokensPerTurn: null, maxResponseTokens: 24 },
  );
  const rs = await runEpisodes(specs, o);
  for (const c of calls) assert.equal(new Set(c).size, 1, `one generate call mixed token caps ${JSON.stringify(c)}`);
  assert.ok(new Set(calls.flat()).size > 1, 'the episodes reached turns with different caps');
  // every episode is what it is alone (where no other request shares its calls)
  for (const [i, s] of specs.entries()) {
    const [alone] = await runEpisodes([s], options(game(), policy, { maxTokensPerTurn: null, maxResponseTokens: 24 }));
    assert.deepEqual(rs[i].tokens, alone.tokens, `episode ${s.id}`);
  }
});
