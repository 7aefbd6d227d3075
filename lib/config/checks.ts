/**
 * After the schema: derived defaults (`null` → a value computed from other keys) and the checks
 * that involve several keys. Every error says which key to change and to what.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { GROUP_ADV_ESTIMATORS, schemaDefaults, type Config } from './schema.ts';
import { closest } from './suggest.ts';
import { rewardFns } from '../reward-fns/index.ts';
import { tasks } from '../tasks/index.ts';
import { redactSecrets, redactString } from './redact.ts';
import { loraConfig } from '../model/lora.ts';
import { ditLoraConfig } from '../image/lora.ts';
import { policyKindOf } from '../model/policy-kinds.ts';
import { IMAGE_RL_LOSSES } from '../image/flow-graph.ts';
import { DIT_MODEL_TYPE, isDitDir } from '../image/checkpoint.ts';

// ---------------------------------------------------------------------------------------------
// Derived values

/**
 * Whether the actor is a vision-language model: its config has a vision tower — a fresh policy
 * with `actor.model.vision.enable`, or a model directory whose config.json has `vision_config`
 * (Qwen2-VL's layout). A directory that cannot be read counts as text-only (loading it reports why).
 */
export function actorHasVisionTower(model: Config['actor']['model']): boolean {
  if (model.path === null) return model.vision.enable;
  try {
    const j: unknown = JSON.parse(readFileSync(join(model.path, 'config.json'), 'utf8'));
    const vc = j && typeof j === 'object' ? (j as Record<string, unknown>).vision_config : undefined;
    return !!vc && typeof vc === 'object' && !Array.isArray(vc);
  } catch {
    return false;
  }
}

/**
 * The run id: `pipeline.run_id` when set, else `<project_name>-<experiment_name>-<hash8>` where
 * hash8 is the first 8 hex digits of SHA-256 over both names — deterministic, never random, and
 * distinct for distinct name pairs even when the dashes would make them read alike.
 */
export function resolveRunId(cfg: Pick<Config, 'trainer' | 'pipeline'>): string {
  if (cfg.pipeline.run_id) return cfg.pipeline.run_id;
  const { project_name: p, experiment_name: e } = cfg.trainer;
  const h = createHash('sha256')
    .update(JSON.stringify([p, e]))
    .digest('hex')
    .slice(0, 8);
  return `${p}-${e}-${h}`;
}

/** The run directory: `trainer.run_dir` or `runs/<experiment_name>`. */
export function resolveRunDir(cfg: Pick<Config, 'trainer'>): string {
  return cfg.trainer.run_dir ?? `runs/${cfg.trainer.experiment_name}`;
}

export type CriticModel = Omit<Config['actor']['model'], 'path'> & { path: string | null };

/** The critic's model: actor.model with the critic's non-null overrides applied. */
export function resolveCriticModel(cfg: Pick<Config, 'actor' | 'critic'>): CriticModel {
  const a = cfg.actor.model,
    o = cfg.critic.model;
  return {
    ...a,
    path: o.path,
    d_model: o.d_model ?? a.d_model,
    n_layers: o.n_layers ?? a.n_layers,
    n_heads: o.n_heads ?? a.n_heads,
    n_kv_heads: o.n_kv_heads ?? a.n_kv_heads,
    ffn: o.ffn ?? a.ffn,
    max_seq_len: o.max_seq_len ?? a.max_seq_len,
    init_seed: o.init_seed ?? a.init_seed + 1,
    // A value model has a scalar head, not an LM head to tie to the embedding.
    tie_embeddings: false,
  };
}

/** Whether rewards come from a function (type function, or remote servers switched off). */
export function usesRewardFunction(cfg: Pick<Config, 'reward'>): boolean {
  return cfg.reward.type === 'function' || (cfg.reward.type === 'remote' && cfg.reward.remote.enabled === false);
}

/**
 * Fills the keys whose default is derived from other keys (each described as "null → …" in the
 * schema). Keys set explicitly are kept. Returns a new object.
 */
export function resolveDerived(input: Config): Config {
  const cfg = structuredClone(input);
  cfg.algorithm.kl_loss_type ??= cfg.algorithm.kl_penalty;
  cfg.algorithm.overlong.max_length ??= cfg.data.max_response_length;
  cfg.critic.enable ??= cfg.algorithm.adv_estimator === 'gae';
  cfg.actor.model.kind ??= policyKindOf(cfg.actor.model);
  cfg.critic.ppo_epochs ??= cfg.actor.ppo_epochs;
  cfg.rollout.val_override.top_k ??= cfg.rollout.top_k;
  cfg.reward.remote.enabled ??= cfg.reward.type === 'remote';
  const task = cfg.data.task;
  if (
    usesRewardFunction(cfg) &&
    cfg.reward.reward_fn === null &&
    cfg.reward.reward_fn_path === null &&
    task !== null &&
    rewardFns.has(task)
  ) {
    cfg.reward.reward_fn = task;
  }
  if (
    cfg.actor.model.tokenizer === 'alphabet' &&
    cfg.actor.model.alphabet === null &&
    task !== null &&
    tasks.has(task)
  ) {
    cfg.actor.model.alphabet = tasks.get(task).alphabet;
  }
  cfg.trainer.run_dir = resolveRunDir(cfg);
  cfg.pipeline.run_id = resolveRunId(cfg);
  return cfg;
}

// ---------------------------------------------------------------------------------------------
// Cross-field checks

/** All divisors of n. */
function divisors(n: number): number[] {
  const out: number[] = [];
  for (let d = 1; d * d <= n; d++) {
    if (n % d === 0) {
      out.push(d);
      if (d !== n / d) out.push(n / d);
    }
  }
  return out.sort((a, b) => a - b);
}

/** Up to k divisors of n closest to `near` (by ratio), ascending. */
export function divisorsNear(n: number, near: number, k = 4): number[] {
  return nearest(divisors(n), near, k);
}

