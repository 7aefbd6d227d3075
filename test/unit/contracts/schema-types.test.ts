/**
 * Runs the CI check of scripts/check-schema-types.ts, and shows that each of its parts fails
 * when it should (a stale generated file, a mismatched hand-written type, an incompatible
 * evolution fixture).
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdirSync, mkdtempSync as mkdtempRaw, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  ASSERTIONS_FILE,
  GENERATED_FILE,
  SCHEMA_DIR,
  checkEvolution,
  checkGenerated,
  checkTypeAssertions,
  generateTypes,
} from '../../../scripts/check-schema-types.ts';

const scratch: string[] = [];
function mkdtempSync(prefix: string): string {
  const d = mkdtempRaw(prefix);
  scratch.push(d);
  return d;
}
after(() => {
  for (const d of scratch) rmSync(d, { recursive: true, force: true });
});

test('the committed generated.ts is fresh, types.ts matches it, and the evolution fixtures are compatible', () => {
  const gen = checkGenerated();
  assert.equal(gen.ok, true, `generated.ts is stale:\n${gen.diff}`);
  assert.deepEqual(checkTypeAssertions(), []);
  assert.deepEqual(checkEvolution(), []);
});

test('generated types map Avro to TypeScript (typed arrays, nullable unions, enums, maps)', () => {
  const src = readFileSync(GENERATED_FILE, 'utf8');
  assert.match(
    src,
    /export interface TrajectoriesV1TrajectorySample \{[^}]*response_ids: Int32Array;[^}]*behaviour_logprobs: Float32Array;[^}]*response_mask: Buffer;[^}]*finish_reason: TrajectoriesV1FinishReason;/s,
  );
  assert.match(src, /export type TrajectoriesV1Kind = "train" \| "val";/);
  assert.match(src, /reward: null \| number;/);
  assert.match(src, /values: Record<string, number>;/);
  assert.match(src, /images: Buffer\[\];/);
  assert.match(src, /\/\*\* Log-probability of each response token under the behaviour policy/);
  assert.match(src, /export interface GeneratedSchemaValues \{\n {2}control: ControlV1ControlEvent;/);
});

test('a schema change without regenerating is reported with a diff', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-schemas-'));
  cpSync(SCHEMA_DIR, dir, { recursive: true });
  const file = join(dir, 'metrics.v1.avsc');
  const s = JSON.parse(readFileSync(file, 'utf8'));
  s.fields.push({ name: 'host', type: 'string', doc: 'Host name.' });
  writeFileSync(file, JSON.stringify(s));
  const res = checkGenerated({ dir });
  assert.equal(res.ok, false);
  assert.match(res.diff, /^\d+: \+ +host: string;$/m);
  // --write brings a (scratch) generated file up to date
  const out = join(dir, 'generated.ts');
  assert.equal(checkGenerated({ dir, file: out, write: true }).ok, true);
  assert.equal(readFileSync(out, 'utf8'), generateTypes(dir));
  assert.equal(checkGenerated({ dir, file: out }).ok, true);
});

test('a hand-written type that differs from the schema fails the type assertions', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-types-'));
  const gen = pathToFileURL(GENERATED_FILE).href.replace(/^file:\/\//, '');
  const assertions = pathToFileURL(ASSERTIONS_FILE).href.replace(/^file:\/\//, '');
  // a copy of a real type with one field retyped
  const file = join(dir, 'mismatch.ts');
  writeFileSync(
    file,
    [
      `import type * as G from '${gen}';`,
      `import type { Expect, Mutual } from '${assertions}';`,
      'interface Wrong { topic: string; partition: number; next_offset: string }',
      'interface Right { topic: string; partition: number; next_offset: number }',
      'export type A = Expect<Mutual<Right, G.PolicyV1ConsumedOffset>>;',
      'export type B = Expect<Mutual<Wrong, G.PolicyV1ConsumedOffset>>;',
      'export type C = Expect<Mutual<Right & { extra: 1 }, G.PolicyV1ConsumedOffset>>;',
    ].join('\n'),
  );
  const diags = checkTypeAssertions([file]);
  assert.equal(diags.length, 2, diags.join('\n'));
  assert.match(diags[0], /mismatch\.ts:6: Type 'false' does not satisfy the constraint 'true'/);
  assert.match(diags[1], /mismatch\.ts:7:/);
});

test('an evolution fixture that cannot read the previous version is reported', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-evo-'));
  cpSync(SCHEMA_DIR, dir, { recursive: true });
  const evo = join(dir, 'evolution');
  mkdirSync(evo, { recursive: true });
  const s = JSON.parse(readFileSync(join(dir, 'policy.v1.avsc'), 'utf8'));
  s.namespace = 'rlstream.policy.v2';
  s.fields.push({ name: 'device', type: 'string' });
  writeFileSync(join(evo, 'policy.v2.avsc'), JSON.stringify(s));
  assert.deepEqual(
    checkEvolution(dir, evo).filter((p) => p.includes('policy')),
    [
      'evolution/policy.v2.avsc cannot read policy.v1: PolicyVersion.device: field is new in the reader and has no default, so older records cannot be read; give it a default',
    ],
  );
  // two versions side by side in schemas/ are checked too
  writeFileSync(join(dir, 'policy.v2.avsc'), JSON.stringify(s));
  assert.ok(
    checkEvolution(dir, join(dir, 'none')).some((p) =>
      p.startsWith('policy.v2 cannot read policy.v1: PolicyVersion.device'),
    ),
  );
});
