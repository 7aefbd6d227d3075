/**
 * Seeded random records of every schema family for the contract tests: same seed, same records.
 * Text mixes ASCII with multi-byte characters (accents, CJK, emoji) to exercise UTF-8.
 */
import { imageHash } from '../../../lib/data/image-hash.ts';
import { Rng } from '../../../lib/util/rng.ts';
import {
  chunkId,
  controlId,
  deadLetterId,
  groupIdFor,
  hashId,
  metricsId,
  policyId,
  refillId,
  sampleIdFor,
} from '../../../lib/contracts/ids.ts';
import type {
  ControlEvent,
  DeadLetter,
  Kind,
  MetricsRecord,
  PolicyVersion,
  PromptBatch,
  PromptGroup,
  ScoredGroup,
  ScoredSample,
  SchemaValues,
  TrajectoryGroup,
  TrajectorySample,
  UpdateGroup,
  UpdateSample,
} from '../../../lib/contracts/types.ts';

const PIECES = [
  'the',
  'answer',
  'is',
  '42',
  'héllo',
  'naïve',
  '数学',
  '答え',
  '🙂',
  '∑x²',
  'Ω',
  '\n',
  '"quoted"',
  '\\',
  'tab\there',
];

export interface Shape {
  /** Samples per group. */
  n?: number;
  /** Response tokens per sample (exact when given, else random 0..64). */
  tokens?: number;
  promptTokens?: number;
  kind?: Kind;
  /** Make every array empty and every string short (edge case). */
  empty?: boolean;
  /** Give about a third of the samples a multi-turn episode record (trajectories.v3). */
  episodes?: boolean;
  /** Give every sample a generated image and its denoising trajectory (trajectories.v4). */
  generated?: boolean;
}

export class Gen {
  readonly rng: Rng;
  constructor(
    seed: number | string,
    readonly runId = 'run-7.a_b',
  ) {
    this.rng = Rng.fromSeed(seed);
  }

