/**
 * MTRL configs (the EasyR1 fork with token perception RL): `dataset`, `training`, `optimization`,
 * `worker`. The worker section is EasyR1's (global_batch_size counts prompts, × rollout.n); KL
 * keys are named divergence_*; VPPO's switches are optimization.enable_perception_filtering,
 * enable_entropy_filtering and enable_trajectory_reweighting.
 */
import { klRules, maxTryRule, rewardFunctionAssignments, workerNotApplicable, workerRules } from './easyr1.ts';
import { KL_NAMES, loggerRule, onlyInert, positiveInt, rename, valueMap, type Dialect, type Rule } from './dialect.ts';

const M = 'worker.actor.model';
const O = 'optimization';

/** MTRL's LoRA keys: peft_type (lora | qlora | null), lora_rank, lora_alpha, lora_dropout, lora_target_modules. */
const loraRules: Rule[] = [
  {
    from: `${M}.peft_type`,
    to: ['actor.model.lora'],
    note: 'null → full fine-tuning; lora → actor.model.lora from lora_rank, lora_alpha, lora_target_modules; qlora is refused',
    map: (v, ctx) => {
      if (v === null || v === 'none') return [['actor.model.lora', null]];
      if (v === 'qlora')
        return 'QLoRA (4-bit base weights) is not supported: the base weights stay in float32 here; use peft_type: lora';
      if (v !== 'lora') return `${JSON.stringify(v)} is not supported; accepted: lora, null`;
      const rank = ctx.get(`${M}.lora_rank`) ?? 8;
      if (positiveInt(rank) === null) return `${M}.lora_rank must be an integer ≥ 1, got ${JSON.stringify(rank)}`;
      const t = ctx.get(`${M}.lora_target_modules`) ?? 'all-linear';
      return [['actor.model.lora', { rank, alpha: ctx.get(`${M}.lora_alpha`) ?? 16, target_modules: t }]];
    },
  },
  { from: `${M}.lora_rank`, to: [], note: 'read with peft_type' },
  { from: `${M}.lora_alpha`, to: [], note: 'read with peft_type' },
  { from: `${M}.lora_target_modules`, to: [], note: 'read with peft_type' },
  {
    from: `${M}.lora_dropout`,
    to: [],
    note: '0 accepted; > 0 refused (dropout on the adapter input is not implemented)',
    map: (v) =>
      v === 0 || v === null
        ? []
        : `${JSON.stringify(v)}: LoRA dropout is not implemented here, and it changes the result; set it to 0`,
  },
];

