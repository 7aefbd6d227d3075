/**
 * A tokenizer.json whose vocabulary is broken (a list instead of a map, an id that is not an
 * integer, a missing vocab, a bad added token) is refused when the model directory is loaded, in
 * one line naming the file and what is wrong — not a TypeError from inside encode later.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadTokenizerDir } from '../../../lib/model/hf-tokenizer.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { QWEN3_TOKENIZER_DIR } from '../../support/hf-model-dir.ts';

const root = mkdtempSync(join(tmpdir(), 'rlstream-badvocab-'));
after(() => rmSync(root, { recursive: true, force: true }));
const original = JSON.parse(readFileSync(join(QWEN3_TOKENIZER_DIR, 'tokenizer.json'), 'utf8'));

function damaged(name: string, edit: (j: any) => void): string {
  const dir = join(root, name);
  const j = structuredClone(original);
  edit(j);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir);
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(j));
  copyFileSync(join(QWEN3_TOKENIZER_DIR, 'tokenizer_config.json'), join(dir, 'tokenizer_config.json'));
  return dir;
}

const CASES: Array<[string, (j: any) => void, RegExp]> = [
  ['a list', (j) => void (j.model.vocab = [1, 2]), /model\.vocab must map tokens to ids, got a list/],
  ['a string', (j) => void (j.model.vocab = 'x'), /model\.vocab must map tokens to ids, got string/],
  ['an id that is not a number', (j) => void (j.model.vocab['hello'] = 'oops'), /token "hello" has id "oops"/],
  ['a negative id', (j) => void (j.model.vocab['hello'] = -3), /token "hello" has id -3/],
  ['missing', (j) => void delete j.model.vocab, /model\.vocab is missing/],
  ['a bad added token', (j) => void (j.added_tokens[0] = { content: 7 }), /added_tokens\[0\]/],
];

for (const [what, edit, want] of CASES)
  test(`a vocabulary with ${what}: one ConfigError naming the file`, () => {
    const dir = damaged(what.replace(/\W+/g, '-'), edit);
    assert.throws(
      () => loadTokenizerDir(dir).encode('hello world'),
      (e: Error) =>
        e instanceof ConfigError &&
        e.message.includes(join(dir, 'tokenizer.json')) &&
        /vocabulary is broken/.test(e.message) &&
        want.test(e.message),
    );
  });

test('the intact tokenizer loads and encodes', () => {
  assert.ok(loadTokenizerDir(QWEN3_TOKENIZER_DIR).encode('hello world').length > 0);
});
