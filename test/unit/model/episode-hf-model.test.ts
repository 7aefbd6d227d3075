/**
 * A multi-turn episode sampled by a random-weight Qwen3 model directory (Qwen3's real tokenizer
 * and chat template) is token-exact against the Python reference: the policy's tokens are the
 * sampled ids, every environment segment equals the text Python jinja2 renders between the
 * assistant turns of the whole conversation, tokenised by native `tokenizers`; the behaviour
 * log-probs at policy tokens agree with an independent recomputation (the scorer over the whole
 * episode), and environment tokens carry none.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { fromHfConfig, stopTokenIds } from '../../../lib/model/config.ts';
import { initWeights } from '../../../lib/model/init.ts';
import { paramSpecs } from '../../../lib/model/params.ts';
import { loadCheckpoint } from '../../../lib/model/checkpoint.ts';
import { Sampler } from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { EpisodeTokenizer } from '../../../lib/model/episode-tokens.ts';
import { loadConfig } from '../../../lib/config/index.ts';
import { policyModelConfig, tokenizerFor } from '../../../lib/pipeline/policy.ts';
import { runEpisodes } from '../../../lib/env/episodes.ts';
import type { Environment } from '../../../lib/env/index.ts';
import { QWEN3_TOKENIZER_DIR, tinyQwen3Config, writeHfModelDir } from '../../support/hf-model-dir.ts';

const root = mkdtempSync(join(tmpdir(), 'rlstream-episode-hf-'));
after(() => rmSync(root, { recursive: true, force: true }));

const qwen3 = tinyQwen3Config({
  hidden_size: 16,
  intermediate_size: 16,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 8,
});

/** Answers every assistant turn with a user message, then a tool message, then done. */
const scripted: Environment = {
  name: 'test:scripted',
  async start() {
    let turn = 0;
    return {
      async step() {
        turn++;
        if (turn === 1)
          return {
            messages: [{ role: 'user', content: 'Not quite — try again.' }],
            reward: 0,
            done: false,
            metrics: {},
          };
        if (turn === 2)
          return { messages: [{ role: 'tool', content: '{"result": 42}' }], reward: 0.5, done: false, metrics: {} };
        return { messages: [], reward: 1, done: true, metrics: {} };
      },
      async close() {},
    };
  },
  async close() {},
};

