/**
 * NFT in the update stage (pure logic): each response's ±1 outcome from a binary reward metric,
 * the accuracy of its whole group, and a clear error for rewards that are not a correctness.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { nftTargets, type NftGroupInput } from '../../../services/update/logic.ts';
import { ConfigError } from '../../../lib/errors.ts';

function group(
  id: string,
  rewards: Array<number | null>,
  details: Array<Record<string, number>> = rewards.map(() => ({})),
): NftGroupInput {
  return {
    id,
    reward_fn: 'fn:number_game',
    samples: rewards.map((r, i) => ({ id: `${id}/n${i}`, reward: r, reward_details: details[i] })),
  };
}

test('nft targets: 1 = correct (+1), 0 or −1 = incorrect (−1); r̂ is the accuracy of the whole group', () => {
  const t = nftTargets([group('g0', [1, 0, 0, 1]), group('g1', [-1, -1, 1]), group('g2', [0, 0])], 'overall');
  assert.deepEqual(
    [0, 1, 2, 3].map((i) => t.get(`g0/n${i}`)!.reward),
    [1, -1, -1, 1],
  );
  assert.deepEqual(
    [0, 1, 2].map((i) => t.get(`g1/n${i}`)!.reward),
    [-1, -1, 1],
  );
  for (let i = 0; i < 4; i++) assert.equal(t.get(`g0/n${i}`)!.groupAccuracy, 0.5);
  for (let i = 0; i < 3; i++) assert.equal(t.get(`g1/n${i}`)!.groupAccuracy, 1 / 3);
  assert.equal(
    t.get('g2/n0')!.groupAccuracy,
    0,
    'r̂ is left unclamped here (the trainer clamps it to [rHatMin, rHatMax])',
  );
  assert.equal(t.size, 9);
});

test('nft targets: correct_key reads a reward metric; "overall" falls back to the scalar reward only when the reward reports no overall', () => {
  // a binary verifier's metrics: accuracy and overall both 0/1
  const details = [
    { accuracy: 1, format: 1, overall: 1 },
    { accuracy: 0, format: 1, overall: 0 },
    { accuracy: 0, format: 0, overall: 0 },
  ];
  const g = group('g', [1.1, 0.1, 0], details);
  // a bare 1/0 reward (no metrics): accuracy and overall fall back to it
  assert.deepEqual(
    [0, 1].map((i) => nftTargets([group('h', [1, 0])], 'accuracy').get(`h/n${i}`)!.reward),
    [1, -1],
  );
  for (const key of ['accuracy', 'overall']) {
    const t = nftTargets([g], key);
    assert.deepEqual(
      [0, 1, 2].map((i) => t.get(`g/n${i}`)!.reward),
      [1, -1, -1],
      key,
    );
    assert.equal(t.get('g/n0')!.groupAccuracy, 1 / 3);
  }
  assert.deepEqual(
    [0, 1, 2].map((i) => nftTargets([g], 'format').get(`g/n${i}`)!.reward),
    [1, 1, -1],
  );
});

test('nft targets: a reward that is not a binary correctness is refused with what to change', () => {
  const details = [
    { accuracy: 1, format: 1 },
    { accuracy: 0, format: 1 },
  ];
  assert.throws(
    () => nftTargets([group('g', [1.1, 0.1], details)], 'overall'),
    (e: unknown) =>
      e instanceof ConfigError &&
      !e.retriable &&
      /needs a binary correctness per response \(1 = correct, 0 or −1 = incorrect\), but sample g\/n0 has overall = 1\.1 \(reward fn:number_game\)/.test(
        e.message,
      ) &&
      /Set algorithm\.nft\.correct_key to a 0\/1 metric of the reward \(this one reports: accuracy, format\)/.test(
        e.message,
      ),
  );
  assert.throws(() => nftTargets([group('g', [0.5, 1])], 'overall'), /sample g\/n0 has overall = 0\.5/);
  assert.throws(
    () => nftTargets([group('g', [1, 0], details)], 'acc'),
    /reward metric "acc" \(algorithm\.nft\.correct_key\), but sample g\/n0 \(reward fn:number_game\) has none; its reward reports: accuracy, format/,
  );
});