/** Up to k of `values` closest to `near` (by ratio), ascending. */
function nearest(values: number[], near: number, k = 4): number[] {
  const target = Math.max(near, 1);
  return values
    .map((d) => ({ d, dist: Math.abs(Math.log(d / target)) }))
    .sort((a, b) => a.dist - b.dist || a.d - b.d)
    .slice(0, k)
    .map((x) => x.d)
    .sort((a, b) => a - b);
}

/** "8, 10, 20 or 40" */
export function orList(items: ReadonlyArray<string | number>): string {
  const s = items.map(String);
  return s.length <= 1 ? (s[0] ?? '') : `${s.slice(0, -1).join(', ')} or ${s[s.length - 1]}`;
}

export interface CheckResult {
  errors: string[];
  warnings: string[];
}

/**
 * Checks that involve several keys, on a config whose derived values are filled. `command` says
 * which command reads it: `rlstream sft` uses only the data files, actor, sft, trainer and
 * pipeline keys (checkSftConfig), so the RL checks (reward, rollout batch arithmetic) do not apply.
 */
export function checkConfig(cfg: Config, env: NodeJS.ProcessEnv = {}, command: 'train' | 'sft' = 'train'): CheckResult {
  if (command === 'sft') return checkSftConfig(cfg);
  const errors: string[] = [];
  const warnings: string[] = [];
  const { data, algorithm: alg, rollout, actor, critic, reward, trainer, pipeline } = cfg;

  // --- an image policy: its losses, estimator and sampler; a language policy refuses the image losses
  errors.push(...imagePolicyErrors(cfg));

  // --- rollout through inference engines
  if (rollout.engine === 'openai') {
    if (!rollout.openai.urls.length)
      errors.push(
        "rollout.engine = openai needs rollout.openai.urls: the engines' base URLs, e.g. [http://127.0.0.1:8000]",
      );
    if (actor.model.lora)
      errors.push(
        'rollout.engine = openai with actor.model.lora is not supported (policy versions are adapters the engine would have to merge); use rollout.engine = onnx',
      );
    if (actorHasVisionTower(actor.model))
      errors.push(
        'rollout.engine = openai does not send images; use rollout.engine = onnx for a vision-language policy',
      );
    if (rollout.openai.api_key_env && !env[rollout.openai.api_key_env])
      errors.push(
        `rollout.openai.api_key_env names ${rollout.openai.api_key_env}, which is not set in the environment`,
      );
  }

  // --- LoRA: rank, dropout and target modules in one line each, naming the key (an image policy's: imagePolicyErrors)
  if (actor.model.lora && policyKindOf(actor.model) !== 'image') {
    const l = actor.model.lora;
    try {
      loraConfig(
        {
          rank: l.rank,
          alpha: l.alpha,
          dropout: l.dropout,
          targetModules: l.target_modules,
          visionTargetModules: l.vision_target_modules,
        },
        'actor.model.lora',
      );
    } catch (e) {
      errors.push((e as Error).message);
    }
    if (!actor.model.path)
      errors.push(
        'actor.model.lora needs actor.model.path: the base model directory the adapters are trained on (LoRA on a randomly initialised model has nothing to adapt)',
      );
    if (cfg.policy.dtype !== 'f32')
      errors.push(
        `actor.model.lora with policy.dtype = ${cfg.policy.dtype} is not supported (a LoRA policy's versions are its adapters, stored in f32); set policy.dtype = f32`,
      );
    if (alg.ema.enable)
      errors.push(
        'actor.model.lora with algorithm.ema.enable = true is not supported (the EMA averages full weights); turn one of them off',
      );
    if (trainer.load_checkpoint_path && !trainer.val_only)
      errors.push(
        'actor.model.lora with trainer.load_checkpoint_path is not supported yet; resume the LoRA run itself (trainer.find_last_checkpoint=true), or export --merge its checkpoint and give that as actor.model.path',
      );
  }

  // --- data sources
  const taskNames = tasks.names();
  if (data.task !== null && !tasks.has(data.task)) {
    const hint = closest(data.task, taskNames);
    errors.push(
      `data.task = "${data.task}" is not a built-in task (valid: ${taskNames.join(', ')})${hint ? ` — did you mean "${hint}"?` : ''}`,
    );
  }
  if (data.task !== null && (data.train_files.length > 0 || data.val_files.length > 0)) {
    const which = [
      data.train_files.length > 0 ? 'data.train_files' : '',
      data.val_files.length > 0 ? 'data.val_files' : '',
    ]
      .filter(Boolean)
      .join(' and ');
    errors.push(
      `data.task = "${data.task}" generates its own rows, but ${which} ${which.includes(' and ') ? 'are' : 'is'} also set; remove ${which} or unset data.task`,
    );
  }
  if (!trainer.val_only && data.task === null && data.train_files.length === 0) {
    errors.push(
      `no training data: set data.train_files (JSONL or parquet files) or data.task (a built-in generator: ${taskNames.join(', ')})`,
    );
  }
  if (data.min_pixels > data.max_pixels)
    errors.push(
      `data.min_pixels = ${data.min_pixels} is over data.max_pixels = ${data.max_pixels}; images are resized to a pixel count between them`,
    );
  const vis = actor.model.vision;
  if (vis.enable && !actor.model.path && data.image_factor !== vis.patch_size * vis.spatial_merge_size)
    errors.push(
      `data.image_factor = ${data.image_factor} must be actor.model.vision.patch_size × spatial_merge_size = ${vis.patch_size} × ${vis.spatial_merge_size} = ${vis.patch_size * vis.spatial_merge_size} (image sides must fill whole merge windows); set data.image_factor=${vis.patch_size * vis.spatial_merge_size}`,
    );
  if (vis.enable && vis.hidden_size % vis.num_heads !== 0)
    errors.push(
      `actor.model.vision.hidden_size = ${vis.hidden_size} must be divisible by actor.model.vision.num_heads = ${vis.num_heads}`,
    );
  else if (vis.enable && (vis.hidden_size / vis.num_heads) % (vis.rope === '2d' ? 4 : 2) !== 0)
    errors.push(
      `actor.model.vision head size ${vis.hidden_size / vis.num_heads} (hidden_size / num_heads) must be a multiple of ${vis.rope === '2d' ? 4 : 2} for ${vis.rope} rotary positions`,
    );
  if (data.max_pixels < data.image_factor * data.image_factor)
    errors.push(
      `data.max_pixels = ${data.max_pixels} is under one ${data.image_factor}×${data.image_factor} patch cell (data.image_factor); raise it`,
    );
  const needVal: string[] = [];
  if (trainer.val_only) needVal.push('trainer.val_only = true');
  if (trainer.val_before_train) needVal.push('trainer.val_before_train = true');
  if (trainer.val_freq > 0) needVal.push(`trainer.val_freq = ${trainer.val_freq}`);
  const hasVal = data.val_files.length > 0 || (data.task !== null && data.task_size.val > 0);
  if (needVal.length > 0 && !hasVal) {
    const fix = data.task !== null ? 'set data.task_size.val to 1 or more' : 'set data.val_files';
    const off = [
      trainer.val_before_train ? 'trainer.val_before_train=false' : '',
      trainer.val_freq > 0 ? 'trainer.val_freq=-1' : '',
      trainer.val_only ? 'trainer.val_only=false' : '',
    ]
      .filter(Boolean)
      .join(' and ');
    errors.push(
      `${needVal.join(' and ')} ${needVal.length > 1 ? 'need' : 'needs'} validation data, but there is none; ${fix}, or turn validation off with ${off}`,
    );
  }

  // --- lengths
  const total = data.max_prompt_length + data.max_response_length;
  if (total > actor.model.max_seq_len) {
    errors.push(
      `data.max_prompt_length + data.max_response_length = ${data.max_prompt_length} + ${data.max_response_length} = ${total} exceeds actor.model.max_seq_len = ${actor.model.max_seq_len}; set actor.model.max_seq_len to at least ${total} or shorten the prompt/response lengths`,
    );
  }

  // --- batch sizes
  const samples = data.rollout_batch_size * rollout.n;
  const samplesText = `data.rollout_batch_size × rollout.n = ${data.rollout_batch_size} × ${rollout.n} = ${samples} samples per step`;
  const gbs = actor.global_batch_size;
  if (gbs > samples) {
    errors.push(
      `actor.global_batch_size = ${gbs} is larger than the ${samplesText}; set actor.global_batch_size to a divisor of ${samples} such as ${orList(divisorsNear(samples, gbs))}`,
    );
  } else if (samples % gbs !== 0) {
    errors.push(
      `${samplesText} is not a multiple of actor.global_batch_size = ${gbs}; set actor.global_batch_size to a divisor of ${samples} such as ${orList(divisorsNear(samples, gbs))}`,
    );
  }
  for (const key of ['micro_batch_size_per_device_for_update', 'micro_batch_size_per_device_for_experience'] as const) {
    const mb = actor[key];
    if (gbs % mb !== 0) {
      errors.push(
        `actor.${key} = ${mb} does not divide actor.global_batch_size = ${gbs}; set actor.${key} to a divisor of ${gbs} such as ${orList(divisorsNear(gbs, mb))}`,
      );
    }
  }

  // --- algorithm
  if (actor.clip_ratio_dual <= 1) {
    errors.push(
      `actor.clip_ratio_dual = ${actor.clip_ratio_dual} must be greater than 1 (the dual-clip bound caps the loss of negative advantages at c·|A|); set actor.clip_ratio_dual to e.g. 3.0`,
    );
  }
  if (alg.adv_estimator === 'gae' && critic.enable === false) {
    errors.push(
      'algorithm.adv_estimator = gae needs a value function, but critic.enable = false; set critic.enable=true (or leave it unset), or pick a critic-free estimator such as grpo',
    );
  }
  if (alg.adv_estimator !== 'gae' && critic.enable === true) {
    warnings.push(
      `critic.enable = true but algorithm.adv_estimator = ${alg.adv_estimator} does not use values; the critic is trained but unused (set critic.enable=false or use gae)`,
    );
  }
  if (GROUP_ADV_ESTIMATORS.has(alg.adv_estimator) && rollout.n < 2) {
    errors.push(
      `algorithm.adv_estimator = ${alg.adv_estimator} compares the rollout.n responses to each prompt, but rollout.n = ${rollout.n} (every advantage would be 0); set rollout.n to 2 or more (e.g. 5), or use an estimator without a group baseline (gae, reinforce_plus_plus, remax)`,
    );
  }
  if (alg.online_filtering && alg.filter_semantics === 'easyr1' && alg.filter_low >= alg.filter_high) {
    errors.push(
      `algorithm.filter_low = ${alg.filter_low} must be below algorithm.filter_high = ${alg.filter_high} (groups with filter_low < mean < filter_high are kept); lower filter_low or raise filter_high`,
    );
  }
  if (alg.overlong.enable) {
    const max = alg.overlong.max_length!;
    if (max > data.max_response_length) {
      errors.push(
        `algorithm.overlong.max_length = ${max} exceeds data.max_response_length = ${data.max_response_length}; set algorithm.overlong.max_length ≤ ${data.max_response_length} (or leave it unset)`,
      );
    }
    if (alg.overlong.buffer_length < 1 || alg.overlong.buffer_length >= max) {
      errors.push(
        `algorithm.overlong.buffer_length = ${alg.overlong.buffer_length} must be between 1 and algorithm.overlong.max_length − 1 = ${max - 1} when algorithm.overlong.enable = true; set it to e.g. ${Math.max(1, Math.floor(max / 4))}`,
      );
    }
  }
  // "full" KL sums over the vocabulary: it needs the reference policy's full distribution at every
  // position, which the pipeline does not carry (stages exchange per-token log-probs)
  const klLossType = alg.kl_loss_type ?? alg.kl_penalty;
  if (alg.use_kl_loss && klLossType === 'full') {
    errors.push(
      `algorithm.kl_loss_type = full (it defaults to algorithm.kl_penalty) cannot be the KL loss: it needs the reference policy's full vocabulary distribution at every position, and the pipeline carries per-token log-probs only (lib/rl klFull computes it where full distributions exist); use low_var_kl (k3), kl (k1), abs or mse (k2)`,
    );
  }
  if (alg.use_kl_in_reward && alg.kl_penalty === 'full') {
    errors.push(
      'algorithm.kl_penalty = full cannot be the in-reward KL penalty: it needs full vocabulary distributions of the policy and the reference, and the pipeline carries per-token log-probs only; use low_var_kl (k3), kl (k1), abs or mse (k2)',
    );
  }
  if (alg.vppo.enable_entropy_filtering && !alg.vppo.enable) {
    errors.push(
      'algorithm.vppo.enable_entropy_filtering = true has no effect without algorithm.vppo.enable: the entropy-token filter is part of VPPO here (the union with its perception tokens), which needs a vision-language actor; set algorithm.vppo.enable=true with one, or enable_entropy_filtering=false',
    );
  }
  if (alg.vppo.enable && data.limit_images === 0) {
    errors.push(
      'algorithm.vppo.enable = true needs prompt images, but data.limit_images = 0 allows none; raise data.limit_images (e.g. 1) or set algorithm.vppo.enable=false',
    );
  }
  if (alg.vppo.enable && data.task !== null && tasks.has(data.task) && !tasks.get(data.task).images) {
    const vision = tasks.names().filter((n) => tasks.get(n).images);
    errors.push(
      `algorithm.vppo.enable = true needs prompt images, and data.task = ${data.task} makes text-only prompts; use a vision task (${vision.join(', ')}) or data files with images (data.image_key), or set algorithm.vppo.enable=false`,
    );
  }
  if (alg.vppo.enable && !actorHasVisionTower(actor.model)) {
    errors.push(
      `algorithm.vppo.enable = true needs a vision-language actor: VPPO compares each response's log-probs under its prompt image and under a perturbed copy, and actor.model has no vision tower (${actor.model.path === null ? 'a freshly initialised actor is text-only' : `${actor.model.path}/config.json has no vision_config`}); set algorithm.vppo.enable=false, or set actor.model.path to a vision-language model directory (config.json with vision_config)`,
    );
  }
  if (alg.use_kl_in_reward && alg.use_kl_loss) {
    warnings.push(
      'algorithm.use_kl_in_reward and algorithm.use_kl_loss are both true: the KL to the reference is penalised twice (verl warns about the same); usually set one of them to false',
    );
  }
  if (alg.kl_type === 'adaptive' && !alg.use_kl_in_reward) {
    warnings.push(
      'algorithm.kl_type = adaptive only adapts the in-reward KL coefficient, but algorithm.use_kl_in_reward = false; set algorithm.use_kl_in_reward=true or kl_type=fixed',
    );
  }

  // --- model architecture
  const archChecks: Array<[string, { d_model: number; n_heads: number; n_kv_heads: number }]> = [
    ['actor.model', actor.model],
  ];
  if (critic.enable) archChecks.push(['critic.model', resolveCriticModel(cfg)]);
  errors.push(...archErrors(archChecks));
  if (critic.enable) {
    const cm = resolveCriticModel(cfg);
    if (total > cm.max_seq_len) {
      errors.push(
        `data.max_prompt_length + data.max_response_length = ${total} exceeds critic.model.max_seq_len = ${cm.max_seq_len}; set critic.model.max_seq_len to at least ${total} (or leave it unset to use actor.model.max_seq_len)`,
      );
    }
  }
  if (actor.model.tokenizer === 'alphabet') {
    const a = actor.model.alphabet;
    if (a === null) {
      errors.push(
        'actor.model.tokenizer = alphabet needs the characters: set actor.model.alphabet (e.g. "0123456789 :") or data.task (its alphabet is used), or use tokenizer=byte',
      );
    } else {
      const dup = [...new Set([...a].filter((ch, i, all) => all.indexOf(ch) !== i))];
      if (dup.length > 0)
        errors.push(
          `actor.model.alphabet repeats ${dup.map((c) => JSON.stringify(c)).join(', ')}; list each character once`,
        );
    }
  }

  // --- multi-turn episodes
  const mt = cfg.rollout.multi_turn;
  if (mt.enable) {
    const tools = mt.tools.length > 0 || mt.tool_config_path !== null;
    if (mt.interaction.type === 'module' && mt.interaction.path === null && !tools)
      errors.push(
        'rollout.multi_turn.interaction.type = module needs rollout.multi_turn.interaction.path (your JS/TS environment module) or tools (rollout.multi_turn.tools, tool_config_path)',
      );
    if (mt.interaction.type === 'http' && mt.interaction.url === null && !tools)
      errors.push(
        'rollout.multi_turn.interaction.type = http needs rollout.multi_turn.interaction.url (the environment server)',
      );
    if (tools && mt.tool_executor.type === 'module' && mt.tool_executor.path === null)
      errors.push(
        'rollout.multi_turn tools need rollout.multi_turn.tool_executor.path (a JS/TS module exporting one function per tool) or tool_executor.type = http with a url',
      );
    if (tools && mt.tool_executor.type === 'http' && mt.tool_executor.url === null)
      errors.push(
        'rollout.multi_turn.tool_executor.type = http needs rollout.multi_turn.tool_executor.url (the tool server)',
      );
    if (cfg.algorithm.adv_estimator === 'remax')
      errors.push(
        'rollout.multi_turn.enable does not combine with algorithm.adv_estimator = remax (its greedy baseline is single-turn); use grpo or rloo',
      );
  }
  // --- reward
  const fnNames = rewardFns.names();
  if (usesRewardFunction(cfg)) {
    const why =
      reward.type === 'function'
        ? 'reward.type = function'
        : 'reward.remote.enabled = false (DISABLE_RL_REWARD_MODEL=true switches the servers off; rewards then come from a function)';
    if (reward.reward_fn !== null && reward.reward_fn_path !== null) {
      errors.push(
        'reward.reward_fn and reward.reward_fn_path are both set; keep one (reward_fn names a built-in, reward_fn_path your module)',
      );
    } else if (
      reward.reward_fn === null &&
      reward.reward_fn_path === null &&
      !cfg.rollout.multi_turn.enable && // multi-turn: the episode's environment rewards are the reward
      !(data.task !== null && !tasks.has(data.task))
    ) {
      // (an unknown data.task is reported above; fixing it also supplies the reward function)
      errors.push(
        `${why} needs a reward function: set reward.reward_fn (built-in: ${fnNames.join(', ')}) or reward.reward_fn_path (your JS/TS or Python module)`,
      );
    } else if (reward.reward_fn !== null && !rewardFns.has(reward.reward_fn)) {
      const hint = closest(reward.reward_fn, fnNames);
      errors.push(
        `unknown reward.reward_fn "${reward.reward_fn}" (valid: ${fnNames.join(', ')}, or set reward.reward_fn_path to your module)${hint ? ` — did you mean "${hint}"?` : ''}`,
      );
    }
  }
  if (
    reward.reward_fn_form !== 'verl' &&
    usesRewardFunction(cfg) &&
    !(reward.reward_fn_path ?? '').toLowerCase().endsWith('.py')
  ) {
    errors.push(
      `reward.reward_fn_form = ${reward.reward_fn_form} applies to a Python reward function (reward.reward_fn_path ending in .py); ${reward.reward_fn_path ? `${reward.reward_fn_path} is a JS/TS module` : 'none is set'} — set reward_fn_form back to verl or point reward_fn_path at your .py file`,
    );
  }
  const remote = reward.remote;
  if (reward.type === 'remote' && remote.enabled) {
    const hasUrls = remote.urls !== null && remote.urls.length > 0;
    if (hasUrls && remote.host !== null) {
      errors.push(
        'reward.remote.urls and reward.remote.host are both set; use either the URL list or host + start_port + count',
      );
    } else if (!hasUrls && remote.host === null) {
      errors.push(
        'reward.type = remote needs server endpoints: set reward.remote.urls=[http://host:port, …] or reward.remote.host (with start_port and count), or switch the servers off with DISABLE_RL_REWARD_MODEL=true',
      );
    }
    for (const u of hasUrls ? remote.urls! : []) {
      let ok = false;
      try {
        ok = ['http:', 'https:'].includes(new URL(u).protocol);
      } catch {
        ok = false;
      }
      if (!ok) errors.push(`reward.remote.urls: "${redactString(u)}" is not an http:// or https:// URL`);
    }
    if (remote.host !== null && remote.start_port + remote.count - 1 > 65535) {
      errors.push(
        `reward.remote.start_port + count − 1 = ${remote.start_port + remote.count - 1} exceeds port 65535; lower reward.remote.start_port or reward.remote.count`,
      );
    }
    if (remote.backoff_initial_ms > remote.backoff_max_ms) {
      errors.push(
        `reward.remote.backoff_initial_ms = ${remote.backoff_initial_ms} exceeds reward.remote.backoff_max_ms = ${remote.backoff_max_ms}; raise backoff_max_ms or lower backoff_initial_ms`,
      );
    }
    if (Object.keys(remote.response_mapping.weights).length === 0) {
      errors.push(
        'reward.remote.response_mapping.weights is empty; map at least one response field to a weight, e.g. {vlm_score: 0.5, ocr_confidence: 0.5}',
      );
    }
    const [lo, hi] = remote.response_mapping.range;
    if (!(lo < hi))
      errors.push(`reward.remote.response_mapping.range = [${lo}, ${hi}] must have low < high; e.g. [0, 1]`);
    if (remote.request_template !== null && Object.keys(remote.request_template).length === 0) {
      errors.push(
        'reward.remote.request_template is empty; map body fields to trajectory fields, or set it to null to use request_preset',
      );
    }
    if (remote.auth_token_env !== null && !env[remote.auth_token_env]) {
      warnings.push(
        `reward.remote.auth_token_env = ${remote.auth_token_env}, but that environment variable is not set in this environment; the reward stage reads the server token from it`,
      );
    }
  }
  if (reward.type === 'model' && reward.model.path === null) {
    errors.push('reward.type = model needs reward.model.path (the ONNX scorer file)');
  }

  // --- pipeline
  if (pipeline.bus === 'kafka') {
    if (pipeline.brokers.length === 0) {
      errors.push(
        'pipeline.bus = kafka needs pipeline.brokers; set pipeline.brokers=[host:9092] (a list of host:port), or use pipeline.bus=embedded',
      );
    }
    for (const b of pipeline.brokers) {
      if (!/^[^\s/:]+:\d{1,5}$/.test(b) && !/^\[[0-9a-fA-F:]+\]:\d{1,5}$/.test(b))
        errors.push(`pipeline.brokers: "${redactString(b)}" is not host:port`);
    }
    if (rollout.replicas > pipeline.partitions) {
      warnings.push(
        `rollout.replicas = ${rollout.replicas} exceeds pipeline.partitions = ${pipeline.partitions}: only ${pipeline.partitions} replica(s) receive prompts; set pipeline.partitions ≥ ${rollout.replicas}`,
      );
    }
    const k = pipeline.kafka;
    if (k.idempotent && k.acks !== 'all' && k.acks !== -1) {
      errors.push(
        `pipeline.kafka.idempotent = true requires pipeline.kafka.acks = all, got ${k.acks}; set pipeline.kafka.acks=all or pipeline.kafka.idempotent=false`,
      );
    }
    if (k.heartbeat_interval_ms >= k.session_timeout_ms) {
      errors.push(
        `pipeline.kafka.heartbeat_interval_ms = ${k.heartbeat_interval_ms} must be below pipeline.kafka.session_timeout_ms = ${k.session_timeout_ms}; set heartbeat_interval_ms to at most ${Math.max(1, Math.floor(k.session_timeout_ms / 3))} (a third of the session timeout)`,
      );
    }
  }
  if (pipeline.store === 'postgres') {
    if (pipeline.database_url === null) {
      errors.push(
        'pipeline.store = postgres needs pipeline.database_url; set it to postgres://user:password@host:5432/db, or use pipeline.store=embedded',
      );
    } else if (!/^postgres(ql)?:\/\//.test(pipeline.database_url)) {
      errors.push(
        `pipeline.database_url = "${redactString(pipeline.database_url)}" is not a postgres:// or postgresql:// URL`,
      );
    }
    if (pipeline.lease_seconds < 2 * pipeline.heartbeat_seconds)
      errors.push(
        `pipeline.lease_seconds = ${pipeline.lease_seconds} must be at least twice pipeline.heartbeat_seconds = ${pipeline.heartbeat_seconds} (one late heartbeat must not make a live run look stale); set lease_seconds to ${2 * pipeline.heartbeat_seconds} or more`,
      );
  }
  if (pipeline.policy_store === 's3') {
    if (pipeline.s3.bucket === null)
      errors.push(
        'pipeline.policy_store = s3 needs pipeline.s3.bucket (an existing bucket; for MinIO or GCS also pipeline.s3.endpoint and force_path_style)',
      );
    if (pipeline.s3.endpoint !== null && !/^https?:\/\/[^/]/.test(pipeline.s3.endpoint))
      errors.push(
        `pipeline.s3.endpoint = "${redactString(pipeline.s3.endpoint)}" is not an http:// or https:// URL (e.g. http://minio:9000)`,
      );
  }
  if (pipeline.schema_wire_format === 'confluent' && pipeline.schema_registry_url === null) {
    errors.push(
      'pipeline.schema_wire_format = confluent needs pipeline.schema_registry_url (e.g. http://localhost:8081), or use schema_wire_format=plain',
    );
  }

  return { errors, warnings };
}