test('a multi-turn Qwen3-template episode on a random-weight model directory is token-exact against Python jinja2 + native tokenizers', async () => {
  const dir = join(root, 'qwen3');
  const c0 = fromHfConfig(qwen3);
  writeHfModelDir(dir, {
    config: qwen3,
    generation: { eos_token_id: [151645, 151643] },
    tensors: paramSpecs(c0).map((s) => [s.name, s.shape]),
    weights: initWeights(c0, 3, { std: 0.5 }),
    dtype: 'float32',
    shards: 1,
    tokenizerFrom: QWEN3_TOKENIZER_DIR,
  });
  const cfg = loadConfig({
    overrides: [
      `actor.model.path=${dir}`,
      'data.task=number_game',
      'data.max_prompt_length=32',
      'data.max_response_length=96',
    ],
  });
  const tok = tokenizerFor(cfg);
  const model = policyModelConfig(cfg, tok);
  const weights = (await loadCheckpoint(dir)).weights;
  const sampler = new Sampler(model, { threads: 1 });
  const kwargs = {}; // (enable_thinking: false adds the empty think block to each generation prompt: episode-tokens.test.ts)
  const prompt: Array<{ role: string; content: string }> = [{ role: 'user', content: 'Guess my number.' }];
  const promptIds = tok.encode(tok.chatTemplate!.render(prompt, { addGenerationPrompt: true, kwargs }));
  const [ep] = await runEpisodes(
    [
      {
        id: 'hf/ep0',
        prompt: promptIds,
        samplingKey: 'k',
        row: {
          episode_id: 'hf/ep0',
          sample_index: 0,
          prompt_text: prompt[0].content,
          ground_truth: null,
          data_source: null,
          extra_info: {},
          kwargs: {},
        },
      },
    ],
    {
      env: scripted,
      tokens: new EpisodeTokenizer(tok, kwargs),
      decode: (ids) => tok.decode(ids),
      generate: (_k, reqs) =>
        sampler.generate(
          weights,
          reqs.map((r) => ({ id: r.id, prompt: r.prompt })),
          { temperature: 1, maxNewTokens: reqs[0].maxNewTokens, seed: 5, eosTokenIds: stopTokenIds(model) },
        ),
      maxResponseTokens: 96,
      maxTokensPerTurn: 8,
      maxAssistantTurns: 3,
      maxUserTurns: 3,
      gamma: 1,
      maxInFlight: 1,
      maxBatch: 8,
      now: () => performance.now(),
    },
  );
  assert.equal(ep.episode.failure, null);
  const assistant = ep.episode.turns.filter((t) => t.role === 'assistant');
  assert.equal(assistant.length, 3);
  // a turn cut by max_tokens_per_turn has no stop token: the template's closing is then environment tokens
  const ids = [...ep.tokens];
  const mask = [...ep.mask];

  // reference: Python jinja2 renders the whole conversation (assistant contents = the sampled
  // text); between consecutive assistant contents lies the environment's segment
  const cfgJson = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8'));
  const messages: Array<{ role: string; content: string }> = [...prompt];
  for (const t of ep.episode.turns)
    if (t.role !== 'system' && (t.role === 'assistant' || t.end > t.start || t.text))
      messages.push({ role: t.role, content: t.text });
  // a done episode's last environment answer adds no message
  while (messages.at(-1)!.role !== 'assistant') messages.pop();
  const ref: string = JSON.parse(
    execFileSync('/usr/bin/python3', [join(import.meta.dirname, '../../support/jinja-reference.py')], {
      input: JSON.stringify([
        {
          template: cfgJson.chat_template,
          messages,
          add_generation_prompt: false,
          context: { bos_token: null, eos_token: '<|im_end|>', ...kwargs },
        },
      ]),
    }).toString('utf8'),
  )[0];
  const native = (
    createRequire(import.meta.url)('tokenizers') as {
      Tokenizer: {
        fromFile(f: string): {
          encode(s: string, p: null, o: { addSpecialTokens: boolean }): Promise<{ getIds(): number[] }>;
        };
      };
    }
  ).Tokenizer.fromFile(join(dir, 'tokenizer.json'));
  let pos = ref.indexOf('<|im_start|>assistant\n');
  const stopText = '<|im_end|>';
  for (let k = 0; k < assistant.length; k++) {
    const a = assistant[k];
    // the policy's tokens are the sampled ids, mask 1, and their text is the assistant content
    assert.ok(mask.slice(a.start, a.end).every((m) => m === 1));
    const at = ref.indexOf(a.text, pos);
    assert.ok(at >= 0, `assistant turn ${k} text in the reference`);
    pos = at + a.text.length;
    if (k === assistant.length - 1) break;
    // the environment segment: after the stop token the policy sampled, up to the next assistant content
    assert.ok(ref.startsWith(stopText, pos), 'the template closes the turn with the stop token');
    const next = ref.indexOf(assistant[k + 1].text, pos + stopText.length);
    let text = ref.slice(pos + stopText.length, next);
    // Qwen3 renders the conversation's last assistant message after an empty think block, which
    // is not what the policy saw before that turn (docs/agents.md: not append-only)
    if (k === assistant.length - 2) text = text.replace(/<think>\n\n<\/think>\n\n$/, '');
    const want = (await native.encode(text, null, { addSpecialTokens: false })).getIds();
    const segEnd = assistant[k + 1].start;
    const sampledStop = ids[a.end - 1] === 151645; // the turn ended with <|im_end|> (else the closing is the environment's)
    const seg = ids.slice(a.end, segEnd);
    assert.deepEqual(seg, sampledStop ? want : [151645, ...want], `environment segment ${k}`);
    assert.ok(mask.slice(a.end, segEnd).every((m) => m === 0));
    pos = next;
  }
  // an independent recomputation of the behaviour log-probs over the whole episode agrees at policy tokens
  const [scored] = await new Scorer(model, { threads: 1 }).score(
    weights,
    [{ prompt: promptIds, response: ep.tokens }],
    {
      entropy: false,
    },
  );
  let policyTokens = 0;
  for (let t = 0; t < ids.length; t++) {
    if (mask[t] === 1) {
      policyTokens++;
      assert.ok(
        Math.abs(scored.logprobs[t] - ep.logprobs[t]) < 2e-3,
        `token ${t}: ${scored.logprobs[t]} vs ${ep.logprobs[t]}`,
      );
    } else assert.equal(ep.logprobs[t], 0);
  }
  assert.ok(policyTokens >= 3);
  assert.ok(mask.includes(0));
});
