/**
 * The contract every reward backend (lib/reward/port.ts) keeps, run against each adapter by
 * test/int/reward/backend-contract.test.ts: one outcome per item, in order, with the item's id;
 * the rewards the backend's reference says; a sample it cannot score is an outcome with a reason
 * (never a rejection, never a zero), and it does not spoil the others; empty batches; the same
 * items score the same twice; metrics are finite numbers; close resolves.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import type { RewardBackend, RewardItem } from '../../lib/reward/port.ts';

export interface RewardBackendHarness {
  backend: RewardBackend;
  /** The reward the backend must give `item` (its reference, computed in the test). */
  expected(item: RewardItem): number;
  /** An item this backend cannot score (a bad model input, a function that throws, an out-of-range server answer). */
  unscorable(id: string): RewardItem;
  /** Stops what the harness started (servers, files); the suite closes the backend itself. */
  teardown?(): Promise<void>;
}

const bytes = (s: string) => Array.from(Buffer.from(s, 'utf8'));

/** A sample as the reward stage builds it, with byte-tokenizer ids. */
export function rewardItem(id: string, prompt: string, response: string, groundTruth: string): RewardItem {
  return {
    id,
    step: 1,
    prompt_text: prompt,
    response_text: response,
    ground_truth: groundTruth,
    prompt_ids: bytes(prompt),
    response_ids: bytes(response),
    data_source: 'contract',
    extra_info: JSON.stringify({ k: id }),
  };
}

const ITEMS = [
  rewardItem('run/train/s1/p0/n0', '3+4=', '7', '7'),
  rewardItem('run/train/s1/p0/n1', '3+4=', '8', '7'),
  rewardItem('run/train/s1/p1/n0', 'Which is largest? 4 9 2', 'the answer is 1', '1'),
  rewardItem('run/train/s1/p1/n1', 'ünïcödé ✓', 'a longer response with spaces', 'x'),
];

const TOL = 1e-5;

export function runRewardBackendContract(name: string, make: () => Promise<RewardBackendHarness>): void {
  let h: RewardBackendHarness;
  before(async () => {
    h = await make();
  });
  after(async () => {
    await h?.backend.close();
    await h?.teardown?.();
  });

  test(`${name}: has a name; one outcome per item, in order, with the item's id and the reference reward`, async () => {
    assert.ok(typeof h.backend.name === 'string' && h.backend.name.length > 0);
    const out = await h.backend.score(ITEMS);
    assert.deepEqual(
      out.map((o) => o.id),
      ITEMS.map((it) => it.id),
    );
    out.forEach((o, i) => {
      assert.ok(o.ok, `${o.id} scored: ${o.ok ? '' : o.reason}`);
      assert.ok(Number.isFinite(o.reward), `${o.id}: finite reward`);
      const want = h.expected(ITEMS[i]);
      assert.ok(Math.abs(o.reward - want) <= TOL, `${o.id}: reward ${o.reward}, reference ${want}`);
      assert.equal(typeof o.details, 'object');
    });
  });

  test(`${name}: an empty batch gives no outcomes`, async () => {
    assert.deepEqual(await h.backend.score([]), []);
  });

  test(`${name}: a sample it cannot score is a failure outcome with a reason, and the others still score`, async () => {
    const bad = h.unscorable('run/train/s1/p2/n0');
    const batch = [ITEMS[0], bad, ITEMS[2]];
    const out = await h.backend.score(batch);
    assert.deepEqual(
      out.map((o) => o.id),
      batch.map((it) => it.id),
    );
    const failed = out[1];
    assert.equal(failed.ok, false, 'never a reward for the unscorable sample');
    if (!failed.ok) {
      assert.ok(failed.reason.length > 0, 'the failure says why');
      assert.equal(typeof failed.retriable, 'boolean');
    }
    for (const i of [0, 2]) {
      const o = out[i];
      assert.ok(o.ok && Math.abs(o.reward - h.expected(batch[i])) <= TOL, `${batch[i].id} unaffected`);
    }
  });

  test(`${name}: the same items score the same twice`, async () => {
    const a = await h.backend.score(ITEMS);
    const b = await h.backend.score([...ITEMS].reverse());
    const byId = new Map(b.map((o) => [o.id, o]));
    for (const o of a) {
      const p = byId.get(o.id)!;
      assert.ok(o.ok && p.ok);
      if (o.ok && p.ok) assert.equal(o.reward, p.reward, o.id);
    }
  });

  test(`${name}: metrics, when it has them, are finite numbers`, async () => {
    const m = h.backend.metrics?.() ?? {};
    for (const [k, v] of Object.entries(m)) assert.ok(typeof v === 'number' && Number.isFinite(v), `${k} = ${v}`);
  });
}