/** What an image policy (actor.model.kind = image) cannot be run with, and the image losses on a language policy. */
function imagePolicyErrors(cfg: Config): string[] {
  const { algorithm: alg, actor, critic, rollout } = cfg;
  const imageLoss = (IMAGE_RL_LOSSES as readonly string[]).includes(alg.policy_loss);
  if (policyKindOf(actor.model) !== 'image')
    return imageLoss
      ? [
          `algorithm.policy_loss = ${alg.policy_loss} trains an image policy, but the policy is a language model (actor.model.path ${actor.model.path ?? 'unset'} is not a model_type ${DIT_MODEL_TYPE} directory); give actor.model.path an image model directory or use a language loss`,
        ]
      : [];
  const errors: string[] = [];
  if (actor.model.path === null || !isDitDir(actor.model.path))
    errors.push(
      `actor.model.kind = image needs actor.model.path: a model directory whose config.json has model_type ${DIT_MODEL_TYPE} (an SFT'd DiT, e.g. examples/glyphs/run.ts --out DIR writes DIR/model)`,
    );
  if (!imageLoss)
    errors.push(
      `algorithm.policy_loss = ${alg.policy_loss} is a language loss; an image policy trains with ${orList([...IMAGE_RL_LOSSES])}`,
    );
  if (alg.policy_loss === 'flow_grpo' && alg.image.noise_level === 0)
    errors.push(
      'algorithm.policy_loss = flow_grpo needs SDE samples with log-probabilities: set algorithm.image.noise_level > 0 (Flow-GRPO uses 0.7)',
    );
  if (alg.adv_estimator !== 'grpo')
    errors.push(
      `algorithm.adv_estimator = ${alg.adv_estimator}: an image policy's advantages are group-normalised (grpo); set algorithm.adv_estimator = grpo`,
    );
  if (critic.enable === true) errors.push('critic.enable: an image policy trains without a critic; set it to false');
  errors.push(...imageLoraErrors(cfg));
  if (rollout.engine !== 'onnx' || rollout.multi_turn.enable)
    errors.push('an image policy samples in process: rollout.engine = onnx, rollout.multi_turn.enable = false');
  if (alg.use_kl_in_reward)
    errors.push('algorithm.use_kl_in_reward: an image policy has no token KL; use algorithm.use_kl_loss (flow_grpo)');
  return errors;
}

