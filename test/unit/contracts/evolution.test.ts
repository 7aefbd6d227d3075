import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Codec } from '../../../lib/contracts/codec.ts';
import { SchemaIncompatibleError, assertCompatible, checkCompatibility } from '../../../lib/contracts/compat.ts';
import { SchemaCatalogue, defaultSchemaDir } from '../../../lib/contracts/schemas.ts';
import type {
  PromptBatch,
  PromptGroup,
  ScoredGroup,
  ScoredSample,
  TrajectoryGroup,
  TrajectorySample,
} from '../../../lib/contracts/types.ts';
import { PoisonMessageError } from '../../../lib/errors.ts';
import { Gen, plain } from './fixtures.ts';

const dir = defaultSchemaDir();
const v1Text = readFileSync(join(dir, 'trajectories.v1.avsc'), 'utf8');
const v2Text = readFileSync(join(dir, 'evolution', 'trajectories.v2.avsc'), 'utf8');

type Json = Record<string, any>;
const v2 = (): Json => JSON.parse(v2Text);
const sampleFields = (s: Json): any[] => s.fields.find((f: Json) => f.name === 'samples').type.items.fields;

/** A catalogue with trajectories v1 (from schemas/) and the given v2. */
function catalogue(v2schema: Json | string = v2Text): SchemaCatalogue {
  const cat = new SchemaCatalogue();
  cat.add('trajectories.v1', v1Text);
  cat.add('trajectories.v2', v2schema);
  return cat;
}

/** The fixture v2 (derived from trajectories.v1, so without the real v2's baseline). */
interface TrajectoryGroupV2 extends Omit<TrajectoryGroup, 'baseline'> {
  tags: string[];
  samples: Array<TrajectoryGroup['samples'][number] & { entropies: Float32Array }>;
}

test('a v2 reader reads v1 records: new fields take their defaults, the rest is unchanged', () => {
  const cat = catalogue();
  const writer = new Codec<TrajectoryGroup>('trajectories', { catalogue: cat, ref: 'trajectories.v1' });
  const reader = new Codec<TrajectoryGroupV2>('trajectories', { catalogue: cat });
  assert.equal(reader.ref, 'trajectories.v2', 'the newest version is the reader');
  const { baseline: _b, ...g } = withoutEpisodes(new Gen(21).trajectoryGroup(5, { n: 3, tokens: 9 })); // the fixture v2 derives from v1
  const bytes = writer.encode(g as TrajectoryGroup);
  const d = reader.decodeWithHeaders(writer.headers(), bytes);
  assert.deepEqual(d.tags, []);
  for (const s of d.samples) {
    assert.ok(s.entropies instanceof Float32Array);
    assert.equal(s.entropies.length, 0);
  }
  const { tags: _t, ...rest } = plain(d) as Json;
  rest.samples = rest.samples.map(({ entropies: _e, ...s }: Json) => s);
  assert.deepEqual(rest, plain(g));
});

test('a v1 reader reads v2 records (added fields are skipped)', () => {
  const cat = catalogue();
  const writer = new Codec<TrajectoryGroupV2>('trajectories', { catalogue: cat });
  const reader = new Codec<TrajectoryGroup>('trajectories', { catalogue: cat, ref: 'trajectories.v1' });
  const { baseline: _b, ...g } = withoutEpisodes(new Gen(22).trajectoryGroup(5, { n: 2, tokens: 4 })); // the fixture v2 derives from v1
  const g2: TrajectoryGroupV2 = {
    ...g,
    tags: ['a', 'ü'],
    samples: g.samples.map((s) => ({ ...s, entropies: new Float32Array(s.response_ids.length).fill(0.5) })),
  };
  const d = reader.decode(writer.encode(g2 as TrajectoryGroupV2), 'trajectories.v2');
  assert.deepEqual(plain(d), plain(g));
});

