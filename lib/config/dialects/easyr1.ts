/**
 * EasyR1 (hiyouga/EasyR1) configs: `data`, `algorithm`, `worker.{actor,critic,ref,rollout,reward}`,
 * `trainer`. Its worker section is shared with MTRL (a fork), so the worker rules are built here
 * for both. EasyR1 counts worker.actor.global_batch_size in prompts and multiplies it by
 * worker.rollout.n (fsdp_workers.py); rlstream counts samples.
 */
import { extname } from 'node:path';
import {
  KL_NAMES,
  LR_SCHEDULERS,
  loggerRule,
  onlyInert,
  positiveInt,
  rename,
  timesN,
  valueMap,
  type Assignments,
  type Dialect,
  type Rule,
  type RuleContext,
} from './dialect.ts';

/** `path.py:name` (EasyR1's reward_function) → path and function name. */
export function splitFunctionRef(ref: string): { path: string; name: string | null } {
  const m = /^(.*\.(?:py|mjs|cjs|js|ts|mts)):([A-Za-z_][A-Za-z0-9_]*)$/.exec(ref);
  return m ? { path: m[1], name: m[2] } : { path: ref, name: null };
}

/**
 * The reward keys of a reward function file: a Python file runs in Python in `form` (reward_fn_name
 * its function, default `defaultName`); a JS/TS module is called as rlstream calls one (its default
 * or compute_score export).
 */
export function rewardFunctionAssignments(
  path: string,
  name: string | null,
  form: string,
  defaultName: string,
): Assignments | string {
  const ext = extname(path).toLowerCase();
  if (ext === '.py')
    return [
      ['reward.reward_fn_path', path],
      ['reward.reward_fn_name', name ?? defaultName],
      ['reward.reward_fn_form', form],
    ];
  if (['.mjs', '.cjs', '.js', '.ts', '.mts'].includes(ext)) {
    if (name !== null && name !== 'compute_score' && name !== 'default')
      return [
        ['reward.reward_fn_path', path],
        ['reward.reward_fn_name', name],
      ];
    return [['reward.reward_fn_path', path]];
  }
  return `${JSON.stringify(path)} is not a reward function file rlstream can run (a .py file, or a JS/TS module)`;
}

const EASYR1_FORMS: Readonly<Record<string, string>> = { batch: 'easyr1_batch', sequential: 'easyr1_sequential' };

function easyr1RewardForm(ctx: RuleContext, prefix: string): string {
  const t = ctx.get(`${prefix}reward.reward_type`);
  return typeof t === 'string' && Object.hasOwn(EASYR1_FORMS, t) ? EASYR1_FORMS[t] : 'easyr1_batch';
}

function rewardFunctionRule(from: string, prefix: string, form: (ctx: RuleContext) => string): Rule {
  return {
    from,
    to: ['reward.reward_fn_path', 'reward.reward_fn_name', 'reward.reward_fn_form'],
    note: '`file.py:name` → reward_fn_path + reward_fn_name (Python, EasyR1 batch form; sequential with reward_type: sequential); a .mjs/.js module runs as a JS reward',
    map: (v, ctx) => {
      if (v === null || v === undefined) return [];
      if (typeof v !== 'string') return `expected "file.py:function", got ${JSON.stringify(v)}`;
      const { path, name } = splitFunctionRef(v);
      return rewardFunctionAssignments(path, name, form(ctx), 'compute_score');
    },
  };
}