  int(n: number): number {
    return this.rng.int(n);
  }
  text(words: number): string {
    return Array.from({ length: words }, () => PIECES[this.rng.int(PIECES.length)]).join(' ');
  }
  ids(n: number): Int32Array {
    const a = new Int32Array(n);
    for (let i = 0; i < n; i++) a[i] = this.rng.int(151_000) - (i === 0 ? 1 : 0);
    return a;
  }
  floats(n: number): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = -this.rng.next() * 8;
    return a;
  }
  bytes(n: number): Buffer {
    const b = Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = this.rng.int(256);
    return b;
  }

  private header(kind: Kind, step: number, promptIndex: number, shape: Shape) {
    const id = groupIdFor(kind, this.runId, step, promptIndex);
    const pt = shape.empty ? 0 : (shape.promptTokens ?? 1 + this.int(32));
    return {
      run_id: this.runId,
      id,
      group_uid: hashId(id),
      step,
      policy_version: Math.max(0, step - 1 - this.int(2)),
      kind,
      epoch: kind === 'val' ? 0 : this.int(3),
      attempt: kind === 'val' ? 0 : this.int(2),
      prompt_index: promptIndex,
      dataset_index: this.int(10_000),
      prompt_ids: this.ids(pt),
      prompt_text: shape.empty ? '' : this.text(8),
      images: shape.empty ? [] : this.int(3) === 0 ? [this.bytes(1 + this.int(64))] : [],
      data_source: shape.empty ? '' : 'arith',
      ground_truth: shape.empty ? '' : String(this.int(100)),
      extra_info: shape.empty ? '{}' : JSON.stringify({ level: this.int(5), note: this.text(2) }),
    };
  }

  private sample(
    groupIdStr: string,
    kind: Kind,
    step: number,
    promptIndex: number,
    i: number,
    shape: Shape,
  ): TrajectorySample {
    const len = shape.empty ? 0 : (shape.tokens ?? this.int(65));
    return {
      id: sampleIdFor(kind, this.runId, step, promptIndex, i),
      sample_index: i,
      prompt_index: promptIndex,
      response_ids: this.ids(len),
      response_text: shape.empty ? '' : this.text(Math.max(1, len >> 2)),
      behaviour_logprobs: this.floats(len),
      response_mask:
        len > 0 && this.int(2) === 0 ? Buffer.from(Array.from(this.bytes(len), (b) => b & 1)) : Buffer.alloc(0),
      finish_reason: (['stop', 'length', 'abort'] as const)[this.int(3)],
      episode: shape.episodes && len > 0 && this.int(3) > 0 ? this.episode(len) : null,
      generated: shape.generated ? this.generated(len) : null,
    };
  }

  /** A generated image record of `steps` stochastic steps (plus the last, deterministic one) over 2×2 pixels. */
  private generated(steps: number): NonNullable<TrajectorySample['generated']> {
    const png = this.bytes(8 + this.int(32));
    return {
      png,
      hash: imageHash(png),
      timesteps: Float32Array.from({ length: steps + 2 }, (_, i) => 1 - i / (steps + 1)),
      sigmas: Float32Array.from({ length: steps + 1 }, (_, i) => (i < steps ? this.rng.next() : 0)),
      latents: this.floats((steps + 2) * 4),
    };
  }

  /** A multi-turn episode record over `len` response tokens (trajectories.v3). */
  private episode(len: number): NonNullable<TrajectorySample['episode']> {
    const cut = this.int(len + 1);
    const failed = this.int(3) === 0;
    return {
      turns: [
        {
          role: 'assistant',
          start: 0,
          end: cut,
          text: this.text(2),
          tool_name: null,
          arguments: null,
          latency_ms: this.rng.next() * 100,
          error: null,
          reward: 0,
        },
        {
          role: 'tool',
          start: cut,
          end: len,
          text: this.text(3),
          tool_name: 'calc',
          arguments: '{"x": 1}',
          latency_ms: 5,
          error: failed ? `timeout: ${this.text(1)}` : null,
          reward: this.rng.next(),
        },
      ],
      assistant_turns: 1 + this.int(5),
      reward: this.rng.next(),
      done: this.int(2) === 0,
      failure: failed ? `timeout: ${this.text(2)}` : null,
      timed_out: failed,
      tool_calls: this.int(4),
      tool_errors: this.int(2),
      metrics: this.int(2) ? { solved: 1, guesses: this.int(7) } : {},
    };
  }

  promptBatch(step = 1 + this.int(50), shape: Shape = {}): PromptBatch {
    const kind = shape.kind ?? 'train';
    const count = shape.empty ? 1 : 1 + this.int(3);
    const first = this.int(100);
    const groups: PromptGroup[] = Array.from({ length: count }, (_, j) => {
      const h = this.header(kind, step, first + j, shape);
      return {
        id: h.id,
        group_uid: h.group_uid,
        prompt_index: h.prompt_index,
        dataset_index: h.dataset_index,
        n: shape.n ?? 1 + this.int(8),
        prompt_ids: h.prompt_ids,
        prompt_text: h.prompt_text,
        images: h.images,
        image_refs: h.images.map((b) => ({ hash: imageHash(b), width: 28 * (1 + (b.length % 3)), height: 28 })),
        data_source: h.data_source,
        ground_truth: h.ground_truth,
        extra_info: h.extra_info,
      };
    });
    return {
      run_id: this.runId,
      id: chunkId(kind, this.runId, step, first, count),
      step,
      policy_version: Math.max(0, step - 1),
      kind,
      epoch: this.int(3),
      attempt: 0,
      sampling: { temperature: kind === 'val' ? 0 : 1, top_p: 0.95, top_k: -1, max_new_tokens: 512 },
      groups,
    };
  }

  trajectoryGroup(step = 1 + this.int(50), shape: Shape = {}): TrajectoryGroup {
    const kind = shape.kind ?? 'train';
    const h = this.header(kind, step, this.int(100), shape);
    const n = shape.empty ? 0 : (shape.n ?? 1 + this.int(8));
    return {
      ...h,
      samples: Array.from({ length: n }, (_, i) => this.sample(h.id, kind, step, h.prompt_index, i, shape)),
      baseline: null,
    };
  }

  scoredGroup(step = 1 + this.int(50), shape: Shape = {}): ScoredGroup {
    const t = this.trajectoryGroup(step, shape);
    const samples: ScoredSample[] = t.samples.map(({ episode: _episode, ...s }) => {
      const failed = this.int(5) === 0;
      return {
        ...s,
        reward: failed ? null : this.rng.next() * 2 - 1,
        reward_details: failed ? ({} as Record<string, number>) : { accuracy: this.int(2), format: this.rng.next() },
        reward_text: failed ? ({} as Record<string, string>) : { pred: this.text(1), note: this.text(3) },
        failure: failed
          ? {
              code: 'ERR_REWARD_FN',
              message: `boom ${this.text(2)}`,
              retriable: this.int(2) === 0,
              attempts: 1 + this.int(3),
            }
          : null,
      };
    });
    return { ...t, reward_fn: 'fn:exact_match', samples, baseline: null };
  }

  updateGroup(step = 1 + this.int(50), shape: Shape = {}): UpdateGroup {
    const { baseline: _b, ...s } = this.scoredGroup(step, shape);
    const filtered = this.int(4) === 0;
    const samples: UpdateSample[] = s.samples.map(({ reward_text: _text, ...x }) => {
      const len = x.response_ids.length;
      return {
        ...x,
        advantages: this.floats(len),
        returns: this.floats(len),
        ref_logprobs: this.int(2) ? this.floats(len) : new Float32Array(0),
        values: this.int(2) ? this.floats(len) : new Float32Array(0),
        loss_weights: this.floats(len).map((v) => (v < -4 ? 0 : 1)),
        vppo:
          this.int(3) === 0
            ? {
                perturbed_logprobs: this.floats(len),
                token_mask: Buffer.from(Array.from({ length: len }, () => this.int(2))),
                scaling_factor: 0.8 + this.rng.next() * 0.4,
              }
            : null,
      };
    });
    const rewards = samples.map((x) => x.reward).filter((r): r is number => r !== null);
    const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
    return {
      ...s,
      estimator: 'grpo',
      filtered,
      filter_reason: filtered ? 'all rewards equal' : null,
      reward_mean: mean,
      reward_std: mean === null ? null : Math.sqrt(rewards.reduce((a, b) => a + (b - mean) ** 2, 0) / rewards.length),
      samples,
    };
  }

  policyVersion(version = 1 + this.int(20)): PolicyVersion {
    return {
      run_id: this.runId,
      id: policyId(this.runId, version),
      step: version,
      policy_version: version,
      parent_version: version === 0 ? null : version - 1,
      checkpoint_path: `runs/x/ckpt/v${version}/model.onnx`,
      sha256: this.bytes(32).toString('hex'),
      format: 'onnx',
      size_bytes: 2 ** 33 + this.int(1000),
      created_ms: 1_763_700_000_000 + this.int(1e6),
      consumed: Array.from({ length: this.int(4) }, (_, p) => ({
        topic: `rlstream.${this.runId}.updates`,
        partition: p,
        next_offset: 2 ** 40 + this.int(100),
      })),
      groups: 64,
      samples: 512,
      tokens: 2 ** 35,
    };
  }

  metrics(step = 1 + this.int(50)): MetricsRecord {
    return {
      run_id: this.runId,
      id: metricsId(this.runId, 'update', 'train', step, 'step'),
      step,
      policy_version: step,
      kind: 'train',
      stage: 'update',
      replica: '',
      values: {
        'actor/pg_loss': this.rng.next(),
        'reward/mean': -this.rng.next(),
        'perf/tokens_per_s': 1e5 * this.rng.next(),
        'ünïcode/µ': 1,
      },
      timing_ms: { update: 100 * this.rng.next(), 'update/backward': 3.5 },
      time_ms: 1_763_700_000_000,
    };
  }

  /** One control event of each type. */
  controlEvents(): ControlEvent[] {
    const base = { run_id: this.runId, policy_version: 3, time_ms: 1_763_700_000_000 };
    const none = {
      run_started: null,
      epoch_started: null,
      refill_request: null,
      val_round_done: null,
      run_done: null,
      run_failed: null,
    };
    return [
      {
        ...base,
        ...none,
        id: controlId(this.runId, 'run_started'),
        step: 0,
        type: 'run_started',
        run_started: {
          config_json: JSON.stringify({ a: 'é', seed: 1 }),
          config_sha256: 'ab'.repeat(32),
          seed: 2 ** 40,
          total_steps: 100,
          steps_per_epoch: 10,
          resumed_from: null,
        },
      },
      {
        ...base,
        ...none,
        id: controlId(this.runId, 'epoch_started', 'e1'),
        step: 11,
        type: 'epoch_started',
        epoch_started: { epoch: 1, first_step: 11 },
      },
      {
        ...base,
        ...none,
        id: refillId(this.runId, 4, 1),
        step: 4,
        type: 'refill_request',
        refill_request: {
          request: 1,
          needed: 3,
          filtered_group_ids: [groupIdFor('train', this.runId, 4, 0), groupIdFor('train', this.runId, 4, 7)],
          reason: 'all rewards equal',
        },
      },
      {
        ...base,
        ...none,
        id: controlId(this.runId, 'val_round_done', 'r5'),
        step: 5,
        type: 'val_round_done',
        val_round_done: { round: 5, groups: 100, samples: 100, failures: 0 },
      },
      {
        ...base,
        ...none,
        id: controlId(this.runId, 'run_done'),
        step: 100,
        type: 'run_done',
        run_done: { final_version: 100, steps: 100 },
      },
      {
        ...base,
        ...none,
        id: controlId(this.runId, 'run_failed'),
        step: 7,
        type: 'run_failed',
        run_failed: { stage: 'reward', code: 'ERR_CONFIG', message: 'reward.url unreachable ✗' },
      },
    ];
  }

  deadLetter(): DeadLetter {
    return {
      run_id: this.runId,
      id: deadLetterId(this.runId, 'reward', `rlstream.${this.runId}.trajectories`, 3, 2 ** 40),
      step: null,
      policy_version: null,
      stage: 'reward',
      source_topic: `rlstream.${this.runId}.trajectories`,
      source_partition: 3,
      source_offset: 2 ** 40,
      key: Buffer.from('abc'),
      headers: { 'rl-schema': Buffer.from('trajectories.v1') },
      payload: this.bytes(100),
      schema: 'trajectories.v1',
      reason: 'truncated ✂',
      error_code: 'ERR_POISON',
      retriable: false,
      attempts: 1,
      time_ms: 1_763_700_000_000,
    };
  }

  /** A record of each family (control: one of each type). */
  all(): { [F in keyof SchemaValues]: SchemaValues[F][] } {
    return {
      prompts: [this.promptBatch(), this.promptBatch(3, { kind: 'val' }), this.promptBatch(2, { empty: true })],
      trajectories: [
        this.trajectoryGroup(),
        this.trajectoryGroup(4, { kind: 'val' }),
        this.trajectoryGroup(2, { empty: true }),
      ],
      scored: [this.scoredGroup(), this.scoredGroup(6, { kind: 'val', n: 1 }), this.scoredGroup(2, { empty: true })],
      updates: [this.updateGroup(), this.updateGroup(9, { n: 16, tokens: 100 }), this.updateGroup(2, { empty: true })],
      policy: [this.policyVersion(), this.policyVersion(0)],
      metrics: [this.metrics()],
      control: this.controlEvents(),
      deadletter: [this.deadLetter()],
    };
  }
}

/** Plain-object form of a decoded record (avsc builds class instances) for deepEqual. */
export function plain(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(plain);
  if (v && typeof v === 'object' && !ArrayBuffer.isView(v)) {
    const o: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) o[k] = plain(x);
    return o;
  }
  if (Buffer.isBuffer(v)) return Buffer.from(v);
  return v;
}
