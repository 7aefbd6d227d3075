/**
 * Policy versions over a whole run (embedded): the update stage prunes the versions no longer
 * needed (trainer.keep_policy_versions keeps more) and a replay of a run whose versions were
 * pruned gives its checkpoint, the postgres policy store ends a run with the
 * same checkpoint as the filesystem one, and a damaged committed version stops a resume with the
 * path, both hashes and the checkpoint to resume from.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { readdirSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { ROOT, freshDatabase } from '../../devkit/pipeline-procs.ts';

const run = promisify(execFile);
const CONFIG = join(ROOT, 'test/e2e/fixtures/tiny.yaml');
const tmp = join(ROOT, 'test/.tmp', `policy-versions-${process.pid}`);
const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  rmSync(tmp, { recursive: true, force: true });
});

async function train(args: string[]): Promise<{ code: number; out: string; sha: string | null }> {
  const r = await run(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), 'train', CONFIG, ...args], {
    cwd: ROOT,
    env: { ...process.env, RLSTREAM_LOG_JSON: '1' },
    maxBuffer: 64 << 20,
  }).then(
    (o) => ({ code: 0, out: o.stdout + o.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, out: e.stdout + e.stderr }),
  );
  return { ...r, sha: /final checkpoint: .* sha256 ([0-9a-f]{64})\)/.exec(r.out)?.[1] ?? null };
}

const versions = (dir: string) =>
  readdirSync(join(dir, 'policy'))
    .filter((n) => /^v\d+$/.test(n))
    .sort();

test(
  'versions no longer needed are pruned (a replay still gives the checkpoint); keep_policy_versions keeps more; the postgres store trains the same',
  { timeout: 300_000 },
  async () => {
    // every version written as a file (policy.version_files: every_step), so retention decides what stays
    const a = await train([`trainer.run_dir=${join(tmp, 'a')}`, 'policy.version_files=every_step']);
    assert.equal(a.code, 0, a.out.slice(-2000));
    // 3 steps, on-policy: the reference and the newest two stay; v1 went
    assert.deepEqual(versions(join(tmp, 'a')), ['v000000', 'v000002', 'v000003']);
    // a replay of the run whose version 1 was pruned gives the same checkpoint
    const rep = await run(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), 'replay', '--from', join(tmp, 'a')], {
      cwd: ROOT,
      maxBuffer: 64 << 20,
    });
    assert.match(rep.stdout + rep.stderr, new RegExp(`: completed, step 3, policy sha256 ${a.sha}`));
    const b = await train([
      `trainer.run_dir=${join(tmp, 'b')}`,
      'policy.version_files=every_step',
      'trainer.keep_policy_versions=1',
    ]);
    assert.equal(b.code, 0, b.out.slice(-2000));
    assert.deepEqual(versions(join(tmp, 'b')), ['v000000', 'v000001', 'v000002', 'v000003']);
    assert.equal(b.sha, a.sha, 'pruning does not change training');

    const db = await freshDatabase(`rl_e2e_polstore_${process.pid}`);
    cleanups.push(db.drop);
    const c = await train([
      `trainer.run_dir=${join(tmp, 'c')}`,
      'pipeline.store=postgres',
      `pipeline.database_url=${db.url}`,
      'pipeline.policy_store=postgres',
    ]);
    assert.equal(c.code, 0, c.out.slice(-2000));
    assert.equal(c.sha, a.sha, "the postgres policy store ends with the filesystem store's checkpoint");
  },
);

test(
  'a damaged committed policy version stops the resume with the path, both hashes and the last good checkpoint',
  { timeout: 300_000 },
  async () => {
    const dir = join(tmp, 'damaged');
    const first = await train([`trainer.run_dir=${dir}`, 'trainer.save_freq=1', 'trainer.max_steps=2']);
    assert.equal(first.code, 0, first.out.slice(-2000));
    const file = join(dir, 'policy', 'v000002', 'model.safetensors');
    const bytes = readFileSync(file);
    const recorded = createHash('sha256').update(bytes).digest('hex');
    for (let i = 200; i < 264; i++) bytes[i] ^= 0xa5;
    writeFileSync(file, bytes);
    const found = createHash('sha256').update(bytes).digest('hex');
    // continue the run for one more step: the update stage resumes from version 2
    const again = await train([`trainer.run_dir=${dir}`, 'trainer.save_freq=1', 'trainer.max_steps=3']);
    assert.notEqual(again.code, 0, 'the resume stops');
    // the resume starts from checkpoint global_step_2, whose actor/ is a hard link of the damaged file
    const linked = join(dir, 'checkpoints', 'global_step_2', 'actor', 'model.safetensors');
    assert.ok(again.out.includes(linked), `names the file:\n${again.out.slice(-3000)}`);
    assert.ok(again.out.includes(recorded) && again.out.includes(found), 'names both hashes');
    // global_step_2/actor is a hard link to the damaged file; global_step_1 is intact
    assert.match(
      again.out,
      new RegExp(
        `trainer\\.load_checkpoint_path=${join(dir, 'checkpoints', 'global_step_1').replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}`,
      ),
    );
    assert.doesNotMatch(again.out, /step 3 trained/, 'nothing trained from the damaged weights');
    // starting a new run from the damaged checkpoint (its actor/ links the damaged file) is refused too
    const fromBad = await train([
      `trainer.run_dir=${join(tmp, 'from-bad')}`,
      `trainer.load_checkpoint_path=${join(dir, 'checkpoints', 'global_step_2')}`,
      'trainer.max_steps=3',
    ]);
    assert.notEqual(fromBad.code, 0);
    assert.ok(
      fromBad.out.includes(recorded) && fromBad.out.includes(found),
      `names both hashes:\n${fromBad.out.slice(-2000)}`,
    );
    assert.match(fromBad.out, /the checkpoint is damaged; use an earlier checkpoint/);
    // the reference policy (KL reference) of a checkpoint is checked too: global_step_1/reference links v0
    const ref = join(dir, 'checkpoints', 'global_step_1', 'reference', 'model.safetensors');
    const rbytes = readFileSync(ref);
    const rRecorded = createHash('sha256').update(rbytes).digest('hex');
    for (let i = 300; i < 364; i++) rbytes[i] ^= 0x5a;
    writeFileSync(ref, rbytes);
    const fromBadRef = await train([
      `trainer.run_dir=${join(tmp, 'from-bad-ref')}`,
      `trainer.load_checkpoint_path=${join(dir, 'checkpoints', 'global_step_1')}`,
      'trainer.max_steps=3',
    ]);
    assert.notEqual(fromBadRef.code, 0);
    assert.ok(
      fromBadRef.out.includes(ref) && fromBadRef.out.includes(rRecorded),
      `names the reference file and its recorded hash:\n${fromBadRef.out.slice(-2000)}`,
    );
  },
);

test(
  'a damaged reference policy (v000000) stops the resume at its start, nothing dead-lettered; restored, the same command continues',
  { timeout: 600_000 },
  async () => {
    const dir = join(tmp, 'damaged-ref');
    const args = [`trainer.run_dir=${dir}`, 'trainer.save_freq=1', 'trainer.max_steps=3'];
    // killed after step 2 committed: the same command resumes it
    const first = await run(process.execPath, [join(ROOT, 'bin/rlstream.mjs'), 'train', CONFIG, ...args], {
      cwd: ROOT,
      env: { ...process.env, RLSTREAM_CRASH_AT: 'checkpoint:recorded@2' },
    }).then(
      () => 0,
      (e: { code: number | null; signal?: string }) => e.signal ?? e.code,
    );
    assert.equal(first, 'SIGKILL');
    const file = join(dir, 'policy', 'v000000', 'model.safetensors');
    const good = readFileSync(file);
    const recorded = createHash('sha256').update(good).digest('hex');
    const bad = Buffer.from(good);
    for (let i = 200; i < 264; i++) bad[i] ^= 0xa5;
    // a checkpoint's reference/ is a hard link to the same file: damage it in place (as a disk would)
    writeFileSync(file, bad);
    const again = await train(args);
    assert.notEqual(again.code, 0, 'the resume stops');
    // the resume starts from the newest checkpoint, whose reference/ is a hard link of v0's file
    assert.ok(
      /checkpoints\/global_step_\d+\/reference\/model\.safetensors has sha256/.test(again.out) &&
        again.out.includes(recorded),
      `names the file and hash:\n${again.out.slice(-3000)}`,
    );
    // every checkpoint links the damaged v0: none is offered as intact
    assert.match(again.out, /No intact checkpoint of this run was found; restore the file from a backup/);
    assert.doesNotMatch(again.out, /step 3 trained/, 'nothing trained before the check');
    assert.doesNotMatch(again.out, /dead.letter/i, 'its own damaged file is not a message to dead-letter');
    writeFileSync(file, good);
    const fixed = await train(args);
    assert.equal(fixed.code, 0, `restored, the same command continues:\n${fixed.out.slice(-3000)}`);
    assert.match(fixed.out, /final checkpoint: .*global_step_3/);
  },
);