/** EasyR1's val_override_config: sampling for validation, the training rollout's where not overridden. */
function valOverrideRule(from: string, rollout: string): Rule {
  const KNOWN = ['temperature', 'top_p', 'top_k', 'n'];
  return {
    from,
    to: [
      'rollout.val_override.temperature',
      'rollout.val_override.top_p',
      'rollout.val_override.top_k',
      'rollout.val_override.n',
    ],
    note: `temperature, top_p, top_k, n; a key not given is the training rollout's (${rollout}.*), as EasyR1 samples validation with the rollout settings updated by this mapping`,
    map: (v, ctx) => {
      const o = (v ?? {}) as Record<string, unknown>;
      if (typeof o !== 'object' || Array.isArray(o)) return `expected a mapping, got ${JSON.stringify(v)}`;
      const extra = Object.keys(o).filter((k) => !KNOWN.includes(k));
      if (extra.length > 0) return `${extra.join(', ')} cannot be set for validation here (only ${KNOWN.join(', ')})`;
      const pick = (k: string, dflt: unknown) => o[k] ?? ctx.get(`${rollout}.${k}`) ?? dflt;
      return [
        ['rollout.val_override.temperature', pick('temperature', 1.0)],
        ['rollout.val_override.top_p', pick('top_p', 1.0)],
        ['rollout.val_override.top_k', pick('top_k', -1)],
        ['rollout.val_override.n', pick('n', 1)],
      ];
    },
  };
}

/** EasyR1 optim keys under `src` (worker.actor.optim / worker.critic.optim) → `dst` (actor.optim / critic.optim). */
function optimRules(src: string, dst: string): Rule[] {
  return [
    valueMap(`${src}.lr_scheduler_type`, `${dst}.lr_scheduler`, LR_SCHEDULERS),
    {
      from: `${src}.min_lr_ratio`,
      to: [`${dst}.min_lr_ratio`],
      note: 'null → 0',
      map: (v) => [[`${dst}.min_lr_ratio`, v ?? 0]],
    },
    onlyInert(`${src}.strategy`, ['adamw'], 'AdamW keeps fp32 moments here (adamw_bf16 is not implemented)'),
  ];
}

/** LoRA as EasyR1 writes it: worker.actor.model.lora.{rank, alpha, target_modules, exclude_modules}. */
function easyr1LoraRules(m: string): Rule[] {
  return [
    {
      from: `${m}.lora.rank`,
      to: ['actor.model.lora'],
      note: '0 = full fine-tuning; > 0 = actor.model.lora with rank, alpha and target_modules',
      map: (v, ctx) => {
        if (v === 0 || v === null) return [['actor.model.lora', null]];
        if (positiveInt(v) === null) return `expected an integer ≥ 0, got ${JSON.stringify(v)}`;
        const t = ctx.get(`${m}.lora.target_modules`) ?? 'all-linear';
        const targets =
          t === 'all-linear'
            ? 'all-linear'
            : typeof t === 'string'
              ? t
                  .split(',')
                  .map((s) => s.trim())
                  .filter(Boolean)
              : t;
        return [['actor.model.lora', { rank: v, alpha: ctx.get(`${m}.lora.alpha`) ?? 64, target_modules: targets }]];
      },
    },
    { from: `${m}.lora.alpha`, to: [], note: 'read with lora.rank' },
    { from: `${m}.lora.target_modules`, to: [], note: 'read with lora.rank (all-linear, or a comma-separated list)' },
    onlyInert(
      `${m}.lora.exclude_modules`,
      [null, '.*visual.*'],
      'rlstream adapts decoder linear layers only (never the vision tower); other exclusions are not implemented',
    ),
  ];
}

/**
 * The worker section as EasyR1 (and MTRL) write it, under `w` (`worker`). `lora` adds the LoRA
 * rules of the dialect's own spelling.
 */
