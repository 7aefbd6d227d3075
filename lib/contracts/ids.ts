/**
 * Deterministic record ids. Every id is a function of the run and of the record's position in
 * the run (step or validation round, prompt index, sample index, ...) — never random — so a
 * redelivered or replayed record has the same id and is deduplicated by it.
 *
 * Layout (readable, '/'-separated; run ids cannot contain '/'):
 *   group       <run>/train/s<step>/p<prompt>          val group   <run>/val/r<round>/p<prompt>
 *   sample      <group id>/n<sample>
 *   chunk       <first group id>+<count>  (a prompt batch of several groups; = group id for one)
 *   policy      <run>/policy/v<version>
 *   metrics     <run>/metrics/<stage>/<kind>/s<step>/<scope>
 *   control     <run>/control/<type>[/<detail>]       refill <run>/control/refill_request/s<step>.q<request>
 *   deadletter  <run>/deadletter/<stage>/<topic>/<partition>/<offset>
 *
 * `hashId` (16 hex chars of sha256) is the short form used as message key and `group_uid`;
 * `seedFromId` / `seedWordsFromId` turn an id into a 64-bit seed for per-sequence sampling.
 */
import { createHash } from 'node:crypto';

export type Kind = 'train' | 'val';

/** Run ids: 1–128 letters, digits, '.', '_' or '-', starting with a letter or digit (they appear in topic names). */
export const RUN_ID_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function assertRunId(runId: string): void {
  if (typeof runId !== 'string' || !RUN_ID_RE.test(runId)) {
    throw new RangeError(
      `invalid run id ${JSON.stringify(runId)}: use 1–128 letters, digits, '.', '_' or '-', starting with a letter or digit`,
    );
  }
}

function nat(name: string, v: number): number {
  if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`${name} must be a non-negative integer, got ${v}`);
  return v;
}

function label(name: string, v: string): string {
  if (typeof v !== 'string' || !/^[A-Za-z0-9._-]+$/.test(v))
    throw new RangeError(`${name} must be letters, digits, '.', '_' or '-', got ${JSON.stringify(v)}`);
  return v;
}

/** Id of the group of prompt slot `promptIndex` of train step `step`. */
export function groupId(runId: string, step: number, promptIndex: number): string {
  assertRunId(runId);
  return `${runId}/train/s${nat('step', step)}/p${nat('promptIndex', promptIndex)}`;
}

/** Id of sample `sampleIndex` of that group. */
export function sampleId(runId: string, step: number, promptIndex: number, sampleIndex: number): string {
  return `${groupId(runId, step, promptIndex)}/n${nat('sampleIndex', sampleIndex)}`;
}

/** Id of the group of validation prompt `promptIndex` in validation round `round` (= the policy version evaluated). */
export function valGroupId(runId: string, round: number, promptIndex: number): string {
  assertRunId(runId);
  return `${runId}/val/r${nat('round', round)}/p${nat('promptIndex', promptIndex)}`;
}

export function valSampleId(runId: string, round: number, promptIndex: number, sampleIndex: number): string {
  return `${valGroupId(runId, round, promptIndex)}/n${nat('sampleIndex', sampleIndex)}`;
}

/** Group id for either kind (`stepOrRound` is the step for train, the round for val). */
export function groupIdFor(kind: Kind, runId: string, stepOrRound: number, promptIndex: number): string {
  return kind === 'val' ? valGroupId(runId, stepOrRound, promptIndex) : groupId(runId, stepOrRound, promptIndex);
}

export function sampleIdFor(
  kind: Kind,
  runId: string,
  stepOrRound: number,
  promptIndex: number,
  sampleIndex: number,
): string {
  return `${groupIdFor(kind, runId, stepOrRound, promptIndex)}/n${nat('sampleIndex', sampleIndex)}`;
}

