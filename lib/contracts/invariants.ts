/**
 * Rules a record must follow beyond its Avro shape: ids derived as ids.ts says, per-token arrays
 * as long as the response, exactly one of reward/failure, exactly one control payload, ... The
 * codec checks them on encode (a producer bug fails loudly at the source) and on decode (a record
 * that breaks them is poison). Each problem is one line starting with the field path.
 */
import { RUN_ID_RE, hashId, parseId, type Kind } from './ids.ts';
import type { SchemaFamily } from './schemas.ts';
import type { ControlType } from './types.ts';

type Problems = string[];
type Rec = Record<string, any>;

const isNat = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

function header(r: Rec, p: Problems, opts: { nullableStep?: boolean } = {}): void {
  if (!RUN_ID_RE.test(r.run_id))
    p.push(`run_id: ${JSON.stringify(r.run_id)} is not a valid run id (1–128 letters, digits, '.', '_' or '-')`);
  if (typeof r.id !== 'string' || r.id === '') p.push('id: must be a non-empty deterministic id');
  else if (RUN_ID_RE.test(r.run_id) && !r.id.startsWith(`${r.run_id}/`))
    p.push(`id: ${JSON.stringify(r.id)} does not start with the run id "${r.run_id}/"`);
  for (const k of ['step', 'policy_version']) {
    if (opts.nullableStep && r[k] === null) continue;
    if (!isNat(r[k])) p.push(`${k}: must be a non-negative integer, got ${r[k]}`);
  }
}

/** The group id must be the one ids.ts derives from (run, kind, step, prompt_index), and group_uid its hash. */
function groupIdentity(path: string, g: Rec, runId: string, step: number, kind: Kind, p: Problems): void {
  const parsed = parseId(g.id);
  if (!parsed || parsed.sampleIndex !== null) {
    p.push(
      `${path}id: ${JSON.stringify(g.id)} is not a group id (<run>/train/s<step>/p<prompt> or <run>/val/r<round>/p<prompt>)`,
    );
    return;
  }
  if (parsed.runId !== runId || parsed.kind !== kind || parsed.step !== step || parsed.promptIndex !== g.prompt_index) {
    p.push(
      `${path}id: ${JSON.stringify(g.id)} does not match run_id=${runId}, kind=${kind}, step=${step}, prompt_index=${g.prompt_index}`,
    );
  }
  if (g.group_uid !== hashId(g.id))
    p.push(`${path}group_uid: ${JSON.stringify(g.group_uid)} is not hashId(id) = ${hashId(g.id)}`);
}

function samples(g: Rec, p: Problems, each: (s: Rec, path: string, len: number) => void): void {
  const seen = new Set<number>();
  // trajectories/scored v2: the remax greedy baseline is checked like a sample (its index is not one of the samples')
  const all: Array<[Rec, string]> = g.samples.map((s: Rec, i: number) => [s, `samples[${i}].`]);
  if (g.baseline != null) {
    all.push([g.baseline, 'baseline.']);
    if (g.kind !== 'train') p.push(`baseline: only training groups have a greedy baseline (kind is ${g.kind})`);
  }
  all.forEach(([s, path]) => {
    if (seen.has(s.sample_index)) p.push(`${path}sample_index: ${s.sample_index} appears twice in the group`);
    seen.add(s.sample_index);
    if (s.id !== `${g.id}/n${s.sample_index}`)
      p.push(`${path}id: ${JSON.stringify(s.id)} is not "${g.id}/n${s.sample_index}"`);
    if (s.prompt_index !== g.prompt_index)
      p.push(`${path}prompt_index: ${s.prompt_index} differs from the group's ${g.prompt_index}`);
    const len = s.response_ids.length;
    if (s.behaviour_logprobs.length !== len)
      p.push(`${path}behaviour_logprobs: ${s.behaviour_logprobs.length} values for ${len} response tokens`);
    if (s.response_mask.length !== 0 && s.response_mask.length !== len)
      p.push(
        `${path}response_mask: ${s.response_mask.length} bytes for ${len} response tokens (use 0 bytes for "all trained")`,
      );
    each(s, path, len);
  });
}

function score(s: Rec, path: string, p: Problems): void {
  if ((s.reward === null) === (s.failure === null)) {
    p.push(
      s.reward === null
        ? `${path}reward: null without a failure record (a sample that could not be scored needs failure)`
        : `${path}failure: set together with a reward (exactly one of reward and failure)`,
    );
  }
  if (s.reward !== null && !Number.isFinite(s.reward))
    p.push(`${path}reward: ${s.reward} is not finite (record a failure instead)`);
}

function group(r: Rec, p: Problems, each: (s: Rec, path: string, len: number) => void = () => {}): void {
  header(r, p);
  groupIdentity('', r, r.run_id, r.step, r.kind, p);
  samples(r, p, each);
}