export const mtrl: Dialect = {
  name: 'mtrl',
  title: 'MTRL',
  marks: ['dataset', 'training', 'optimization'],
  about:
    'MTRL (EasyR1 fork with token perception RL / VPPO): dataset, training, optimization (divergence_*, enable_perception_filtering, …), worker.',
  prefixes: [
    ['dataset.', 'data.'],
    ['training.', 'trainer.'],
    [`${O}.`, 'algorithm.'],
    ['worker.actor.', 'actor.'],
    ['worker.rollout.', 'rollout.'],
    ['worker.critic.', 'critic.'],
    ['worker.reward.', 'reward.'],
  ],
  rules: [
    onlyInert('dataset.mini_rollout_batch_size', [null], 'prompts are generated a whole rollout batch at a time'),
    onlyInert('dataset.override_chat_template', [null], "the chat template is the model directory's"),
    rename(`${O}.advantage_estimator`, 'algorithm.adv_estimator'),
    ...klRules(O, { disable: 'disable_divergence', useLoss: 'use_divergence_loss' }),
    valueMap(`${O}.divergence_penalty`, 'algorithm.kl_penalty', KL_NAMES),
    rename(`${O}.divergence_coef`, 'algorithm.kl_coef'),
    rename(`${O}.divergence_type`, 'algorithm.kl_type'),
    rename(`${O}.divergence_target`, 'algorithm.kl_target'),
    rename(`${O}.divergence_horizon`, 'algorithm.kl_horizon'),
    rename(`${O}.enable_perception_filtering`, 'algorithm.vppo.enable'),
    rename(`${O}.top_p_perception_tokens`, 'algorithm.vppo.top_p_perception_tokens'),
    rename(`${O}.enable_entropy_filtering`, 'algorithm.vppo.enable_entropy_filtering'),
    rename(`${O}.top_p_entropy_tokens`, 'algorithm.vppo.top_p_entropy_tokens'),
    {
      from: `${O}.enable_trajectory_reweighting`,
      to: ['algorithm.vppo.advantage_scaling_min'],
      note: 'true → advantage_scaling_min = trajectory_scaling_min; false → 1 (every trajectory keeps its advantage); needs enable_perception_filtering',
      map: (v, ctx) => {
        const perception = ctx.get(`${O}.enable_perception_filtering`) === true;
        if (v === true && !perception)
          return 'trajectory reweighting needs the visual dependencies of perception filtering here; set enable_perception_filtering: true, or enable_trajectory_reweighting: false';
        if (!perception) return [];
        return [
          ['algorithm.vppo.advantage_scaling_min', v === true ? (ctx.get(`${O}.trajectory_scaling_min`) ?? 0.8) : 1],
        ];
      },
    },
    { from: `${O}.trajectory_scaling_min`, to: [], note: 'read with enable_trajectory_reweighting' },
    {
      from: `${O}.use_entropy_penalty`,
      to: ['algorithm.entropy_penalty_coef'],
      note: 'true → entropy_penalty_coef; false → 0',
      map: (v, ctx) => [
        ['algorithm.entropy_penalty_coef', v === true ? (ctx.get(`${O}.entropy_penalty_coef`) ?? 0) : 0],
      ],
    },
    { from: `${O}.entropy_penalty_coef`, to: [], note: 'read with use_entropy_penalty' },
    ...workerRules('worker', loraRules, () => 'mtrl'),
    rename('worker.actor.optim.warmup_steps', 'actor.optim.lr_warmup_steps'),
    rename('worker.critic.optim.warmup_steps', 'critic.optim.lr_warmup_steps'),
    {
      from: 'worker.reward.reward_fn_path',
      to: ['reward.reward_fn_path', 'reward.reward_fn_name', 'reward.reward_fn_form'],
      note: 'a .py file runs in Python as MTRL calls it: reward_function(data_dict) → (reward, metrics)',
      map: (v, ctx) => {
        if (v === null || v === undefined) return [];
        if (typeof v !== 'string') return `expected a file path, got ${JSON.stringify(v)}`;
        const name = ctx.get('worker.reward.reward_fn_name');
        return rewardFunctionAssignments(v, typeof name === 'string' ? name : null, 'mtrl', 'reward_function');
      },
    },
    { from: 'worker.reward.reward_fn_name', to: [], note: 'read with reward_fn_path' },
    loggerRule('training.logger'),
    rename('training.save_checkpoint_path', 'trainer.run_dir'),
    maxTryRule('training.max_try_make_batch'),
    onlyInert('training.critic_warmup', [0], 'the actor updates from the first step'),
  ],
  notApplicable: [
    ...workerNotApplicable('worker'),
    'dataset.filter_overlong_prompts_workers',
    'dataset.video_fps',
    'training.nnodes',
    'training.n_gpus_per_node',
    'training.save_model_only',
    'training.ray_timeline',
  ],
  defaults: {
    'worker.rollout.n': 1,
    'worker.actor.global_batch_size': 256,
    [`${O}.use_divergence_loss`]: false,
    [`${O}.divergence_penalty`]: 'kl',
    [`${O}.divergence_coef`]: 1e-3,
    [`${O}.enable_trajectory_reweighting`]: false,
    'worker.rollout.val_override_config': {},
    'training.total_epochs': 15,
    'training.val_generations_to_log': 0,
  },
};
