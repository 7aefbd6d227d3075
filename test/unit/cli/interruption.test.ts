/**
 * `rlstream train` / `sft` on Ctrl-C or SIGTERM: the first signal says at once that the run is
 * stopping and aborts it; the grace period later, or on a second signal, the process exits
 * with 130 (Ctrl-C) / 143 (SIGTERM) whatever is still busy.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { interruption } from '../../../app/cli/commands/train.ts';

function harness(graceMs: number) {
  const lines: string[] = [];
  const exits: number[] = [];
  let muted = false;
  const before = { int: process.listeners('SIGINT'), term: process.listeners('SIGTERM') };
  const stop = interruption(graceMs, 'train', () => (muted = true), {
    err: (l) => lines.push(l),
    exit: (c) => exits.push(c),
  });
  const cleanup = () => {
    for (const sig of ['SIGINT', 'SIGTERM'] as const)
      for (const l of process.listeners(sig))
        if (!(sig === 'SIGINT' ? before.int : before.term).includes(l)) process.off(sig, l);
  };
  return { stop, lines, exits, muted: () => muted, cleanup };
}

test('the first Ctrl-C says so at once and aborts; the grace period later the process exits with 130', async () => {
  const h = harness(50);
  try {
    process.emit('SIGINT', 'SIGINT');
    assert.equal(h.stop.signal.aborted, true);
    assert.equal(h.muted(), true);
    assert.equal(h.stop.exitCode(), 130);
    assert.deepEqual(h.lines, [
      'rlstream train: Ctrl-C: stopping the run (at most 0.05 s, pipeline.grace_seconds; Ctrl-C again exits at once)',
    ]);
    assert.deepEqual(h.exits, []);
    await new Promise((r) => setTimeout(r, 120));
    assert.deepEqual(h.exits, [130], 'exits once the grace period is over');
    assert.match(h.lines[1]!, /still stopping after 0\.05 s: exiting now \(nothing committed is lost/);
  } finally {
    h.cleanup();
  }
});

test('SIGTERM then a second signal: exits at once with 143', () => {
  const h = harness(60_000);
  try {
    process.emit('SIGTERM', 'SIGTERM');
    assert.equal(h.stop.exitCode(), 143);
    assert.match(h.lines[0]!, /^rlstream train: SIGTERM: stopping the run \(at most 60 s/);
    process.emit('SIGINT', 'SIGINT');
    assert.deepEqual(h.exits, [143]);
    assert.match(h.lines[1]!, /^rlstream train: second Ctrl-C: exiting now/);
  } finally {
    h.cleanup();
  }
});