test('a new field without a default is rejected, naming the field', () => {
  const bad = v2();
  delete sampleFields(bad).find((f) => f.name === 'entropies').default;
  const res = checkCompatibility(v1Text, bad);
  assert.equal(res.compatible, false);
  assert.deepEqual(res.errors, [
    'TrajectoryGroup.samples[].entropies: field is new in the reader and has no default, so older records cannot be read; give it a default',
  ]);
  assert.throws(
    () => assertCompatible(v1Text, bad, { writer: 'trajectories.v1', reader: 'trajectories.v2' }),
    (e: unknown) => {
      assert.ok(e instanceof SchemaIncompatibleError);
      assert.equal(e.retriable, false);
      assert.equal(e.code, 'ERR_SCHEMA_INCOMPATIBLE');
      assert.match(
        e.message,
        /^trajectories\.v1 cannot be read as trajectories\.v2: TrajectoryGroup\.samples\[\]\.entropies: field is new/,
      );
      return true;
    },
  );
  // a consumer with that reader dead-letters v1 messages with the reason
  const cat = catalogue(bad);
  const writer = new Codec<TrajectoryGroup>('trajectories', { catalogue: cat, ref: 'trajectories.v1' });
  const reader = new Codec<TrajectoryGroupV2>('trajectories', { catalogue: cat });
  const bytes = writer.encode(new Gen(1).trajectoryGroup(1));
  assert.throws(
    () => reader.decode(bytes, 'trajectories.v1'),
    (e: unknown) =>
      e instanceof PoisonMessageError &&
      /samples\[\]\.entropies: field is new in the reader and has no default/.test(e.message),
  );
});

test('a type change is rejected naming the field; Avro promotions are accepted', () => {
  const retyped = v2();
  retyped.fields.find((f: Json) => f.name === 'step').type = 'string';
  assert.deepEqual(checkCompatibility(v1Text, retyped).errors, [
    'TrajectoryGroup.step: type changed from int to string, which Avro cannot convert; add a new field instead',
  ]);
  const promoted = v2();
  promoted.fields.find((f: Json) => f.name === 'step').type = 'long';
  sampleFields(promoted).find((f) => f.name === 'response_text').type = 'bytes';
  assert.deepEqual(checkCompatibility(v1Text, promoted), { compatible: true, errors: [] });
  // and the promoted reader really reads v1 data
  const cat = catalogue(promoted);
  const g = new Gen(3).trajectoryGroup(7, { n: 1, tokens: 2 });
  const d = new Codec<Json>('trajectories', { catalogue: cat }).decode(
    new Codec('trajectories', { catalogue: cat, ref: 'trajectories.v1' }).encode(g),
    'trajectories.v1',
  );
  assert.equal(d.step, 7);
  assert.ok(Buffer.isBuffer(d.samples[0].response_text));
  assert.equal(d.samples[0].response_text.toString(), g.samples[0].response_text);
});

test('a changed logical type (int32-le → float32-le, both bytes) is rejected rather than reinterpreted', () => {
  const bad = v2();
  sampleFields(bad).find((f) => f.name === 'response_ids').type = { type: 'bytes', logicalType: 'float32-le' };
  assert.deepEqual(checkCompatibility(v1Text, bad).errors, [
    'TrajectoryGroup.samples[].response_ids: logical type changed from int32-le to float32-le; the bytes would be reinterpreted — add a new field instead',
  ]);
});

