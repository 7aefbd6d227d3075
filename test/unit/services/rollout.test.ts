import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createTokenizer } from '../../../lib/model/index.ts';
import { accuracyWithFormat } from '../../../lib/reward-fns/index.ts';
import { trajectoryGroups, generationRequests, type GenResult } from '../../../services/rollout/logic.ts';
import type { PromptBatch } from '../../../lib/contracts/index.ts';

const tok = createTokenizer({ type: 'alphabet', alphabet: '0123456789 :' });
const ids = (...xs: Array<number | string>) =>
  Int32Array.from(xs.flatMap((x) => (typeof x === 'number' ? [x] : [...tok.encode(x)])));

test('response text: the tokens before a final stop id (any of them), decoded without special tokens', () => {
  const score = (response: string) =>
    (accuracyWithFormat({ prompt: '3 7 1:', response, ground_truth: '1', kwargs: {} }) as { reward: number }).reward;
  const batch: PromptBatch = {
    run_id: 'r',
    id: 'g',
    step: 1,
    policy_version: 0,
    kind: 'train',
    epoch: 0,
    attempt: 0,
    sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 2 },
    groups: [
      {
        id: 'g',
        group_uid: 'u',
        n: 3,
        prompt_index: 0,
        dataset_index: 0,
        prompt_ids: ids(tok.bos, '3 7 1:'),
        prompt_text: '3 7 1:',
        images: [],
        image_refs: [],
        data_source: 't',
        ground_truth: '1',
        extra_info: '{}',
      },
    ],
  };
  const { requests, groups } = generationRequests([batch]);
  const gen = (i: number, t: Int32Array, finishReason: GenResult['finishReason']): GenResult => ({
    id: requests[i].id,
    tokens: t,
    logprobs: new Float32Array(t.length),
    finishReason,
  });
  // two stop ids (eos and, as a model's generation_config may add, bos); a special inside is dropped
  const [g] = trajectoryGroups(
    groups,
    requests,
    [gen(0, ids('1', tok.eos), 'eos'), gen(1, ids('1', tok.bos), 'eos'), gen(2, ids(' ', tok.pad, '1'), 'length')],
    (x) => tok.decode(x),
    [tok.eos, tok.bos],
  );
  assert.deepEqual(
    g.samples.map((s) => s.response_text),
    ['1', '1', ' 1'],
  );
  assert.deepEqual(
    g.samples.map((s) => Array.from(s.response_ids)),
    [Array.from(ids('1', tok.eos)), Array.from(ids('1', tok.bos)), Array.from(ids(' ', tok.pad, '1'))],
    'the token ids keep the stop id',
  );
  assert.deepEqual(
    g.samples.map((s) => s.finish_reason),
    ['stop', 'stop', 'length'],
  );
  assert.deepEqual(
    g.samples.map((s) => score(s.response_text)),
    [1.1, 1.1, 1.1],
  );
});
