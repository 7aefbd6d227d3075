/**
 * verl (volcengine/verl, verl/trainer/config/ppo_trainer.yaml) configs: `data`,
 * `actor_rollout_ref.{model,actor,ref,rollout}`, `critic`, `reward_model`, `custom_reward_function`,
 * `algorithm`, `trainer`, and Hydra-style `key=value` overrides on the command line. verl counts
 * actor.ppo_mini_batch_size (and the critic's) in prompts and multiplies it by rollout.n
 * (fsdp_workers.py); rlstream counts samples.
 */
import { rewardFunctionAssignments } from './easyr1.ts';
import {
  KL_NAMES,
  LR_SCHEDULERS,
  loggerRule,
  onlyInert,
  positiveInt,
  rename,
  timesN,
  valueMap,
  type Dialect,
  type Rule,
} from './dialect.ts';

const ARA = 'actor_rollout_ref';
const N = `${ARA}.rollout.n`;

/** verl optim keys under `src` → `dst` (actor.optim / critic.optim). */
function optimRules(src: string, dst: string): Rule[] {
  return [
    {
      from: `${src}.lr_warmup_steps`,
      to: [`${dst}.lr_warmup_steps`],
      note: 'a negative value (verl: use lr_warmup_steps_ratio) → null',
      map: (v) => [[`${dst}.lr_warmup_steps`, typeof v === 'number' && v >= 0 ? v : null]],
    },
    rename(`${src}.lr_warmup_steps_ratio`, `${dst}.lr_warmup_ratio`),
    {
      from: `${src}.min_lr_ratio`,
      to: [`${dst}.min_lr_ratio`],
      note: 'null → 0',
      map: (v) => [[`${dst}.min_lr_ratio`, v ?? 0]],
    },
    valueMap(`${src}.warmup_style`, `${dst}.lr_scheduler`, LR_SCHEDULERS),
    valueMap(`${src}.lr_scheduler_type`, `${dst}.lr_scheduler`, LR_SCHEDULERS),
    onlyInert(`${src}.num_cycles`, [0.5], 'the cosine schedule is a half cycle to min_lr_ratio'),
    rename(`${src}.clip_grad`, `${dst}.max_grad_norm`),
    onlyInert(`${src}.optimizer`, ['AdamW', 'adamw'], 'the optimizer is AdamW'),
  ];
}

const KL_LOSS = `${ARA}.actor.use_kl_loss`;
const KL_REWARD = 'algorithm.use_kl_in_reward';