/** An image policy's actor.model.lora (lib/image/lora.ts): rank, alpha, dropout, the DiT's module names, a base to adapt. */
function imageLoraErrors(cfg: Config): string[] {
  const l = cfg.actor.model.lora;
  if (!l) return [];
  const errors: string[] = [];
  try {
    ditLoraConfig({ rank: l.rank, alpha: l.alpha, dropout: l.dropout, targetModules: l.target_modules });
  } catch (e) {
    errors.push((e as Error).message);
  }
  if (l.vision_target_modules !== null)
    errors.push('actor.model.lora.vision_target_modules: an image policy has no vision tower; set it to null');
  if (!cfg.actor.model.path)
    errors.push(
      'actor.model.lora needs actor.model.path: the image model directory the adapters are trained on (LoRA on a randomly initialised DiT has nothing to adapt)',
    );
  return errors;
}

/** Head-size and grouped-query checks of model architectures ([key, keys] pairs). */
function archErrors(archChecks: Array<[string, { d_model: number; n_heads: number; n_kv_heads: number }]>): string[] {
  const errors: string[] = [];
  for (const [where, m] of archChecks) {
    // Rotary embeddings rotate pairs of channels, so the head size d_model / n_heads must be even.
    const goodHeads = divisors(m.d_model).filter((h) => (m.d_model / h) % 2 === 0);
    const headHint =
      goodHeads.length > 0
        ? `set ${where}.n_heads to ${orList(nearest(goodHeads, m.n_heads))}`
        : `set ${where}.d_model to an even number`;
    if (m.d_model % m.n_heads !== 0) {
      errors.push(
        `${where}.d_model = ${m.d_model} is not a multiple of ${where}.n_heads = ${m.n_heads}; ${headHint} (head size d_model / n_heads must be a whole, even number)`,
      );
    } else if ((m.d_model / m.n_heads) % 2 !== 0) {
      errors.push(
        `${where}: the head size d_model / n_heads = ${m.d_model} / ${m.n_heads} = ${m.d_model / m.n_heads} must be even for rotary embeddings; ${headHint}`,
      );
    }
    if (m.n_heads % m.n_kv_heads !== 0) {
      errors.push(
        `${where}.n_kv_heads = ${m.n_kv_heads} does not divide ${where}.n_heads = ${m.n_heads}; set ${where}.n_kv_heads to a divisor of ${m.n_heads} such as ${orList(divisorsNear(m.n_heads, m.n_kv_heads))}`,
      );
    }
  }
  return errors;
}

