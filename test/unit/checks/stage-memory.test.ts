/**
 * A stage's memory need from its model, and the refusal at start when the cgroup memory limit is
 * below it: cgroup v2 `memory.max` and v1 `memory.limit_in_bytes` read from a fake cgroup
 * directory.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  cgroupMemoryLimit,
  checkStageMemory,
  memoryRefusal,
  RUNTIME_BYTES,
  stageMemoryInput,
  stageMemoryNeed,
  type StageMemoryInput,
} from '../../../lib/checks/stage-memory.ts';
import { loadConfig } from '../../../lib/config/index.ts';
import { ConfigError } from '../../../lib/errors.ts';

const root = mkdtempSync(join(tmpdir(), 'rl-cgroup-'));
after(() => rmSync(root, { recursive: true, force: true }));
const GiB = 1024 ** 3;

function cgroup(name: string, files: Record<string, string>): string {
  const dir = join(root, name);
  for (const [f, v] of Object.entries(files)) {
    mkdirSync(join(dir, f, '..'), { recursive: true });
    writeFileSync(join(dir, f), v);
  }
  mkdirSync(dir, { recursive: true });
  return dir;
}

test('the cgroup limit: v2 memory.max, v1 memory.limit_in_bytes, unlimited in either, none', () => {
  assert.equal(cgroupMemoryLimit(cgroup('v2', { 'memory.max': '2147483648\n' })), 2 * GiB);
  assert.equal(cgroupMemoryLimit(cgroup('v2-max', { 'memory.max': 'max\n' })), null);
  assert.equal(cgroupMemoryLimit(cgroup('v1', { 'memory/memory.limit_in_bytes': '1073741824\n' })), GiB);
  assert.equal(cgroupMemoryLimit(cgroup('v1-flat', { 'memory.limit_in_bytes': '536870912' })), 512 * 1024 ** 2);
  assert.equal(
    cgroupMemoryLimit(cgroup('v1-unlimited', { 'memory/memory.limit_in_bytes': '9223372036854771712' })),
    null,
  );
  assert.equal(cgroupMemoryLimit(cgroup('none', {})), null);
});

// Qwen3-0.6B's shape: 28 layers, 8 KV heads of 128, 596 M parameters (tied embeddings)
const qwen: StageMemoryInput = {
  policy: { params: 596_049_920, layers: 28, kvHeads: 8, headDim: 128 },
  criticParams: null,
  reference: true,
  seqTokens: 1024 + 1024,
  rolloutBatch: 64,
};

test('what each stage holds: 16 P for update, 4 P (+ 4 P reference) for advantage, 4 P + KV cache for rollout', () => {
  const P = qwen.policy.params;
  assert.equal(stageMemoryNeed('update', qwen).bytes, 16 * P + RUNTIME_BYTES);
  assert.equal(stageMemoryNeed('advantage', qwen).bytes, 8 * P + RUNTIME_BYTES);
  assert.equal(stageMemoryNeed('advantage', { ...qwen, reference: false }).bytes, 4 * P + RUNTIME_BYTES);
  // K and V: 2 · 28 layers · 8 heads · 128 · 2048 tokens · 64 sequences · 4 bytes = 28 GiB
  const kv = 2 * 28 * 8 * 128 * 2048 * 64 * 4;
  assert.equal(kv, 28 * GiB);
  assert.equal(stageMemoryNeed('rollout', qwen).bytes, 4 * P + kv + RUNTIME_BYTES);
  assert.equal(stageMemoryNeed('rollout', { ...qwen, rolloutBatch: 8 }).bytes, 4 * P + kv / 8 + RUNTIME_BYTES);
  // GAE: the critic's weights in advantage, its 16 bytes a parameter in update
  const gae = { ...qwen, criticParams: 1000 };
  assert.equal(stageMemoryNeed('update', gae).bytes, 16 * P + 16_000 + RUNTIME_BYTES);
  assert.equal(stageMemoryNeed('advantage', gae).bytes, 8 * P + 4000 + RUNTIME_BYTES);
  // embedded: every stage in one process
  assert.equal(
    stageMemoryNeed('embedded', qwen).bytes,
    stageMemoryNeed('rollout', qwen).bytes +
      stageMemoryNeed('advantage', qwen).bytes +
      stageMemoryNeed('update', qwen).bytes -
      2 * RUNTIME_BYTES,
  );
  assert.equal(stageMemoryNeed('reward', qwen).bytes, RUNTIME_BYTES);
});

test('a limit below the need is refused with how much; at or above it passes', () => {
  const need = stageMemoryNeed('update', qwen);
  assert.equal(memoryRefusal(need, null, qwen.policy.params), null);
  assert.equal(memoryRefusal(need, need.bytes, qwen.policy.params), null);
  const line = memoryRefusal(need, 8 * GiB, qwen.policy.params)!;
  assert.match(
    line,
    /^the update stage needs at least 9\.13 GiB for a 596\.05 M-parameter policy \(weights, gradients and AdamW state 8\.88 GiB \+ runtime 256 MiB\), but its memory limit \(cgroup\) is 8\.00 GiB: raise the limit .* to at least 10\.00 GiB/,
  );
  assert.ok(!line.includes('\n'), 'one line');
});

test('checkStageMemory on a config: refused under a fake 64 MiB cgroup, passes without a limit or for a stage with no model', async () => {
  const cfg = loadConfig({
    file: join(import.meta.dirname, '../../e2e/fixtures/tiny.yaml'),
    overrides: ['actor.model.d_model=256', 'actor.model.ffn=1024', 'actor.model.n_layers=4'],
    onWarning: () => undefined,
  });
  const input = await stageMemoryInput(cfg);
  assert.equal(input.policy.layers, 4);
  assert.equal(input.reference, true);
  assert.equal(input.seqTokens, 18);
  const small = cgroup('small', { 'memory.max': String(64 * 1024 ** 2) });
  await assert.rejects(
    checkStageMemory(cfg, 'update', { cgroupRoot: small }),
    (e: unknown) =>
      e instanceof ConfigError &&
      !e.retriable &&
      /^the update stage needs at least \d+ MiB .* is 64 MiB/.test(e.message),
  );
  await assert.rejects(checkStageMemory(cfg, 'embedded', { cgroupRoot: small }), /this process \(all five stages/);
  await checkStageMemory(cfg, 'reward', { cgroupRoot: small });
  await checkStageMemory(cfg, 'update', { cgroupRoot: cgroup('big', { 'memory.max': String(8 * GiB) }) });
  await checkStageMemory(cfg, 'update', { cgroupRoot: cgroup('unlimited', { 'memory.max': 'max' }) });
});