export const verl: Dialect = {
  name: 'verl',
  title: 'verl',
  marks: [ARA, 'custom_reward_function', 'reward_model', 'ray_init'],
  about:
    'volcengine/verl (verl/trainer/config/ppo_trainer.yaml, the GSM8K quickstart): data, actor_rollout_ref.*, critic, reward_model, custom_reward_function, algorithm, trainer; Hydra-style key=value overrides.',
  prefixes: [
    [`${ARA}.actor.`, 'actor.'],
    [`${ARA}.rollout.`, 'rollout.'],
    [`${ARA}.model.`, 'actor.model.'],
  ],
  rules: [
    rename('data.train_batch_size', 'data.rollout_batch_size', 'prompts per step'),
    {
      from: 'data.val_batch_size',
      to: ['data.val_batch_size'],
      note: 'null → -1 (the whole validation set)',
      map: (v) => [['data.val_batch_size', v ?? -1]],
    },
    rename('data.apply_chat_template_kwargs', 'data.chat_template_kwargs'),
    onlyInert('data.reward_fn_key', ['data_source'], "the reward function gets each row's data_source field"),
    onlyInert(
      'data.truncation',
      ['error'],
      'an overlong prompt is filtered (data.filter_overlong_prompts) or a bad row',
    ),
    onlyInert('data.custom_cls.path', [null], 'rows are read by rlstream’s JSONL/parquet loader'),
    onlyInert('data.custom_cls.name', [null], 'rows are read by rlstream’s JSONL/parquet loader'),
    onlyInert('data.tokenizer', [null], "the tokenizer is the model directory's"),
    onlyInert('data.return_multi_modal_inputs', [true], 'images reach the policy'),
    onlyInert('data.sampler.class_path', [null], 'rows are drawn in order or shuffled by data.seed'),
    onlyInert('data.datagen.path', [null], 'rows come from data files or data.task'),
    onlyInert(`${ARA}.model.external_lib`, [null], 'models are read from their directory'),
    onlyInert(`${ARA}.model.override_config`, [{}], "the architecture is the model directory's config.json"),
    {
      from: `${ARA}.model.lora_rank`,
      to: ['actor.model.lora'],
      note: '0 = full fine-tuning; > 0 = actor.model.lora with lora_alpha and target_modules',
      map: (v, ctx) => {
        if (v === 0 || v === null) return [['actor.model.lora', null]];
        if (positiveInt(v) === null) return `expected an integer ≥ 0, got ${JSON.stringify(v)}`;
        const t = ctx.get(`${ARA}.model.target_modules`) ?? 'all-linear';
        return [['actor.model.lora', { rank: v, alpha: ctx.get(`${ARA}.model.lora_alpha`) ?? 16, target_modules: t }]];
      },
    },
    { from: `${ARA}.model.lora_alpha`, to: [], note: 'read with lora_rank' },
    { from: `${ARA}.model.target_modules`, to: [], note: 'read with lora_rank' },
    onlyInert(`${ARA}.model.exclude_modules`, [null], 'rlstream adapts the chosen decoder linear layers'),
    timesN(`${ARA}.actor.ppo_mini_batch_size`, 'actor.global_batch_size', N),
    rename(`${ARA}.actor.ppo_micro_batch_size_per_gpu`, 'actor.micro_batch_size_per_device_for_update'),
    {
      from: `${ARA}.actor.ppo_micro_batch_size`,
      to: ['actor.micro_batch_size_per_device_for_update'],
      note: 'one device: the global micro-batch is the per-device one; null → unset',
      map: (v) => (v === null ? [] : [['actor.micro_batch_size_per_device_for_update', v]]),
    },
    rename(`${ARA}.actor.grad_clip`, 'actor.optim.max_grad_norm'),
    {
      from: `${ARA}.actor.clip_ratio`,
      to: ['actor.clip_ratio_low', 'actor.clip_ratio_high'],
      note: 'both bounds, unless clip_ratio_low / clip_ratio_high are set',
      map: (v, ctx) => [
        ['actor.clip_ratio_low', ctx.get(`${ARA}.actor.clip_ratio_low`) ?? v],
        ['actor.clip_ratio_high', ctx.get(`${ARA}.actor.clip_ratio_high`) ?? v],
      ],
    },
    {
      from: `${ARA}.actor.clip_ratio_low`,
      to: ['actor.clip_ratio_low'],
      note: 'null → clip_ratio',
      map: (v) => (v === null ? [] : [['actor.clip_ratio_low', v]]),
    },
    {
      from: `${ARA}.actor.clip_ratio_high`,
      to: ['actor.clip_ratio_high'],
      note: 'null → clip_ratio',
      map: (v) => (v === null ? [] : [['actor.clip_ratio_high', v]]),
    },
    rename(`${ARA}.actor.clip_ratio_c`, 'actor.clip_ratio_dual'),
    rename(`${ARA}.actor.use_kl_loss`, 'algorithm.use_kl_loss'),
    {
      from: `${ARA}.actor.kl_loss_coef`,
      to: ['algorithm.kl_coef'],
      note: 'when use_kl_loss (rlstream has one KL coefficient for the loss and the in-reward penalty)',
      map: (v, ctx) => (ctx.get(KL_LOSS) === true ? [['algorithm.kl_coef', v]] : []),
    },
    valueMap(`${ARA}.actor.kl_loss_type`, 'algorithm.kl_loss_type', KL_NAMES),
    onlyInert(`${ARA}.actor.shuffle`, [false], 'mini-batches are taken in order'),
    valueMap(`${ARA}.actor.policy_loss.loss_mode`, 'algorithm.policy_loss', {
      vanilla: 'vanilla',
      gspo: 'gspo',
      sapo: 'sapo',
      gpg: 'gpg',
      cispo: 'cispo',
      geo_mean: 'geo_mean',
      clip_cov: 'clip_cov',
      kl_cov: 'kl_cov',
    }),
    rename(`${ARA}.actor.policy_loss.clip_cov_ratio`, 'algorithm.clip_cov.ratio'),
    rename(`${ARA}.actor.policy_loss.clip_cov_lb`, 'algorithm.clip_cov.lb'),
    rename(`${ARA}.actor.policy_loss.clip_cov_ub`, 'algorithm.clip_cov.ub'),
    rename(`${ARA}.actor.policy_loss.kl_cov_ratio`, 'algorithm.kl_cov.ratio'),
    rename(`${ARA}.actor.policy_loss.ppo_kl_coef`, 'algorithm.kl_cov.ppo_kl_coef'),
    ...optimRules(`${ARA}.actor.optim`, 'actor.optim'),
    rename(`${ARA}.rollout.log_prob_micro_batch_size_per_gpu`, 'actor.micro_batch_size_per_device_for_experience'),
    rename(`${ARA}.ref.log_prob_micro_batch_size_per_gpu`, 'actor.micro_batch_size_per_device_for_experience'),
    {
      from: `${ARA}.rollout.do_sample`,
      to: [],
      note: 'true accepted; false (greedy training rollouts) is refused: group estimators need distinct samples',
      map: (v) => (v === true ? [] : 'greedy training rollouts are not supported; set do_sample=true'),
    },
    {
      from: `${ARA}.rollout.top_k`,
      to: ['rollout.top_k'],
      note: '0 or -1 → -1 (off)',
      map: (v) => [['rollout.top_k', v === 0 ? -1 : v]],
    },
    rename(`${ARA}.rollout.response_length`, 'data.max_response_length'),
    rename(`${ARA}.rollout.prompt_length`, 'data.max_prompt_length'),
    onlyInert(`${ARA}.rollout.ignore_eos`, [false], 'responses always end at the end-of-sequence token here'),
    onlyInert(`${ARA}.rollout.multi_turn.enable`, [false], 'rollouts are single-turn'),
    {
      from: `${ARA}.rollout.val_kwargs`,
      to: [
        'rollout.val_override.temperature',
        'rollout.val_override.top_p',
        'rollout.val_override.top_k',
        'rollout.val_override.n',
      ],
      note: 'temperature, top_p, top_k, n; do_sample false → temperature 0 (greedy), as verl',
      map: (v) => {
        const o = (v ?? {}) as Record<string, unknown>;
        const extra = Object.keys(o).filter((k) => !['temperature', 'top_p', 'top_k', 'n', 'do_sample'].includes(k));
        if (extra.length > 0) return `${extra.join(', ')} cannot be set for validation here`;
        const greedy = o.do_sample === false;
        return [
          ['rollout.val_override.temperature', greedy ? 0 : (o.temperature ?? 0)],
          ['rollout.val_override.top_p', o.top_p ?? 1.0],
          ['rollout.val_override.top_k', o.top_k === 0 || o.top_k === undefined ? -1 : o.top_k],
          ['rollout.val_override.n', o.n ?? 1],
        ];
      },
    },
    {
      from: 'critic.ppo_mini_batch_size',
      to: [],
      note: "the critic trains on the actor's mini-batches: accepted when equal to actor.ppo_mini_batch_size",
      map: (v, ctx) =>
        v === ctx.get(`${ARA}.actor.ppo_mini_batch_size`)
          ? []
          : `${JSON.stringify(v)} differs from ${ARA}.actor.ppo_mini_batch_size; rlstream's critic updates on the actor's mini-batches`,
    },
    rename('critic.grad_clip', 'critic.optim.max_grad_norm'),
    onlyInert('critic.shuffle', [false], 'mini-batches are taken in order'),
    {
      from: 'critic.loss_agg_mode',
      to: [],
      note: "accepted when equal to the actor's loss_agg_mode",
      map: (v, ctx) =>
        v === (ctx.get(`${ARA}.actor.loss_agg_mode`) ?? 'token-mean')
          ? []
          : "the value loss is aggregated with the actor's loss_agg_mode here",
    },
    onlyInert('critic.model.tokenizer_path', [null], "the critic shares the actor's tokenizer"),
    onlyInert('critic.model.override_config', [{}], "the architecture is the model directory's config.json"),
    onlyInert('critic.model.external_lib', [null], 'models are read from their directory'),
    ...optimRules('critic.optim', 'critic.optim'),
    {
      from: 'reward_model.enable',
      to: [],
      note: 'false accepted; a Hugging Face reward model is refused (reward.type=model runs an ONNX scorer)',
      map: (v) =>
        v === true
          ? 'a Hugging Face reward model cannot run here; export a scorer to ONNX and set reward.type=model with reward.model.path'
          : [],
    },
    onlyInert(
      'reward_model.reward_manager',
      ['naive', 'prime', 'batch'],
      'rlstream calls compute_score once per response',
    ),
    {
      from: 'custom_reward_function.path',
      to: ['reward.reward_fn_path', 'reward.reward_fn_name', 'reward.reward_fn_form'],
      note: 'a .py file runs in Python as verl calls it: compute_score(data_source, solution_str, ground_truth, extra_info); a JS module as rlstream calls one',
      map: (v, ctx) => {
        if (v === null || v === undefined) return [];
        if (typeof v !== 'string') return `expected a file path, got ${JSON.stringify(v)}`;
        const name = ctx.get('custom_reward_function.name');
        return rewardFunctionAssignments(v, typeof name === 'string' ? name : null, 'verl', 'compute_score');
      },
    },
    { from: 'custom_reward_function.name', to: [], note: 'read with custom_reward_function.path' },
    rename('custom_reward_function.reward_kwargs', 'reward.reward_fn_kwargs'),
    valueMap('algorithm.kl_penalty', 'algorithm.kl_penalty', KL_NAMES),
    rename('algorithm.kl_ctrl.type', 'algorithm.kl_type'),
    {
      from: 'algorithm.kl_ctrl.kl_coef',
      to: ['algorithm.kl_coef'],
      note: 'when use_kl_in_reward; with the KL loss as well both coefficients must be equal (rlstream has one)',
      map: (v, ctx) => {
        if (ctx.get(KL_REWARD) !== true) return [];
        const lossCoef = ctx.get(`${ARA}.actor.kl_loss_coef`);
        if (ctx.get(KL_LOSS) === true && lossCoef !== v)
          return `${JSON.stringify(v)} differs from ${ARA}.actor.kl_loss_coef = ${JSON.stringify(lossCoef)}, and rlstream has one KL coefficient for the loss and the in-reward penalty; make them equal or turn one off`;
        return [['algorithm.kl_coef', v]];
      },
    },
    rename('algorithm.kl_ctrl.horizon', 'algorithm.kl_horizon'),
    rename('algorithm.kl_ctrl.target_kl', 'algorithm.kl_target'),
    onlyInert('algorithm.use_pf_ppo', [false], 'preference-feedback PPO reweighting is not implemented'),
    {
      from: 'algorithm.filter_groups.enable',
      to: ['algorithm.online_filtering', 'algorithm.filter_semantics'],
      note: 'DAPO dynamic sampling: online_filtering with filter_semantics dapo',
      map: (v) =>
        v === true
          ? [
              ['algorithm.online_filtering', true],
              ['algorithm.filter_semantics', 'dapo'],
            ]
          : [['algorithm.online_filtering', false]],
    },
    valueMap('algorithm.filter_groups.metric', 'algorithm.filter_key', {
      acc: 'accuracy',
      score: 'overall',
      seq_reward: 'overall',
      seq_final_reward: 'overall',
    }),
    {
      from: 'algorithm.filter_groups.max_num_gen_batches',
      to: ['algorithm.max_try_make_batch'],
      note: '0 (no limit) is refused',
      map: (v) =>
        positiveInt(v) !== null
          ? [['algorithm.max_try_make_batch', v]]
          : `${JSON.stringify(v)}: rlstream needs a limit (an integer ≥ 1)`,
    },
    rename('trainer.total_training_steps', 'trainer.max_steps'),
    loggerRule('trainer.logger'),
    rename('trainer.log_val_generations', 'trainer.val_generations_to_log'),
    rename('trainer.test_freq', 'trainer.val_freq'),
    valueMap(
      'trainer.resume_mode',
      'trainer.find_last_checkpoint',
      { auto: true, disable: false, resume_path: false },
      'auto → find_last_checkpoint true; disable / resume_path → false (resume_path: resume_from_path is load_checkpoint_path)',
    ),
    rename('trainer.resume_from_path', 'trainer.load_checkpoint_path'),
    rename('trainer.default_local_dir', 'trainer.run_dir'),
    {
      from: 'trainer.max_actor_ckpt_to_keep',
      to: ['trainer.save_limit'],
      note: 'null → -1 (keep all)',
      map: (v) => [['trainer.save_limit', v ?? -1]],
    },
    onlyInert('trainer.critic_warmup', [0], 'the actor updates from the first step'),
  ],
  notApplicable: [
    'hydra.*',
    'defaults',
    'ray_init.*',
    'global_profiler.*',
    'data.return_raw_input_ids',
    'data.return_raw_chat',
    'data.return_full_prompt',
    'data.filter_overlong_prompts_workers',
    'data.dataloader_num_workers',
    'data.use_shm',
    'data.trust_remote_code',
    'data.custom_cls.*',
    'data.sampler.*',
    'data.datagen.*',
    `${ARA}.hybrid_engine`,
    `${ARA}.nccl_timeout`,
    `${ARA}.model.enable_activation_offload`,
    `${ARA}.model.use_remove_padding`,
    `${ARA}.model.use_liger`,
    `${ARA}.model.use_fused_kernels`,
    `${ARA}.model.fused_kernel_options.*`,
    `${ARA}.model.use_shm`,
    `${ARA}.model.trust_remote_code`,
    `${ARA}.model.return_last_hidden_state`,
    `${ARA}.model.use_fused_loss`,
    `${ARA}.actor.strategy`,
    `${ARA}.actor.use_dynamic_bsz`,
    `${ARA}.actor.ppo_max_token_len_per_gpu`,
    `${ARA}.actor.use_torch_compile`,
    `${ARA}.actor.ulysses_sequence_parallel_size`,
    `${ARA}.actor.checkpoint.*`,
    `${ARA}.actor.fsdp_config.*`,
    `${ARA}.actor.optim.total_training_steps`,
    `${ARA}.actor.optim.weight_decay_incr_ratio`,
    `${ARA}.actor.entropy_from_logits_with_chunking`,
    `${ARA}.actor.entropy_checkpointing`,
    `${ARA}.actor.profiler.*`,
    `${ARA}.ref.*`,
    `${ARA}.rollout.name`,
    `${ARA}.rollout.mode`,
    `${ARA}.rollout.chat_scheduler`,
    `${ARA}.rollout.use_fire_sampling`,
    `${ARA}.rollout.dtype`,
    `${ARA}.rollout.gpu_memory_utilization`,
    `${ARA}.rollout.enforce_eager`,
    `${ARA}.rollout.free_cache_engine`,
    `${ARA}.rollout.load_format`,
    `${ARA}.rollout.tensor_model_parallel_size`,
    `${ARA}.rollout.max_num_batched_tokens`,
    `${ARA}.rollout.max_model_len`,
    `${ARA}.rollout.max_num_seqs`,
    `${ARA}.rollout.log_prob_micro_batch_size`,
    `${ARA}.rollout.log_prob_use_dynamic_bsz`,
    `${ARA}.rollout.log_prob_max_token_len_per_gpu`,
    `${ARA}.rollout.disable_log_stats`,
    `${ARA}.rollout.enable_chunked_prefill`,
    `${ARA}.rollout.calculate_log_probs`,
    `${ARA}.rollout.engine_kwargs.*`,
    `${ARA}.rollout.multi_turn.*`,
    `${ARA}.rollout.agent.*`,
    `${ARA}.rollout.layered_summon`,
    `${ARA}.rollout.trace.*`,
    `${ARA}.rollout.profiler.*`,
    'critic.rollout_n',
    'critic.strategy',
    'critic.ppo_micro_batch_size',
    'critic.ppo_micro_batch_size_per_gpu',
    'critic.forward_micro_batch_size',
    'critic.forward_micro_batch_size_per_gpu',
    'critic.use_dynamic_bsz',
    'critic.ppo_max_token_len_per_gpu',
    'critic.forward_max_token_len_per_gpu',
    'critic.ulysses_sequence_parallel_size',
    'critic.checkpoint.*',
    'critic.profiler.*',
    'critic.optim.total_training_steps',
    'critic.model.use_remove_padding',
    'critic.model.fsdp_config.*',
    'critic.model.trust_remote_code',
    'critic.model.use_shm',
    'reward_model.strategy',
    'reward_model.model.*',
    'reward_model.micro_batch_size',
    'reward_model.micro_batch_size_per_gpu',
    'reward_model.max_length',
    'reward_model.ulysses_sequence_parallel_size',
    'reward_model.use_dynamic_bsz',
    'reward_model.forward_max_token_len_per_gpu',
    'reward_model.launch_reward_fn_async',
    'reward_model.sandbox_fusion.*',
    'reward_model.profiler.*',
    'algorithm.pf_ppo.*',
    'trainer.balance_batch',
    'trainer.profile_steps',
    'trainer.rollout_data_dir',
    'trainer.validation_data_dir',
    'trainer.nnodes',
    'trainer.n_gpus_per_node',
    'trainer.esi_redundant_time',
    'trainer.default_hdfs_dir',
    'trainer.del_local_ckpt_after_load',
    'trainer.max_critic_ckpt_to_keep',
    'trainer.ray_wait_register_center_timeout',
    'trainer.device',
    'trainer.use_legacy_worker_impl',
    'trainer.controller_nsight_options.*',
    'trainer.worker_nsight_options.*',
    'trainer.npu_profile.*',
  ],
  defaults: {
    [N]: 1,
    'data.train_batch_size': 1024,
    [`${ARA}.actor.ppo_mini_batch_size`]: 256,
    [`${ARA}.actor.clip_ratio`]: 0.2,
    [`${ARA}.actor.use_kl_loss`]: false,
    [`${ARA}.actor.kl_loss_coef`]: 0.001,
    [`${ARA}.actor.kl_loss_type`]: 'low_var_kl',
    [`${ARA}.rollout.val_kwargs.temperature`]: 0,
    [`${ARA}.rollout.val_kwargs.top_p`]: 1.0,
    [`${ARA}.rollout.val_kwargs.top_k`]: -1,
    [`${ARA}.rollout.val_kwargs.n`]: 1,
    [`${ARA}.rollout.val_kwargs.do_sample`]: false,
    'algorithm.adv_estimator': 'gae',
    'algorithm.use_kl_in_reward': false,
    'algorithm.kl_penalty': 'kl',
    'algorithm.kl_ctrl.kl_coef': 0.001,
    'trainer.total_epochs': 30,
    'trainer.log_val_generations': 0,
  },
};
