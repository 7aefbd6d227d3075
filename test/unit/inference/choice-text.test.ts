/**
 * ChoiceText: streamed deltas concatenate to the final text, never end inside a possible stop string
 * or a partial UTF-8 character, the text is cut at the first stop string, EOS ends the choice.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ChoiceText } from '../../../lib/inference/choice-text.ts';
import { ByteTokenizer } from '../../../lib/model/tokenizer.ts';

const tok = new ByteTokenizer();
const ids = (s: string) => Array.from(tok.encode(s, { addSpecialTokens: false }));

function feed(ct: ChoiceText, tokens: number[]): string[] {
  const deltas: string[] = [];
  for (const t of tokens) {
    const { delta, done } = ct.push(t, -1);
    deltas.push(delta);
    if (done) break;
  }
  if (!ct.finish) deltas.push(ct.end('length').delta);
  return deltas;
}

test('a stop string cuts the text; no delta shows a prefix of it', () => {
  const ct = new ChoiceText(tok, ['END'], new Set([tok.eos]), 100);
  const deltas = feed(ct, ids('ab ENx ENDyz'));
  assert.equal(ct.text, 'ab ENx ');
  assert.equal(ct.finish, 'stop');
  // 'E' and 'EN' of the stop string were held back, never sent and withdrawn
  assert.equal(deltas.join(''), 'ab ENx ');
  assert.deepEqual(deltas.slice(0, 4), ['', '', 'a', 'b']);
  assert.equal(ct.tokens.length, 'ab ENx END'.length, 'tokens are kept up to the one completing the stop string');
});

test('a multi-byte character is released whole; EOS and the token cap end the choice', () => {
  const ct = new ChoiceText(tok, [], new Set([tok.eos]), 100);
  const deltas = feed(ct, [...ids('é!'), tok.eos, ...ids('zz')]);
  assert.deepEqual(deltas, ['', 'é', '!', '']);
  assert.equal(ct.finish, 'stop');
  assert.equal(ct.text, 'é!');
  const capped = new ChoiceText(tok, [], new Set(), 2);
  assert.deepEqual(feed(capped, ids('abc')), ['a', 'b']);
  assert.equal(capped.finish, 'length');
});

test('deltas: false decodes once, on reading, to the text the streamed deltas give', () => {
  let decodes = 0;
  const counting = { decode: (t: ArrayLike<number>) => (decodes++, tok.decode(t)) };
  for (const [tokens, max] of [
    [[...ids('é!x'), tok.eos, ...ids('zz')], 100],
    [ids('abcdef'), 4],
  ] as const) {
    const streamed = new ChoiceText(tok, [], new Set([tok.eos]), max);
    const deltas = feed(streamed, [...tokens]);
    decodes = 0;
    const whole = new ChoiceText(counting, [], new Set([tok.eos]), max, false);
    assert.ok(feed(whole, [...tokens]).every((d) => d === ''));
    assert.equal(decodes, 0, 'nothing decoded per token');
    assert.equal(whole.text, streamed.text);
    assert.equal(whole.text, deltas.join(''));
    assert.equal(whole.finish, streamed.finish);
    assert.deepEqual(whole.tokens, streamed.tokens);
    assert.equal(decodes, 1);
  }
});
