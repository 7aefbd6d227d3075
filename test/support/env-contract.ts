/**
 * The environment port's contract suite (lib/env/port.ts), run against every adapter with the
 * guess-number game behind it (examples/guess-number: env.ts as a module, env_server.py over HTTP).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { EnvRow, Environment } from '../../lib/env/index.ts';

export const row = (secret: number, id = `ep-${secret}`): EnvRow => ({
  episode_id: id,
  sample_index: 0,
  prompt_text: ':',
  ground_truth: String(secret),
  data_source: 'guess_number',
  extra_info: {},
  kwargs: {},
});

/** Binary search over 1..16 through the environment; returns the guesses and rewards. */
async function play(env: Environment, secret: number, id?: string) {
  const ep = await env.start(row(secret, id));
  let lo = 1,
    hi = 16;
  const guesses: number[] = [];
  let total = 0;
  for (let t = 0; t < 8; t++) {
    const g = Math.floor((lo + hi) / 2);
    guesses.push(g);
    const r = await ep.step({ role: 'assistant', content: String(g) });
    total += r.reward;
    if (r.done) {
      assert.deepEqual(r.messages, []);
      await ep.close();
      return { guesses, total, done: true };
    }
    assert.equal(r.messages.length, 1);
    assert.equal(r.messages[0].role, 'user');
    if (r.messages[0].content === '>') lo = g + 1;
    else if (r.messages[0].content === '<') hi = g - 1;
    else assert.fail(`unexpected answer ${r.messages[0].content}`);
  }
  await ep.close();
  return { guesses, total, done: false };
}

export function envContract(name: string, make: () => Promise<{ env: Environment; close(): Promise<void> }>): void {
  test(`${name}: an episode runs from start to done, with the turn's reward and messages`, async () => {
    const { env, close } = await make();
    try {
      for (const secret of [1, 7, 16]) {
        const r = await play(env, secret);
        assert.ok(r.done);
        assert.equal(r.total, 1);
        assert.equal(r.guesses[r.guesses.length - 1], secret);
        assert.ok(r.guesses.length <= 5);
      }
    } finally {
      await close();
    }
  });

  test(`${name}: concurrent episodes are independent`, async () => {
    const { env, close } = await make();
    try {
      const rs = await Promise.all([3, 9, 14, 3].map((s, i) => play(env, s, `concurrent-${i}`)));
      assert.deepEqual(
        rs.map((r) => r.guesses[r.guesses.length - 1]),
        [3, 9, 14, 3],
      );
      assert.deepEqual(rs[0].guesses, rs[3].guesses);
    } finally {
      await close();
    }
  });

  test(`${name}: a message that is not a guess gets an answer and the episode goes on`, async () => {
    const { env, close } = await make();
    try {
      const ep = await env.start(row(5, 'bad-guess'));
      const r = await ep.step({ role: 'assistant', content: 'seventeen' });
      assert.equal(r.done, false);
      assert.equal(r.reward, 0);
      assert.deepEqual(r.messages, [{ role: 'user', content: '?' }]);
      assert.equal((await ep.step({ role: 'assistant', content: '5' })).done, true);
      await ep.close();
    } finally {
      await close();
    }
  });

  test(`${name}: kwargs.letters: a guess is one letter, A = 1 … P = 16; digits are not guesses`, async () => {
    const { env, close } = await make();
    try {
      const ep = await env.start({ ...row(11, 'letters'), kwargs: { letters: true } });
      const say = async (content: string) => (await ep.step({ role: 'assistant', content })).messages;
      assert.deepEqual(await say('11'), [{ role: 'user', content: '?' }]);
      assert.deepEqual(await say('H'), [{ role: 'user', content: '>' }]);
      assert.deepEqual(await say('L'), [{ role: 'user', content: '<' }]);
      const r = await ep.step({ role: 'assistant', content: 'K' });
      assert.deepEqual([r.done, r.reward], [true, 1]);
      await ep.close();
    } finally {
      await close();
    }
  });

  test(`${name}: a row the environment refuses fails the start`, async () => {
    const { env, close } = await make();
    try {
      await assert.rejects(env.start(row(99, 'bad-row')), (e: Error) => e.name === 'EnvError');
    } finally {
      await close();
    }
  });
}