/** `rlstream sft`: training files, batch sizes, lengths and the architecture of a fresh model. */
export function checkSftConfig(cfg: Config): CheckResult {
  const errors: string[] = [];
  const warnings: string[] = [];
  const { data, actor, sft, pipeline } = cfg;
  if (data.task !== null)
    errors.push(
      `rlstream sft reads rows with a response (data.train_files), but data.task = "${data.task}" generates prompts without one; unset data.task and set data.train_files`,
    );
  const image = policyKindOf(actor.model) === 'image';
  if (data.train_files.length === 0)
    errors.push(
      image
        ? `rlstream sft of an image policy needs (prompt, image) rows: set data.train_files (JSONL or parquet; ${sft.prompt_key} + ${data.image_key} fields)`
        : `rlstream sft needs training rows: set data.train_files (JSONL or parquet; ${sft.prompt_key} + ${sft.response_key} fields, or ${sft.messages_key})`,
    );
  if (image) {
    // an image policy (lib/image/): its shape, its model directory, LoRA on its DiT blocks
    if (actor.model.path !== null && !isDitDir(actor.model.path))
      errors.push(
        `actor.model.kind = image: actor.model.path ${actor.model.path} is not an image model directory (config.json model_type ${DIT_MODEL_TYPE}); unset actor.model.path to start a fresh one of actor.model.image's shape`,
      );
    if (actor.model.path === null) {
      const m = actor.model.image;
      if (m.image_size % m.patch_size !== 0)
        errors.push(
          `actor.model.image.image_size = ${m.image_size} is not a multiple of patch_size = ${m.patch_size}; set patch_size to one of ${orList(divisorsNear(m.image_size, m.patch_size))}`,
        );
      if (m.hidden_size % m.num_heads !== 0)
        errors.push(
          `actor.model.image.num_heads = ${m.num_heads} does not divide hidden_size = ${m.hidden_size}; set it to ${orList(divisorsNear(m.hidden_size, m.num_heads))}`,
        );
      if (m.time_freqs % 2 !== 0)
        errors.push(`actor.model.image.time_freqs = ${m.time_freqs} must be even (cosine and sine pairs)`);
    }
    errors.push(...imageLoraErrors(cfg));
    if (pipeline.store === 'postgres' && pipeline.database_url === null)
      errors.push(
        'pipeline.store = postgres needs pipeline.database_url; set it to postgres://user:password@host:5432/db, or use pipeline.store=embedded',
      );
    return { errors, warnings };
  }
  const gbs = actor.global_batch_size,
    mb = actor.micro_batch_size_per_device_for_update;
  if (gbs % mb !== 0)
    errors.push(
      `actor.micro_batch_size_per_device_for_update = ${mb} does not divide actor.global_batch_size = ${gbs}; set it to a divisor of ${gbs} such as ${orList(divisorsNear(gbs, mb))}`,
    );
  if (actor.model.path === null && sft.max_length > actor.model.max_seq_len) {
    errors.push(
      `sft.max_length = ${sft.max_length} exceeds actor.model.max_seq_len = ${actor.model.max_seq_len}; set actor.model.max_seq_len to at least ${sft.max_length} or lower sft.max_length`,
    );
  }
  if (actor.model.path === null) errors.push(...archErrors([['actor.model', actor.model]]));
  // LoRA: as for train, rank / dropout / target modules one line each, and a base to adapt
  if (actor.model.lora) {
    const l = actor.model.lora;
    try {
      loraConfig(
        {
          rank: l.rank,
          alpha: l.alpha,
          dropout: l.dropout,
          targetModules: l.target_modules,
          visionTargetModules: l.vision_target_modules,
        },
        'actor.model.lora',
      );
    } catch (e) {
      errors.push((e as Error).message);
    }
    if (!actor.model.path)
      errors.push(
        'actor.model.lora needs actor.model.path: the base model directory the adapters are trained on (LoRA on a randomly initialised model has nothing to adapt)',
      );
  }
  if (pipeline.store === 'postgres' && pipeline.database_url === null)
    errors.push(
      'pipeline.store = postgres needs pipeline.database_url; set it to postgres://user:password@host:5432/db, or use pipeline.store=embedded',
    );
  return { errors, warnings };
}