test('enum, union and record-name rules', () => {
  const noStop = v2();
  sampleFields(noStop).find((f) => f.name === 'finish_reason').type.symbols = ['length', 'abort'];
  assert.match(
    checkCompatibility(v1Text, noStop).errors.join('\n'),
    /TrajectoryGroup\.samples\[\]\.finish_reason: enum symbol\(s\) stop were removed and the reader's enum has no default/,
  );
  const withDefault = v2();
  Object.assign(sampleFields(withDefault).find((f) => f.name === 'finish_reason').type, {
    symbols: ['length', 'abort', 'other'],
    default: 'other',
  });
  assert.equal(checkCompatibility(v1Text, withDefault).compatible, true);

  const nullable = v2();
  nullable.fields.find((f: Json) => f.name === 'ground_truth').type = ['null', 'string'];
  assert.equal(checkCompatibility(v1Text, nullable).compatible, true, 'string → [null, string] widens');
  assert.deepEqual(checkCompatibility(nullable, v1Text).errors, [
    "TrajectoryGroup.ground_truth: the writer's union branch null cannot be read as string",
  ]);

  const renamed = v2();
  renamed.fields.find((f: Json) => f.name === 'samples').type.items.name = 'Sample';
  assert.match(
    checkCompatibility(v1Text, renamed).errors[0],
    /TrajectoryGroup\.samples\[\]: record TrajectorySample cannot be read as record Sample \(names differ; add an alias\)/,
  );
  renamed.fields.find((f: Json) => f.name === 'samples').type.items.aliases = ['TrajectorySample'];
  assert.equal(checkCompatibility(v1Text, renamed).compatible, true);

  const renamedField = v2();
  Object.assign(
    renamedField.fields.find((f: Json) => f.name === 'ground_truth'),
    { name: 'answer', aliases: ['ground_truth'] },
  );
  assert.equal(checkCompatibility(v1Text, renamedField).compatible, true, 'a field renamed with an alias');
});

test('the catalogue refuses misnamed or mis-namespaced schemas with the file named', () => {
  const cat = new SchemaCatalogue();
  assert.throws(
    () => cat.add('trajectories-v1', v1Text, 'x.avsc'),
    /x\.avsc: schema name "trajectories-v1" must look like <family>\.v<N>/,
  );
  assert.throws(
    () => cat.add('trajectories.v2', v1Text, 'y.avsc'),
    /y\.avsc: namespace must be "rlstream\.trajectories\.v2", found "rlstream\.trajectories\.v1"/,
  );
  assert.throws(() => cat.add('trajectories.v1', '{"type":', 'z.avsc'), /z\.avsc: not valid JSON/);
  const ambiguous = JSON.parse(v1Text);
  ambiguous.fields.find((f: Json) => f.name === 'ground_truth').type = ['string', 'bytes', 'null', 'int', 'long'];
  assert.throws(
    () => cat.add('trajectories.v1', ambiguous, 'w.avsc'),
    /w\.avsc: invalid Avro schema: ambiguous unwrapped union/,
  );
});

test('trajectories.v2 and scored.v2 (remax greedy baseline): v1 records read with baseline = null; v1 readers skip it', () => {
  const cat = SchemaCatalogue.load([dir]);
  for (const family of ['trajectories', 'scored'] as const) {
    assert.deepEqual(checkCompatibility(cat.get(`${family}.v1`)!.text, cat.get(`${family}.v2`)!.text), {
      compatible: true,
      errors: [],
    });
    const gen = new Gen(31);
    const { baseline: _b, ...g } =
      family === 'trajectories'
        ? withoutEpisodes(gen.trajectoryGroup(4, { n: 2, tokens: 3 }))
        : withoutRewardText(gen.scoredGroup(4, { n: 2, tokens: 3 }));
    const v1 = new Codec<Json>(family, { catalogue: cat, ref: `${family}.v1` });
    const v2c = new Codec<Json>(family, { catalogue: cat, ref: `${family}.v2` });
    const old = v2c.decode(v1.encode(g), `${family}.v1`);
    assert.equal(old.baseline, null, `${family}: a v1 record has no baseline`);
    const { baseline: _n, ...rest } = plain(old) as Json;
    assert.deepEqual(rest, plain(g));
    // a v2 record with a greedy baseline (sample index n) round-trips, and a v1 reader skips the baseline
    const last = g.samples[g.samples.length - 1] as Json;
    const baseline = { ...last, id: `${g.id}/n${g.samples.length}`, sample_index: g.samples.length };
    const withBaseline = { ...g, baseline };
    const bytes = v2c.encode(withBaseline);
    assert.deepEqual(plain(v2c.decode(bytes)), plain(withBaseline));
    assert.deepEqual(plain(v1.decode(bytes, `${family}.v2`)), plain(g));
  }
});