export function workerRules(w: string, loraRules: Rule[], rewardForm: (ctx: RuleContext) => string): Rule[] {
  const a = `${w}.actor`;
  const r = `${w}.rollout`;
  const c = `${w}.critic`;
  return [
    timesN(`${a}.global_batch_size`, 'actor.global_batch_size', `${r}.n`),
    rename(`${a}.max_grad_norm`, 'actor.optim.max_grad_norm'),
    valueMap(`${a}.loss_avg_mode`, 'actor.loss_agg_mode', { token: 'token-mean', seq: 'seq-mean-token-mean' }),
    valueMap(`${a}.loss_type`, 'algorithm.policy_loss', {
      default: 'vanilla',
      vanilla: 'vanilla',
      gspo: 'gspo',
      cispo: 'cispo',
      sapo: 'sapo',
    }),
    rename(`${a}.tau_positive`, 'algorithm.sapo.tau_pos'),
    rename(`${a}.tau_negative`, 'algorithm.sapo.tau_neg'),
    rename(`${a}.model.model_path`, 'actor.model.path'),
    onlyInert(`${a}.model.tokenizer_path`, [null], 'the tokenizer is the model directory’s (actor.model.path)'),
    onlyInert(`${a}.model.override_config`, [{}], 'the architecture is the model directory’s config.json'),
    ...loraRules,
    ...optimRules(`${a}.optim`, 'actor.optim'),
    rename(`${r}.max_new_tokens`, 'data.max_response_length'),
    {
      from: `${r}.limit_images`,
      to: ['data.limit_images'],
      note: '0 (vLLM’s own limit: one image per prompt) → 1; n > 0 → n',
      map: (v) => (v === 0 || v === null ? [['data.limit_images', 1]] : [['data.limit_images', v]]),
    },
    onlyInert(`${r}.ignore_eos`, [false], 'responses always end at the end-of-sequence token here'),
    valOverrideRule(`${r}.val_override_config`, r),
    {
      from: `${c}.global_batch_size`,
      to: [],
      note: 'the critic trains on the actor’s mini-batches: accepted when equal to worker.actor.global_batch_size',
      map: (v, ctx) =>
        v === ctx.get(`${a}.global_batch_size`)
          ? []
          : `${JSON.stringify(v)} differs from ${a}.global_batch_size (${JSON.stringify(ctx.get(`${a}.global_batch_size`))}); rlstream's critic updates on the actor's mini-batches`,
    },
    rename(`${c}.max_grad_norm`, 'critic.optim.max_grad_norm'),
    onlyInert(`${c}.loss_avg_mode`, ['token'], 'the value loss is averaged over tokens here'),
    rename(`${c}.model.model_path`, 'critic.model.path'),
    ...optimRules(`${c}.optim`, 'critic.optim'),
    rewardFunctionRule(`${w}.reward.reward_function`, `${w}.`, rewardForm),
    rewardFunctionRule(`${w}.reward.score_function`, `${w}.`, rewardForm),
    rename(`${w}.reward.reward_function_kwargs`, 'reward.reward_fn_kwargs'),
    rename(`${w}.reward.score_function_kwargs`, 'reward.reward_fn_kwargs'),
    {
      from: `${w}.reward.reward_type`,
      to: ['reward.reward_fn_form'],
      note: 'batch → easyr1_batch, sequential → easyr1_sequential (read with reward_function); function: the batch form',
      map: (v) =>
        v === 'batch' || v === 'sequential' || v === 'function'
          ? []
          : `${JSON.stringify(v)} is not supported: rlstream runs reward functions (batch, sequential); a reward model is reward.type=model with an ONNX scorer`,
    },
    onlyInert(`${w}.reward.skip_special_tokens`, [true], 'responses reach the reward decoded without special tokens'),
  ];
}

/** Keys of the worker section that cannot apply in a single-process ONNX trainer. */
export function workerNotApplicable(w: string): string[] {
  return [
    `${w}.hybrid_engine`,
    `${w}.ref.*`,
    `${w}.actor.strategy`,
    `${w}.actor.fsdp.*`,
    `${w}.actor.offload.*`,
    `${w}.actor.padding_free`,
    `${w}.actor.dynamic_batching`,
    `${w}.actor.ulysses_size`,
    `${w}.actor.ulysses_sequence_parallel_size`,
    `${w}.actor.use_torch_compile`,
    `${w}.actor.model.trust_remote_code`,
    `${w}.actor.optim.training_steps`,
    `${w}.critic.strategy`,
    `${w}.critic.fsdp.*`,
    `${w}.critic.offload.*`,
    `${w}.critic.padding_free`,
    `${w}.critic.dynamic_batching`,
    `${w}.critic.ulysses_size`,
    `${w}.critic.micro_batch_size_per_device_for_update`,
    `${w}.critic.micro_batch_size_per_device_for_experience`,
    `${w}.critic.model.trust_remote_code`,
    `${w}.critic.optim.training_steps`,
    `${w}.rollout.name`,
    `${w}.rollout.seed`,
    `${w}.rollout.dtype`,
    `${w}.rollout.gpu_memory_utilization`,
    `${w}.rollout.enforce_eager`,
    `${w}.rollout.enable_chunked_prefill`,
    `${w}.rollout.enable_prefix_caching`,
    `${w}.rollout.tensor_parallel_size`,
    `${w}.rollout.max_model_len`,
    `${w}.rollout.max_num_batched_tokens`,
    `${w}.rollout.disable_log_stats`,
    `${w}.rollout.disable_tqdm`,
    `${w}.reward.num_cpus`,
  ];
}