const CONTROL_TYPES: ControlType[] = [
  'run_started',
  'epoch_started',
  'refill_request',
  'val_round_done',
  'run_done',
  'run_failed',
];

const RULES: Record<SchemaFamily, (r: Rec, p: Problems) => void> = {
  prompts(r, p) {
    header(r, p);
    if (r.groups.length === 0) p.push('groups: a prompt batch needs at least one group');
    else {
      const want = r.groups.length === 1 ? r.groups[0].id : `${r.groups[0].id}+${r.groups.length}`;
      if (r.id !== want)
        p.push(`id: ${JSON.stringify(r.id)} is not the chunk id ${JSON.stringify(want)} (ids.ts chunkId)`);
    }
    r.groups.forEach((g: Rec, i: number) => {
      groupIdentity(`groups[${i}].`, g, r.run_id, r.step, r.kind, p);
      if (!(Number.isSafeInteger(g.n) && g.n >= 1)) p.push(`groups[${i}].n: must be at least 1, got ${g.n}`);
      // prompts.v1 records read with image_refs = []; otherwise one ref per image
      const refs: Rec[] = g.image_refs ?? [];
      if (refs.length > 0 && refs.length !== g.images.length)
        p.push(`groups[${i}].image_refs: ${refs.length} refs for ${g.images.length} images (one per image, in order)`);
      refs.forEach((x, j) => {
        if (typeof x.hash !== 'string' || !/^[0-9a-f]{64}$/.test(x.hash))
          p.push(`groups[${i}].image_refs[${j}].hash: must be a lower-case hex sha256, got ${JSON.stringify(x.hash)}`);
        if (!(x.width >= 1 && x.height >= 1))
          p.push(`groups[${i}].image_refs[${j}]: size ${x.width}×${x.height} must be positive`);
      });
    });
  },
  trajectories(r, p) {
    group(r, p);
  },
  scored(r, p) {
    group(r, p, (s, path) => score(s, path, p));
  },
  updates(r, p) {
    if (r.filtered && (r.filter_reason === null || r.filter_reason === ''))
      p.push('filter_reason: a filtered group needs a reason');
    if (!r.filtered && r.filter_reason !== null) p.push('filter_reason: must be null when filtered = false');
    group(r, p, (s, path, len) => {
      score(s, path, p);
      if (r.filtered) return; // a filtered group's per-token arrays may be empty
      for (const k of ['advantages', 'returns', 'loss_weights']) {
        if (s[k].length !== len) p.push(`${path}${k}: ${s[k].length} values for ${len} response tokens`);
      }
      for (const k of ['ref_logprobs', 'values']) {
        if (s[k].length !== 0 && s[k].length !== len)
          p.push(`${path}${k}: ${s[k].length} values for ${len} response tokens (use none when unused)`);
      }
      const v = s.vppo;
      if (v) {
        if (v.perturbed_logprobs.length !== len)
          p.push(`${path}vppo.perturbed_logprobs: ${v.perturbed_logprobs.length} values for ${len} response tokens`);
        if (v.token_mask.length !== len)
          p.push(`${path}vppo.token_mask: ${v.token_mask.length} values for ${len} response tokens`);
        else if (v.token_mask.some((b: number) => b > 1)) p.push(`${path}vppo.token_mask: bytes must be 0 or 1`);
        if (!(Number.isFinite(v.scaling_factor) && v.scaling_factor >= 0))
          p.push(`${path}vppo.scaling_factor: ${v.scaling_factor} must be finite and ≥ 0`);
      }
    });
  },
  policy(r, p) {
    header(r, p);
    if (!/^[0-9a-f]{64}$/.test(r.sha256)) p.push(`sha256: ${JSON.stringify(r.sha256)} is not 64 lowercase hex chars`);
    if (r.parent_version !== null && r.parent_version >= r.policy_version)
      p.push(`parent_version: ${r.parent_version} is not older than policy_version ${r.policy_version}`);
  },
  metrics(r, p) {
    header(r, p);
    for (const [k, v] of Object.entries(r.values as Record<string, number>))
      if (k === '') p.push(`values: empty metric name (value ${v})`);
  },
  control(r, p) {
    header(r, p);
    for (const t of CONTROL_TYPES) {
      if (t === r.type && r[t] === null) p.push(`${t}: type is ${t} but its payload is null`);
      if (t !== r.type && r[t] !== null)
        p.push(`${t}: set although type is ${r.type} (only the payload named by type may be set)`);
    }
  },
  deadletter(r, p) {
    header(r, p, { nullableStep: true });
  },
};

/** The rule violations of a record of `family` (empty when it is valid). */
export function recordProblems(family: SchemaFamily, record: unknown): string[] {
  const p: Problems = [];
  const rule = RULES[family];
  if (!rule) return [`no rules for schema family "${family}"`];
  rule(record as Rec, p);
  return p;
}