/** A trajectory group as trajectories.v1/v2 knew it (no episode or generated records). */
function withoutEpisodes(g: TrajectoryGroup): TrajectoryGroup {
  const old = ({ episode: _e, generated: _g, ...x }: TrajectorySample) => x as TrajectorySample;
  return { ...g, samples: g.samples.map(old), baseline: g.baseline ? old(g.baseline) : null };
}

test('trajectories.v3 (episode: multi-turn turns and outcome): v2 records read with episode = null; v2 readers skip it', () => {
  const cat = SchemaCatalogue.load([dir]);
  assert.deepEqual(checkCompatibility(cat.get('trajectories.v2')!.text, cat.get('trajectories.v3')!.text), {
    compatible: true,
    errors: [],
  });
  const g = withoutGenerated(new Gen(36).trajectoryGroup(4, { n: 6, tokens: 5, episodes: true }));
  assert.ok(
    g.samples.some((x) => x.episode !== null && x.episode.turns.length > 0),
    'the fixture has episodes',
  );
  const v2 = new Codec<Json>('trajectories', { catalogue: cat, ref: 'trajectories.v2' });
  const v3 = new Codec<Json>('trajectories', { catalogue: cat, ref: 'trajectories.v3' });
  assert.deepEqual(plain(v3.decode(v3.encode(g), 'trajectories.v3')), plain(g));
  const old = withoutEpisodes(g);
  const read = withoutGenerated(v3.decode(v2.encode(old), 'trajectories.v2') as TrajectoryGroup);
  assert.ok(read.samples.every((x) => x.episode === null));
  assert.deepEqual(plain(withoutEpisodes(read)), plain(old));
  assert.deepEqual(plain(v2.decode(v3.encode(g), 'trajectories.v3')), plain(old));
});

/** A scored group as scored.v1/v2 knew it (no reward_text). */
function withoutRewardText(g: ScoredGroup): ScoredGroup {
  return { ...g, samples: g.samples.map(({ reward_text: _t, generated: _g, ...x }) => x as ScoredSample) };
}

test('scored.v3 (reward_text: non-numeric reward details): v2 records read with reward_text = {}; v2 readers skip it', () => {
  const cat = SchemaCatalogue.load([dir]);
  assert.deepEqual(checkCompatibility(cat.get('scored.v2')!.text, cat.get('scored.v3')!.text), {
    compatible: true,
    errors: [],
  });
  const g = withoutGenerated(new Gen(34).scoredGroup(4, { n: 3, tokens: 3 }));
  assert.ok(
    g.samples.some((x) => Object.keys(x.reward_text).length > 0),
    'the fixture has text details',
  );
  const v2 = new Codec<Json>('scored', { catalogue: cat, ref: 'scored.v2' });
  const v3 = new Codec<Json>('scored', { catalogue: cat, ref: 'scored.v3' });
  // v3 round-trips the text details
  assert.deepEqual(plain(v3.decode(v3.encode(g), 'scored.v3')), plain(g));
  // a v2 record (written before the field existed) reads with empty text details
  const old = withoutRewardText(g);
  const read = v3.decode(v2.encode(old), 'scored.v2') as ScoredGroup;
  assert.ok(read.samples.every((x) => Object.keys(x.reward_text).length === 0));
  assert.deepEqual(plain(withoutRewardText(read)), plain(old));
  // a v2 reader (an older stage) reads a v3 record without the text details
  assert.deepEqual(plain(v2.decode(v3.encode(g), 'scored.v3')), plain(old));
});

