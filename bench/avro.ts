/**
 * Avro benchmark: encode and decode throughput of trajectory batches — one message = one prompt
 * group of 8 samples × 512 response tokens (int32 ids + float32 behaviour log-probs, ~2 KB of
 * text per response, a 256-token prompt) — through the real codecs, in both wire formats:
 *
 *  - plain: Avro body + rl-schema header; decode reads the header, validates the Avro bytes and
 *    the record rules (ids, per-token lengths), and returns typed arrays that own their memory;
 *  - confluent: magic byte + schema id + body (an in-memory registry; the id lookup is cached).
 *
 * Encode returns an owned Buffer per message (what a producer hands to Kafka). MB/s counts the
 * encoded message bytes. Goal: ≥ 150 MB/s both ways. Reference rows: avsc's `toBuffer` on the same
 * records (encodes large records twice), and update batches (5 more float arrays per sample).
 *
 * Run: `node --import tsx bench/avro.ts` (prints a table).
 */
import { pathToFileURL } from 'node:url';
import { createCodec, createMessageCodec, type MessageCodec } from '../lib/contracts/codec.ts';
import { groupId, hashId, sampleId } from '../lib/contracts/ids.ts';
import { InMemorySchemaRegistry } from '../lib/contracts/registry.ts';
import type { TrajectoryGroup, UpdateGroup } from '../lib/contracts/types.ts';
import { Rng } from '../lib/util/rng.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number;
}

const GROUPS = 64;
const SAMPLES = 8;
const TOKENS = 512;
const PROMPT_TOKENS = 256;
const GOAL_MBS = 150;
const WORDS = ['the', 'answer', 'is', '42', 'so', 'we', 'add', 'carry', 'one', 'then', 'check', 'result', '∑', 'é'];

function trajectoryGroups(n: number, seed: string): TrajectoryGroup[] {
  const rng = Rng.fromSeed(seed);
  const ids = (len: number) => {
    const a = new Int32Array(len);
    for (let i = 0; i < len; i++) a[i] = rng.int(151_000);
    return a;
  };
  const floats = (len: number) => {
    const a = new Float32Array(len);
    for (let i = 0; i < len; i++) a[i] = -rng.next() * 5;
    return a;
  };
  const text = (chars: number) => {
    let s = '';
    while (s.length < chars) s += `${WORDS[rng.int(WORDS.length)]} `;
    return s;
  };
  return Array.from({ length: n }, (_, g) => {
    const step = 1 + (g >> 4);
    const p = g & 15;
    const id = groupId('bench-run', step, p);
    return {
      run_id: 'bench-run',
      id,
      group_uid: hashId(id),
      step,
      policy_version: step - 1,
      kind: 'train',
      epoch: 0,
      attempt: 0,
      prompt_index: p,
      dataset_index: rng.int(100_000),
      prompt_ids: ids(PROMPT_TOKENS),
      prompt_text: text(1000),
      images: [],
      data_source: 'arith',
      ground_truth: String(rng.int(1000)),
      extra_info: '{}',
      samples: Array.from({ length: SAMPLES }, (_, k) => ({
        id: sampleId('bench-run', step, p, k),
        sample_index: k,
        prompt_index: p,
        response_ids: ids(TOKENS),
        response_text: text(2000),
        behaviour_logprobs: floats(TOKENS),
        response_mask: Buffer.alloc(0),
        finish_reason: k % 3 === 0 ? 'length' : 'stop',
        episode: null,
        generated: null,
      })),
      baseline: null,
    } satisfies TrajectoryGroup;
  });
}

function updateGroups(src: TrajectoryGroup[]): UpdateGroup[] {
  const f = (len: number, v: number) => new Float32Array(len).fill(v);
  return src.map((g) => ({
    ...g,
    reward_fn: 'fn:exact_match',
    estimator: 'grpo',
    filtered: false,
    filter_reason: null,
    reward_mean: 0.5,
    reward_std: 0.5,
    samples: g.samples.map((s, k) => ({
      ...s,
      reward: k % 2,
      reward_details: { accuracy: k % 2 },
      failure: null,
      advantages: f(TOKENS, 0.3),
      returns: f(TOKENS, 0.3),
      ref_logprobs: f(TOKENS, -1),
      values: new Float32Array(0),
      loss_weights: f(TOKENS, 1),
      vppo: null,
    })),
  }));
}

/** Best of `trials` timings of `fn` over all items, each trial ≥ minMs; returns items per second. */
function measure(count: number, fn: () => void, trials = 5, minMs = 250): number {
  fn(); // warm-up
  let best = 0;
  for (let t = 0; t < trials; t++) {
    let reps = 0;
    const t0 = performance.now();
    let el = 0;
    do {
      fn();
      reps++;
      el = performance.now() - t0;
    } while (el < minMs);
    best = Math.max(best, (reps * count) / (el / 1000));
  }
  return best;
}