// ---------------------------------------------------------------------------------------------
// Resuming a run with another config

/**
 * Keys a resumed run may change freely: how long it runs (extending a finished run), how often it
 * validates and saves, logging, threads and devices, and where the services are.
 */
const RESUME_FREE = [
  'trainer.total_epochs',
  'trainer.max_steps',
  'trainer.val_freq',
  'trainer.val_before_train',
  'trainer.val_generations_to_log',
  'trainer.save_freq',
  'trainer.save_limit',
  'trainer.logger',
  'trainer.find_last_checkpoint',
  'trainer.run_dir',
  'trainer.resume_with_changed_config',
  'trainer.keep_policy_versions',
  'sft.epochs',
  // the update stage refuses another load_checkpoint_path for a run with state, saying which to give
  'trainer.load_checkpoint_path',
  'actor.threads',
  'actor.device',
  'rollout.device',
  'rollout.batch_size',
  'critic.threads',
  'critic.device',
  'reward.remote.',
  'pipeline.brokers',
  'pipeline.database_url',
  'pipeline.kafka.',
  'pipeline.schema_registry_url',
  'pipeline.heartbeat_seconds',
  'pipeline.lease_seconds',
];

/**
 * Keys whose change gives the stored state another meaning, refused even with
 * trainer.resume_with_changed_config: the dataset position (which rows, batch size, order), the
 * number of samples per prompt, the model's architecture and tokenizer (the stored weights and
 * token ids), what the stored log-probs and values were computed for, and the log's layout.
 */