test('the greedy baseline is checked like a sample: id, index not among the samples, training groups only', () => {
  const cat = SchemaCatalogue.load([dir]);
  const codec = new Codec<Json>('trajectories', { catalogue: cat });
  const g = new Gen(32).trajectoryGroup(4, { n: 2, tokens: 3 });
  const s0 = g.samples[0];
  assert.throws(
    () => codec.encode({ ...g, baseline: { ...s0 } }),
    /baseline\.sample_index: 0 appears twice in the group/,
  );
  assert.throws(() => codec.encode({ ...g, baseline: { ...s0, sample_index: 2 } }), /baseline\.id: .* is not ".*\/n2"/);
  const val = new Gen(33).trajectoryGroup(4, { n: 1, tokens: 3, kind: 'val' });
  assert.throws(
    () => codec.encode({ ...val, baseline: { ...val.samples[0], sample_index: 1, id: `${val.id}/n1` } }),
    /baseline: only training groups have a greedy baseline \(kind is val\)/,
  );
});

/** A prompt batch as prompts.v1 knew it (no image_refs). */
function withoutImageRefs(b: PromptBatch): PromptBatch {
  return { ...b, groups: b.groups.map(({ image_refs: _r, ...g }) => g as PromptGroup) };
}

test('prompts.v2 (image_refs: hash and size per image): v1 records read with image_refs = []; v1 readers skip it', () => {
  const cat = SchemaCatalogue.load([dir]);
  assert.equal(cat.latest('prompts').ref, 'prompts.v2');
  assert.deepEqual(checkCompatibility(cat.get('prompts.v1')!.text, cat.get('prompts.v2')!.text), {
    compatible: true,
    errors: [],
  });
  const gen = new Gen(35);
  let b = gen.promptBatch(3);
  for (let i = 0; i < 20 && !b.groups.some((g) => g.images.length > 0); i++) b = gen.promptBatch(3);
  assert.ok(
    b.groups.some((g) => g.image_refs.length > 0),
    'the fixture has images',
  );
  const v1 = new Codec<Json>('prompts', { catalogue: cat, ref: 'prompts.v1' });
  const v2 = new Codec<Json>('prompts', { catalogue: cat });
  assert.equal(v2.ref, 'prompts.v2');
  // v2 round-trips the refs
  assert.deepEqual(plain(v2.decode(v2.encode(b))), plain(b));
  // a v1 record (written before the field existed) reads with no refs
  const old = withoutImageRefs(b);
  const read = v2.decode(v1.encode(old), 'prompts.v1') as PromptBatch;
  assert.ok(read.groups.every((g) => g.image_refs.length === 0));
  assert.deepEqual(plain(withoutImageRefs(read)), plain(old));
  // a v1 reader (an older rollout stage) reads a v2 record without the refs
  assert.deepEqual(plain(v1.decode(v2.encode(b), 'prompts.v2')), plain(old));
  // refs are checked: one per image, sha256 hex, positive size
  const g0 = b.groups.find((g) => g.images.length > 0)!;
  const bad = (refs: PromptGroup['image_refs']) => ({
    ...b,
    groups: b.groups.map((g) => (g === g0 ? { ...g, image_refs: refs } : g)),
  });
  assert.throws(() => v2.encode(bad([...g0.image_refs, g0.image_refs[0]])), /image_refs: 2 refs for 1 images/);
  assert.throws(
    () => v2.encode(bad([{ ...g0.image_refs[0], hash: 'ABC' }])),
    /image_refs\[0\]\.hash: must be a lower-case hex sha256/,
  );
  assert.throws(
    () => v2.encode(bad([{ ...g0.image_refs[0], width: 0 }])),
    /image_refs\[0\]: size 0×28 must be positive/,
  );
});