const round = (x: number, d = 1) => Math.round(x * 10 ** d) / 10 ** d;

async function framing(
  name: string,
  mc: MessageCodec<TrajectoryGroup>,
  groups: TrajectoryGroup[],
  rows: Row[],
): Promise<void> {
  await mc.ready();
  const msgs = groups.map((g) => mc.encode(g));
  const bytes = msgs.reduce((a, m) => a + m.value.length, 0);
  const perMsg = bytes / msgs.length;
  const encPerS = measure(groups.length, () => {
    for (const g of groups) mc.encode(g);
  });
  // decode is async in the interface (a registry lookup may be needed): awaited per message
  let decPerS = 0;
  {
    const decodeAll = async () => {
      for (const m of msgs) await mc.decode(m.value, m.headers);
    };
    await decodeAll();
    let best = 0;
    for (let t = 0; t < 5; t++) {
      let reps = 0;
      const t0 = performance.now();
      let el = 0;
      do {
        await decodeAll();
        reps++;
        el = performance.now() - t0;
      } while (el < 250);
      best = Math.max(best, (reps * msgs.length) / (el / 1000));
    }
    decPerS = best;
  }
  rows.push(
    { name: `avro/trajectories/${name}/encode`, value: round((encPerS * perMsg) / 1e6), unit: 'MB/s', goal: GOAL_MBS },
    { name: `avro/trajectories/${name}/decode`, value: round((decPerS * perMsg) / 1e6), unit: 'MB/s', goal: GOAL_MBS },
    { name: `avro/trajectories/${name}/encode`, value: Math.round(encPerS), unit: 'rec/s' },
    { name: `avro/trajectories/${name}/decode`, value: Math.round(decPerS), unit: 'rec/s' },
  );
}

export async function run(): Promise<Row[]> {
  const rows: Row[] = [];
  const groups = trajectoryGroups(GROUPS, 'bench-avro');
  const plainCodec = createMessageCodec('trajectories', { format: 'plain' });
  const size = plainCodec.encode(groups[0]).value.length;
  rows.push({ name: `avro/trajectories/message_size (${SAMPLES}×${TOKENS} tokens)`, value: size, unit: 'bytes' });
  await framing('plain', plainCodec, groups, rows);
  await framing(
    'confluent',
    createMessageCodec('trajectories', {
      format: 'confluent',
      registry: new InMemorySchemaRegistry(),
      subject: 'bench.trajectories-value',
    }),
    groups,
    rows,
  );

  // reference: avsc toBuffer on the same records (no framing, no rule checks)
  const type = createCodec('trajectories').schema.type;
  const bytes = groups.reduce((a, g) => a + type.toBuffer(g).length, 0) / groups.length;
  const tb = measure(groups.length, () => {
    for (const g of groups) type.toBuffer(g);
  });
  rows.push({
    name: 'avro/trajectories/avsc_toBuffer_reference/encode',
    value: round((tb * bytes) / 1e6),
    unit: 'MB/s',
  });

  // update batches: the largest messages of the pipeline
  const updates = updateGroups(groups);
  const uc = createCodec('updates');
  const ub = updates.map((u) => uc.encode(u));
  const ubytes = ub.reduce((a, b) => a + b.length, 0) / ub.length;
  const ue = measure(updates.length, () => {
    for (const u of updates) uc.encode(u);
  });
  const ud = measure(updates.length, () => {
    for (const b of ub) uc.decode(b);
  });
  rows.push(
    { name: 'avro/updates/message_size', value: Math.round(ubytes), unit: 'bytes' },
    { name: 'avro/updates/encode', value: round((ue * ubytes) / 1e6), unit: 'MB/s' },
    { name: 'avro/updates/decode', value: round((ud * ubytes) / 1e6), unit: 'MB/s' },
  );
  return rows;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const rows = await run();
  const w = Math.max(...rows.map((r) => r.name.length));
  console.log(`${'benchmark'.padEnd(w)}  ${'value'.padStart(9)}  ${'unit'.padEnd(6)}  goal`);
  for (const r of rows) {
    const goal = r.goal === undefined ? '' : `≥ ${r.goal} ${r.value >= r.goal ? '(met)' : '(NOT met)'}`;
    console.log(`${r.name.padEnd(w)}  ${String(r.value).padStart(9)}  ${r.unit.padEnd(6)}  ${goal}`);
  }
}
