import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createTokenizer } from '../../../lib/model/index.ts';
import { accuracyWithFormat } from '../../../lib/reward-fns/index.ts';
import { responseText, trajectoryGroups, generationRequests, type GenResult } from '../../../services/rollout/logic.ts';
import type { PromptBatch } from '../../../lib/contracts/index.ts';

const tok = createTokenizer({ type: 'alphabet', alphabet: '0123456789 :' });
const ids = (...xs: Array<number | string>) => Int32Array.from(xs.flatMap((x) => (typeof x === 'number' ? [x] : [...tok.encode(x)])));
const text = (...xs: Array<number | string>) => responseText(ids(...xs), (x) => tok.decode(x), tok);

test('responseText shows the special tokens the policy emitted instead of dropping them', () => {
  assert.equal(text('1'), '1');
  assert.equal(text(' 12'), ' 12');
  assert.equal(text(tok.pad, '1'), '<pad>1');
  assert.equal(text('1', tok.bos), '1<bos>');
  assert.equal(text('3', tok.eos, '4'), '3<eos>4');
  assert.equal(text(tok.pad, tok.pad), '<pad><pad>');
  assert.equal(text(), '');
  assert.equal(tok.decode(ids(tok.pad, '1')), '1', 'the tokenizer alone drops them (why responseText exists)');
  const byte = createTokenizer({ type: 'byte' });
  const b = Int32Array.from([...new TextEncoder().encode('é'), byte.bos, 0x41]);
  assert.equal(responseText(b, (x) => byte.decode(x), byte), 'é<bos>A', 'multi-byte characters decode whole between specials');
});

test('a response padded with specials is not scored as a clean answer; a final EOS is not part of the text', () => {
  const score = (response: string) => (accuracyWithFormat({ prompt: '3 7 1:', response, ground_truth: '1', kwargs: {} }) as { reward: number }).reward;
  assert.equal(score(text(tok.pad, '1')), 0);
  assert.equal(score(text('1', tok.bos)), 0);
  const batch: PromptBatch = {
    run_id: 'r', id: 'g', step: 1, policy_version: 0, kind: 'train', epoch: 0, attempt: 0,
    sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 2 },
    groups: [{ id: 'g', group_uid: 'u', n: 3, prompt_index: 0, dataset_index: 0, prompt_ids: ids(tok.bos, '3 7 1:'), prompt_text: '3 7 1:', images: [], data_source: 't', ground_truth: '1', extra_info: '{}' }],
  };
  const { requests, groups } = generationRequests([batch]);
  const gen = (i: number, t: Int32Array, finishReason: GenResult['finishReason']): GenResult => ({ id: requests[i].id, tokens: t, logprobs: new Float32Array(t.length), finishReason });
  const [g] = trajectoryGroups(groups, requests, [gen(0, ids('1', tok.eos), 'eos'), gen(1, ids(tok.pad, '1'), 'length'), gen(2, ids(' ', '1'), 'length')], (x) => responseText(x, (y) => tok.decode(y), tok), tok.eos);
  assert.deepEqual(g.samples.map((s) => s.response_text), ['1', '<pad>1', ' 1']);
  assert.deepEqual(g.samples.map((s) => s.finish_reason), ['stop', 'length', 'length']);
  assert.deepEqual(g.samples.map((s) => score(s.response_text)), [1.1, 0, 1.1]);
});