test('updates.v2 (vppo: token mask, scaling factor, perturbed log-probs): v1 records read with vppo = null; v1 readers skip it', () => {
  const cat = SchemaCatalogue.load([dir]);
  assert.deepEqual(checkCompatibility(cat.get('updates.v1')!.text, cat.get('updates.v2')!.text), {
    compatible: true,
    errors: [],
  });
  const v1 = new Codec<Json>('updates', { catalogue: cat, ref: 'updates.v1' });
  const v2c = new Codec<Json>('updates', { catalogue: cat, ref: 'updates.v2' });
  const gen = new Gen(35);
  let g = withoutGenerated(gen.updateGroup(4, { n: 3, tokens: 4 }));
  while (g.filtered) g = withoutGenerated(gen.updateGroup(4, { n: 3, tokens: 4 }));
  const L = (i: number) => g.samples[i].response_ids.length;
  const withVppo = {
    ...g,
    samples: g.samples.map((x, i) => ({
      ...x,
      vppo:
        i === 1
          ? null
          : {
              perturbed_logprobs: new Float32Array(L(i)).fill(-2.5),
              token_mask: Buffer.from(Array.from({ length: L(i) }, (_, t) => t % 2)),
              scaling_factor: 0.8 + 0.1 * i,
            },
    })),
  };
  // v2 round-trips the VPPO fields
  const back = v2c.decode(v2c.encode(withVppo), 'updates.v2') as Json;
  assert.deepEqual(plain(back), plain(withVppo));
  assert.ok(back.samples[0].vppo.perturbed_logprobs instanceof Float32Array);
  // a v1 record (written before VPPO) reads with vppo = null; a v1 reader (an older update stage) skips it
  const old = { ...g, samples: g.samples.map(({ vppo: _v, ...x }) => x) };
  const read = v2c.decode(v1.encode(old), 'updates.v1') as Json;
  assert.ok(read.samples.every((x: Json) => x.vppo === null));
  assert.deepEqual(plain(v1.decode(v2c.encode(withVppo), 'updates.v2')), plain(old));
});

/** A record as the version before `generated` knew it. */
function withoutGenerated<G extends { samples: Array<{ generated: unknown }> }>(g: G): G {
  return { ...g, samples: g.samples.map(({ generated: _g, ...x }) => x) } as G;
}

test("trajectories.v4, scored.v4, updates.v3 (generated: an image policy's PNG and denoising trajectory): older records read with generated = null; older readers skip it", () => {
  const cat = SchemaCatalogue.load([dir]);
  const gen = new Gen(37);
  const cases = [
    ['trajectories', 3, gen.trajectoryGroup(2, { n: 3, tokens: 4, generated: true })],
    ['scored', 3, gen.scoredGroup(2, { n: 3, tokens: 4, generated: true })],
    ['updates', 2, gen.updateGroup(2, { n: 3, tokens: 4, generated: true })],
  ] as const;
  for (const [family, before, g] of cases) {
    const oldRef = `${family}.v${before}`,
      newRef = `${family}.v${before + 1}`;
    assert.equal(cat.latest(family).ref, newRef);
    assert.deepEqual(checkCompatibility(cat.get(oldRef)!.text, cat.get(newRef)!.text), {
      compatible: true,
      errors: [],
    });
    assert.ok(
      g.samples.every((x) => x.generated !== null && x.generated.latents.length > 0),
      'the fixture has images',
    );
    const older = new Codec<Json>(family, { catalogue: cat, ref: oldRef });
    const newer = new Codec<Json>(family, { catalogue: cat });
    assert.deepEqual(plain(newer.decode(newer.encode(g))), plain(g), `${newRef} round-trips generated`);
    const old = withoutGenerated(g as { samples: Array<{ generated: unknown }> });
    const read = newer.decode(older.encode(old), oldRef) as { samples: Array<{ generated: unknown }> };
    assert.ok(
      read.samples.every((x) => x.generated === null),
      `${oldRef} records read with generated = null`,
    );
    assert.deepEqual(plain(withoutGenerated(read)), plain(old));
    assert.deepEqual(plain(older.decode(newer.encode(g), newRef)), plain(old), `a ${oldRef} reader skips generated`);
  }
});