const RESUME_UNSAFE = [
  'data.train_files',
  'data.format',
  'data.prompt_key',
  'data.answer_key',
  'data.image_key',
  'data.video_key',
  'data.max_prompt_length',
  'data.rollout_batch_size',
  'data.shuffle',
  'data.seed',
  'data.filter_overlong_prompts',
  'data.on_bad_row',
  'data.max_rows',
  'data.task',
  'data.task_size.train',
  'rollout.n',
  'actor.model.',
  'critic.enable',
  'critic.model.',
  'algorithm.adv_estimator',
  'trainer.seed',
  'trainer.project_name',
  'trainer.experiment_name',
  'sft.',
  'pipeline.bus',
  'pipeline.store',
  'pipeline.topic_prefix',
  'pipeline.partitions',
  'pipeline.run_id',
  'pipeline.schema_wire_format',
];

const matches = (key: string, list: readonly string[]) =>
  list.some((k) => (k.endsWith('.') ? key.startsWith(k) : key === k || key.startsWith(`${k}.`)));

function flatten(v: unknown, prefix: string, out: Map<string, string>): void {
  if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
    for (const [k, x] of Object.entries(v as Record<string, unknown>)) flatten(x, prefix ? `${prefix}.${k}` : k, out);
  } else out.set(prefix, JSON.stringify(v ?? null));
}