/** Id of a prompt batch holding `count` groups with consecutive prompt indexes from `firstPromptIndex`. */
export function chunkId(
  kind: Kind,
  runId: string,
  stepOrRound: number,
  firstPromptIndex: number,
  count: number,
): string {
  const first = groupIdFor(kind, runId, stepOrRound, firstPromptIndex);
  if (!Number.isSafeInteger(count) || count < 1) throw new RangeError(`count must be a positive integer, got ${count}`);
  return count === 1 ? first : `${first}+${count}`;
}

export function policyId(runId: string, version: number): string {
  assertRunId(runId);
  return `${runId}/policy/v${nat('version', version)}`;
}

/** Id of a metrics record: one per (stage, kind, step, scope); `scope` tells apart several records of a step (e.g. a replica or a phase). */
export function metricsId(runId: string, stage: string, kind: Kind, step: number, scope = 'step'): string {
  assertRunId(runId);
  return `${runId}/metrics/${label('stage', stage)}/${kind}/s${nat('step', step)}/${label('scope', scope)}`;
}

/** Id of a lifecycle control event; `detail` distinguishes repeated events of a type (e.g. `e3` for epoch 3). */
export function controlId(runId: string, type: string, detail?: string): string {
  assertRunId(runId);
  return `${runId}/control/${label('type', type)}${detail === undefined ? '' : `/${label('detail', detail)}`}`;
}

/** Id of the `request`-th refill request (1-based) for train step `step`. */
export function refillId(runId: string, step: number, request: number): string {
  return controlId(runId, 'refill_request', `s${nat('step', step)}.q${nat('request', request)}`);
}

/** Id of the dead letter of the message at (topic, partition, offset) given up by `stage`. */
export function deadLetterId(
  runId: string,
  stage: string,
  topic: string,
  partition: number,
  offset: number | bigint | string,
): string {
  assertRunId(runId);
  const off = String(offset);
  if (!/^\d+$/.test(off)) throw new RangeError(`offset must be a non-negative integer, got ${off}`);
  return `${runId}/deadletter/${label('stage', stage)}/${label('topic', topic)}/${nat('partition', partition)}/${off}`;
}

export interface ParsedId {
  runId: string;
  kind: Kind;
  /** Step (train) or validation round (val). */
  step: number;
  promptIndex: number;
  /** null for a group id. */
  sampleIndex: number | null;
}

const GROUP_OR_SAMPLE_RE = /^([A-Za-z0-9][A-Za-z0-9._-]{0,127})\/(train\/s|val\/r)(\d+)\/p(\d+)(?:\/n(\d+))?$/;

/** Parses a group or sample id; null when `id` is neither. */
export function parseId(id: string): ParsedId | null {
  const m = GROUP_OR_SAMPLE_RE.exec(id);
  if (!m) return null;
  return {
    runId: m[1],
    kind: m[2] === 'val/r' ? 'val' : 'train',
    step: Number(m[3]),
    promptIndex: Number(m[4]),
    sampleIndex: m[5] === undefined ? null : Number(m[5]),
  };
}

function digest(id: string, salt: string): Buffer {
  const h = createHash('sha256');
  if (salt !== '') h.update(salt).update('\0');
  return h.update(id).digest();
}

/** Short stable hash of an id: the first 16 hex chars (64 bits) of sha256(id). Used as message key and group_uid. */
export function hashId(id: string): string {
  return digest(id, '').toString('hex', 0, 8);
}

/** A 64-bit seed for the id (first 8 bytes of sha256, big-endian); `salt` (e.g. the run seed) gives an independent stream. */
export function seedFromId(id: string, salt = ''): bigint {
  return digest(id, salt).readBigUInt64BE(0);
}

/** The same 64-bit seed as two uint32 words [high, low]. */
export function seedWordsFromId(id: string, salt = ''): [number, number] {
  const d = digest(id, salt);
  return [d.readUInt32BE(0), d.readUInt32BE(4)];
}