/** EasyR1's KL switches: disable_kl, and use_kl_loss false = the KL penalty in the reward. */
export function klRules(alg: string, names: { disable: string; useLoss: string }): Rule[] {
  return [
    {
      from: `${alg}.${names.useLoss}`,
      to: ['algorithm.use_kl_loss', 'algorithm.use_kl_in_reward'],
      note: `true → the KL loss; false → the KL penalty in the reward (as EasyR1); both off with ${alg}.${names.disable}`,
      map: (v, ctx) => {
        const off = ctx.get(`${alg}.${names.disable}`) === true;
        return [
          ['algorithm.use_kl_loss', !off && v === true],
          ['algorithm.use_kl_in_reward', !off && v !== true],
        ];
      },
    },
    { from: `${alg}.${names.disable}`, to: [], note: `read with ${alg}.${names.useLoss}` },
  ];
}

/** EasyR1's trainer.max_try_make_batch (-1 = no limit, which rlstream does not have). */
export function maxTryRule(from: string): Rule {
  return {
    from,
    to: ['algorithm.max_try_make_batch'],
    note: '-1 (no limit) is refused',
    map: (v) =>
      positiveInt(v) !== null
        ? [['algorithm.max_try_make_batch', v]]
        : `${JSON.stringify(v)}: rlstream needs a limit (an integer ≥ 1)`,
  };
}

export const easyr1: Dialect = {
  name: 'easyr1',
  title: 'EasyR1',
  marks: ['worker'],
  about: 'hiyouga/EasyR1 (examples/config.yaml): data, algorithm, worker.{actor,critic,ref,rollout,reward}, trainer.',
  prefixes: [
    ['worker.actor.', 'actor.'],
    ['worker.rollout.', 'rollout.'],
    ['worker.critic.', 'critic.'],
    ['worker.reward.', 'reward.'],
  ],
  rules: [
    onlyInert('data.mini_rollout_batch_size', [null], 'prompts are generated a whole rollout batch at a time'),
    onlyInert('data.override_chat_template', [null], "the chat template is the model directory's"),
    valueMap('algorithm.kl_penalty', 'algorithm.kl_penalty', KL_NAMES),
    ...klRules('algorithm', { disable: 'disable_kl', useLoss: 'use_kl_loss' }),
    ...workerRules('worker', easyr1LoraRules('worker.actor.model'), (ctx) => easyr1RewardForm(ctx, 'worker.')),
    loggerRule('trainer.logger'),
    rename('trainer.save_checkpoint_path', 'trainer.run_dir'),
    maxTryRule('trainer.max_try_make_batch'),
    onlyInert('trainer.critic_warmup', [0], 'the actor updates from the first step'),
  ],
  notApplicable: [
    ...workerNotApplicable('worker'),
    'data.filter_overlong_prompts_workers',
    'data.video_fps',
    'trainer.nnodes',
    'trainer.n_gpus_per_node',
    'trainer.save_model_only',
    'trainer.ray_timeline',
  ],
  defaults: {
    'worker.rollout.n': 1,
    'worker.actor.global_batch_size': 256,
    'algorithm.use_kl_loss': false,
    'algorithm.kl_penalty': 'kl',
    'algorithm.kl_coef': 1e-3,
    'worker.rollout.val_override_config': {},
    'trainer.total_epochs': 15,
    'trainer.val_generations_to_log': 0,
  },
};
