import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parquetWriteFile } from 'hyparquet-writer';
import { loadConfig } from '../../../lib/config/index.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { loadTokenizerDir } from '../../../lib/model/hf-tokenizer.ts';
import { createTokenizer } from '../../../lib/model/tokenizer.ts';
import { promptRendering, renderPrompt } from '../../../lib/pipeline/data.ts';
import { loadSftExamples } from '../../../lib/sft/data.ts';
import { QWEN3_TOKENIZER_DIR } from '../../support/hf-model-dir.ts';

const dir = mkdtempSync(join(tmpdir(), 'rl-sft-data-'));
const qwen = loadTokenizerDir(QWEN3_TOKENIZER_DIR, { stopIds: [151645] });
const IM_END = 151645;

function file(name: string, rows: unknown[]): string {
  const f = join(dir, name);
  writeFileSync(f, rows.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('\n'));
  return f;
}
const cfgFor = (f: string, ...more: string[]) =>
  loadConfig({
    overrides: [`data.train_files=${f}`, 'data.chat_template_kwargs.enable_thinking=false', ...more],
    command: 'sft',
    env: {},
  });
/** The text of the loss tokens of an example. */
const lossText = (tokens: Int32Array, mask: Uint8Array) => qwen.decode(Array.from(tokens).filter((_, i) => mask[i]));

test('prompt + response through the Qwen3 chat template: the prompt is exactly what train feeds the policy; the loss is on the reply and <|im_end|>, not the newline after it', async () => {
  const f = file('pr.jsonl', [{ prompt: 'What is 2 + 3?', response: '2 + 3 = 5.\n#### 5' }]);
  const cfg = cfgFor(f);
  const { examples } = await loadSftExamples(cfg, qwen);
  const [e] = examples;
  const prompt = renderPrompt(qwen, 'What is 2 + 3?', null, promptRendering(cfg)).ids;
  assert.deepEqual(Array.from(e.tokens.subarray(0, prompt.length)), Array.from(prompt));
  assert.ok(Array.from(e.mask.subarray(0, prompt.length)).every((m) => m === 0));
  const inLoss = Array.from(e.tokens).filter((_, i) => e.mask[i]);
  assert.equal(inLoss[inLoss.length - 1], IM_END);
  assert.equal(lossText(e.tokens, e.mask), '2 + 3 = 5.\n#### 5');
  assert.equal(e.mask[e.mask.length - 1], 0); // the template's "\n" after <|im_end|>
  assert.equal(qwen.decode(e.tokens.subarray(e.tokens.length - 1)), '\n');
  assert.equal(e.source, `${f}:1`);
});

test('a conversation has the loss on every assistant turn and its <|im_end|>, and on nothing else (Qwen3 writes earlier turns without the think block)', async () => {
  const messages = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Hi' },
    { role: 'assistant', content: 'Hello!' },
    { role: 'user', content: '1 + 1?' },
    { role: 'assistant', content: '2' },
  ];
  const j = file('conv.jsonl', [{ conv: messages }]);
  const { examples } = await loadSftExamples(cfgFor(j, 'sft.messages_key=conv'), qwen);
  assert.equal(lossText(examples[0].tokens, examples[0].mask), 'Hello!2');
  assert.equal(examples[0].tokens.filter((t) => t === IM_END).length, 5);
  assert.equal(Array.from(examples[0].tokens).filter((t, i) => t === IM_END && examples[0].mask[i]).length, 2);
});

test('parquet rows with prompt + response columns load like JSONL rows (row numbers as lines)', async () => {
  const f = join(dir, 'pr.parquet');
  parquetWriteFile({
    filename: f,
    columnData: [
      { name: 'prompt', data: ['a?', 'b?'], type: 'STRING' },
      { name: 'response', data: ['A', ''], type: 'STRING' },
    ],
  });
  const { examples, skipped } = await loadSftExamples(cfgFor(f, 'data.on_bad_row=skip'), qwen);
  assert.equal(lossText(examples[0].tokens, examples[0].mask), 'A');
  assert.deepEqual(
    skipped.map((s) => s.where),
    [`${f}:2`],
  );
  assert.match(skipped[0].reason, /no response: "response" \(sft\.response_key\) is ""/);
});

test('bad rows: one line each naming file:line and what to change; data.on_bad_row=skip reports them instead', async () => {
  const f = file('bad.jsonl', [
    { prompt: 'ok', response: 'fine' },
    { prompt: 'no reply here' },
    { messages: [{ role: 'user', content: 'hello?' }] },
    { prompt: 'long', response: 'x '.repeat(80) },
  ]);
  const cases: Array<[string, RegExp]> = [
    [`${f}:2`, /no response: "response" \(sft\.response_key\) is missing/],
    [`${f}:3`, /no assistant turn in "messages" \(roles: user\)/],
    [
      `${f}:4`,
      /prompt \+ response is \d+ tokens \(prompt \d+, response \d+\), over sft\.max_length = 64; raise sft\.max_length/,
    ],
  ];
  await assert.rejects(
    loadSftExamples(cfgFor(f, 'sft.max_length=64'), qwen),
    (e: unknown) =>
      e instanceof ConfigError &&
      e.message.startsWith(`${f}:2: `) &&
      cases[0][1].test(e.message) &&
      /data\.on_bad_row=skip/.test(e.message) &&
      !e.message.includes('\n'),
  );
  const { examples, skipped } = await loadSftExamples(cfgFor(f, 'sft.max_length=64', 'data.on_bad_row=skip'), qwen);
  assert.equal(examples.length, 1);
  assert.deepEqual(
    skipped.map((s) => s.where),
    cases.map((c) => c[0]),
  );
  skipped.forEach((s, i) => assert.match(s.reason, cases[i][1]));
});

test('without a chat template (byte tokenizer): BOS + prompt, then the response and EOS in the loss; a conversation is tokenised as an episode', async () => {
  const byte = createTokenizer({ type: 'byte' });
  const f = file('byte.jsonl', [{ q: '1+2=', a: '3' }]);
  const { examples } = await loadSftExamples(cfgFor(f, 'sft.prompt_key=q', 'sft.response_key=a'), byte);
  assert.deepEqual(Array.from(examples[0].tokens), [byte.bos, ...Buffer.from('1+2=3'), byte.eos]);
  assert.deepEqual(Array.from(examples[0].mask), [0, 0, 0, 0, 0, 1, 1]);
  // a tool episode: the prompt with BOS, each assistant reply + EOS in the loss, the tool's answer as context
  const g = file('byte-conv.jsonl', [
    {
      messages: [
        { role: 'user', content: 'a' },
        { role: 'assistant', content: 'bc' },
        { role: 'tool', content: 'd' },
        { role: 'assistant', content: 'e' },
      ],
    },
    {
      messages: [
        { role: 'system', content: 's' },
        { role: 'user', content: 'a' },
        { role: 'assistant', content: 'b' },
      ],
    },
  ]);
  const cfg = cfgFor(g, 'data.on_bad_row=skip');
  const conv = await loadSftExamples(cfg, byte);
  assert.deepEqual(Array.from(conv.examples[0].tokens), [
    byte.bos,
    ...Buffer.from('abc'),
    byte.eos,
    ...Buffer.from('de'),
    byte.eos,
  ]);
  assert.deepEqual(Array.from(conv.examples[0].mask), [0, 0, 1, 1, 1, 0, 1, 1]);
  assert.match(conv.skipped[0].reason, /starts with the user's prompt, not a system message/);
});