export interface ResumeConfigDiff {
  /** Keys changed that resume_with_changed_config: true accepts (e.g. actor.optim.lr). */
  safe: string[];
  /** Keys changed that change the meaning of the stored state: never accepted. */
  unsafe: string[];
}

/**
 * The keys that differ between the config a run was started with (`stored`, as kept in its runs
 * row) and the one it is resumed with, sorted into safe and unsafe (free keys are left out).
 * Compares the secret-redacted forms (the stored config is redacted).
 */
export function resumeConfigDiff(stored: unknown, now: Config): ResumeConfigDiff {
  const a = new Map<string, string>(),
    b = new Map<string, string>();
  flatten(stored, '', a);
  flatten(JSON.parse(JSON.stringify(redactSecrets(now))), '', b);
  // A key the stored config lacks was added to the schema after the run started: the run ran with
  // its default (or, for a derived key, with what the other keys, compared here, derive).
  const defaults = new Map<string, string>();
  flatten(JSON.parse(JSON.stringify(schemaDefaults())), '', defaults);
  const addedSince = (k: string) =>
    !a.has(k) && defaults.has(k) && (defaults.get(k) === b.get(k) || defaults.get(k) === 'null');
  const keys = [...new Set([...a.keys(), ...b.keys()])]
    .filter((k) => a.get(k) !== b.get(k) && !matches(k, RESUME_FREE) && !addedSince(k))
    .sort();
  // a list counts as one key (data.train_files, not data.train_files.0)
  const listKey = (k: string) => k.replace(/\.\d+(?=\.|$).*$/, '');
  const uniq = [...new Set(keys.map(listKey))];
  return {
    safe: uniq.filter((k) => !matches(k, RESUME_UNSAFE)),
    unsafe: uniq.filter((k) => matches(k, RESUME_UNSAFE)),
  };
}

/** One line refusing the resume, or null when it may go on. */
export function resumeConfigProblem(runId: string, diff: ResumeConfigDiff, acceptSafe: boolean): string | null {
  const refused = acceptSafe ? diff.unsafe : [...diff.unsafe, ...diff.safe];
  if (refused.length === 0) return null;
  const unsafe = diff.unsafe.length
    ? `${diff.unsafe.join(', ')} ${diff.unsafe.length === 1 ? 'changes' : 'change'} what the stored state means (dataset position, samples, weights or log), so ${diff.unsafe.length === 1 ? 'it' : 'they'} must stay as the run started — start a new run (another trainer.experiment_name or trainer.run_dir) or from a checkpoint (trainer.load_checkpoint_path) to change ${diff.unsafe.length === 1 ? 'it' : 'them'}`
    : '';
  const safe =
    !acceptSafe && diff.safe.length
      ? `${diff.safe.join(', ')} ${diff.safe.length === 1 ? 'differs' : 'differ'} from the run's stored config; add trainer.resume_with_changed_config=true to resume with the new value${diff.safe.length === 1 ? '' : 's'}`
      : '';
  return `run ${runId} was started with another config: ${[unsafe, safe].filter(Boolean).join('; ')}`;
}
