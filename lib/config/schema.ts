/**
 * The run configuration: one strict zod schema for the whole run. Section and key names follow
 * EasyR1/verl where the concept is the same (data, algorithm, rollout, actor, critic, reward,
 * trainer) plus `pipeline` for the event-sourced transport and store.
 *
 * Conventions:
 *  - every key is snake_case, described, and has a default, so `{}` parses to a full config;
 *  - `null` means "unset" for optional keys; keys whose default is derived from other keys are
 *    `null` in the schema and filled by the loader (`resolveDerived` in checks.ts) — their
 *    description says "null → …";
 *  - sections are strict objects (`z.strictObject`) so typos are rejected with their path;
 *  - single-field bounds live here; checks that involve several fields live in checks.ts.
 */
import { z } from 'zod';
import { DEVICES } from '../onnx/devices.ts';
import { REQUEST_PRESET_NAMES, REWARD_TYPES, TRAJECTORY_FIELDS } from '../reward/types.ts';
import { ADV_ESTIMATOR_NAMES } from '../rl/advantage.ts';
import { POLICY_LOSS_NAMES } from '../model/loss.ts';
import { IMAGE_RESAMPLES } from '../data/image-resample.ts';
import { ENGINE_NAMES } from '../inference/engine-port.ts';
import { ROLLOUT_CORRECTION_MODES } from '../rl/rollout-correction.ts';
import { TOOL_CALL_FORMATS } from '../env/tool-calls.ts';
import { POLICY_KINDS } from '../model/policy-kinds.ts';
import { IMAGE_RL_LOSSES } from '../image/flow-graph.ts';

// ---------------------------------------------------------------------------------------------
// Known names (validated here so an unknown one lists the valid ones)

/** Advantage estimators (verl's `AdvantageEstimator` names): the names of lib/rl/advantage.ts's registry. */
export const ADV_ESTIMATORS = ADV_ESTIMATOR_NAMES;

/** Estimators whose baseline is the group of rollout.n responses to one prompt: they need n ≥ 2. */
export const GROUP_ADV_ESTIMATORS: ReadonlySet<string> = new Set([
  'grpo',
  'grpo_vectorized',
  'grpo_passk',
  'rloo',
  'rloo_vectorized',
  'reinforce_plus_plus_baseline',
  'opo',
  'gpg',
  'optimal_token_baseline',
  'tir_optimal_token_baseline',
]);

export const KL_PENALTIES = ['kl', 'abs', 'mse', 'low_var_kl', 'full'] as const;
/** algorithm.vppo.perturbation: the names of lib/data/perturb.ts's registry (a unit test keeps them equal). */
export const PERTURBATIONS = ['patch_blackening', 'gaussian_noise', 'blackout'] as const;
/** Policy losses: the names of the training graph's registry (lib/model/loss.ts). */
export const POLICY_LOSSES = POLICY_LOSS_NAMES;
export const LOSS_AGG_MODES = [
  'token-mean',
  'seq-mean-token-sum',
  'seq-mean-token-mean',
  'seq-mean-token-sum-norm',
] as const;

// ---------------------------------------------------------------------------------------------
// Small builders

/** A section: a strict object whose missing keys take their defaults (`prefault` parses `{}`). */
function section<T extends z.ZodRawShape>(shape: T, description: string) {
  const obj = z.strictObject(shape);
  // Every key has a default, so {} is a valid input; TS cannot see that for a generic shape.
  return obj.prefault({} as z.input<typeof obj>).describe(description);
}

const posInt = () => z.int().gte(1);
const nonNegInt = () => z.int().gte(0);
/** -1 disables; otherwise ≥ 1. */
const offOrPosInt = () =>
  z
    .int()
    .refine((v) => v === -1 || v >= 1, { message: 'must be -1 (off) or an integer ≥ 1' })
    .meta({ typeLabel: '-1 or integer ≥ 1' });
const probability = () => z.number().gte(0).lte(1);
/** Data files: a list, or one string with the files separated by commas (verl/EasyR1 `data.train_files=a,b`). */
const fileList = () =>
  z.preprocess(
    (v) =>
      typeof v === 'string'
        ? v
            .split(',')
            .map((s) => s.trim())
            .filter((s) => s.length > 0)
        : v,
    z.array(z.string().min(1)),
  );
/** Names used in paths and ids. */
const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
const safeName = () =>
  z.string().regex(NAME_RE, {
    message: "may contain only letters, digits, '.', '_' and '-' and must start with a letter or digit",
  });

// ---------------------------------------------------------------------------------------------
// data

const dataSchema = section(
  {
    train_files: fileList()
      .default([])
      .describe(
        "Training data files (JSONL or verl/EasyR1 parquet): a list, a single path, or several paths in one string separated by commas (as verl and EasyR1 accept). Empty when data.task generates the rows. Relative paths in the config file resolve against the file's directory (on the command line: against the working directory), as do the other input paths (val_files, model paths, reward_fn_path, load_checkpoint_path). A row's data_source and extra_info fields are passed to the reward function.",
      ),
    val_files: fileList()
      .default([])
      .describe(
        'Validation data files (same formats and forms as train_files). Needed when validation runs (trainer.val_before_train, val_freq > 0 or val_only).',
      ),
    format: z
      .enum(['auto', 'jsonl', 'parquet'])
      .default('auto')
      .describe('File format; auto picks by extension (.jsonl/.json → jsonl, .parquet → parquet).'),
    prompt_key: z
      .string()
      .min(1)
      .default('prompt')
      .describe(
        'Field holding the prompt: a string, or chat messages [{role, content}] (verl parquet). Dotted paths reach nested fields.',
      ),
    answer_key: z
      .string()
      .min(1)
      .default('answer')
      .describe(
        "Field holding the ground truth passed to the reward (dotted paths reach nested fields). A row without this field falls back to its reward_model.ground_truth, where verl's data preprocessing puts it (JSONL and parquet alike); a row with neither is a bad row.",
      ),
    image_key: z
      .string()
      .min(1)
      .default('images')
      .describe(
        "Field holding a row's images: one or a list of file paths (a string ending in an extension, relative to data.image_dir), base64, data URLs (data:image/...;base64,...), bytes, or {bytes}/{path} objects (parquet); absent or null = no images. Each is decoded and resized (data.min_pixels, max_pixels, image_factor, image_resample) and stored once per run in prompt_images; a missing, unreadable or too-small image makes its row a bad row (data.on_bad_row). A vision-language policy (actor.model.vision, or a model directory with a vision_config) sees them: each image's <|vision_start|><|image_pad|>…<|vision_end|> block goes where the prompt has an <image> marker (one per image), else before the text, and the stages pass the pixels; a text-only policy only stores them.",
      ),
    image_dir: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        'Directory that relative image paths in the data resolve against; null = the directory of the data file that names them.',
      ),
    limit_images: z
      .int()
      .gte(0)
      .default(1)
      .describe('Most images one prompt may carry (EasyR1: limit_images); a row with more is a bad row.'),
    min_pixels: posInt()
      .default(262144)
      .describe(
        'Smallest pixel count (height × width) an image is resized to (Qwen2-VL smart_resize; EasyR1 default 262144 = 512²).',
      ),
    max_pixels: posInt()
      .default(4194304)
      .describe('Largest pixel count an image is resized to (Qwen2-VL smart_resize; EasyR1 default 4194304 = 2048²).'),
    image_factor: posInt()
      .default(28)
      .describe(
        "Image sides are multiples of this: the vision encoder's patch_size × merge_size (Qwen2-VL: 14 × 2 = 28). A side shorter than it is a too-small image (a bad row).",
      ),
    image_resample: z
      .enum(IMAGE_RESAMPLES)
      .default('bicubic')
      .describe(
        "Resampling kernel for resizing images: bicubic is Pillow's BICUBIC computed exactly, as transformers' Qwen2-VL image processor resizes (pixels identical to its slow, PIL processor); nearest, bilinear, mitchell, lanczos2/3 are sharp's (libvips) kernels.",
      ),
    video_key: z
      .string()
      .min(1)
      .default('videos')
      .describe(
        'Field holding videos (EasyR1/verl video_key). rlstream trains on text and images only: a row whose field holds videos stops the load with its file:line, whatever data.on_bad_row says (videos are never dropped silently); absent, null or [] = no videos.',
      ),
    apply_chat_template: z
      .boolean()
      .default(true)
      .describe(
        "Render each prompt with the tokenizer's chat template (chat messages as given; a string prompt as one user message), the generation prompt added, as verl/TRL do; ignored for a tokenizer without a template (byte, alphabet: BOS + prompt text). false = the prompt text as is, with the tokenizer's own specials.",
      ),
    system_prompt: z
      .string()
      .nullable()
      .default(null)
      .describe('A system message put first in every prompt that has none (needs a chat template); null = none.'),
    format_prompt: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        "EasyR1's format_prompt: a Jinja file applied to each string prompt before the chat template (its variable is `content`, e.g. `{{ content }} Put the final answer in \\boxed{}.`); chat-message prompts are left as they are. null = none.",
      ),
    chat_template_kwargs: z
      .record(z.string(), z.unknown())
      .default({})
      .describe(
        "Extra variables for the chat template, as transformers' apply_chat_template(**kwargs), e.g. {enable_thinking: false} for Qwen3.",
      ),
    max_prompt_length: posInt()
      .default(512)
      .describe('Maximum prompt length in tokens, counted after the chat template.'),
    max_response_length: posInt().default(512).describe('Maximum response length in tokens (generation stops there).'),
    rollout_batch_size: posInt()
      .default(512)
      .describe('Prompts per training step; each is sampled rollout.n times (verl: data.train_batch_size).'),
    val_batch_size: offOrPosInt()
      .default(-1)
      .describe('Prompts per validation batch; -1 = the whole validation set in one batch.'),
    shuffle: z
      .boolean()
      .default(true)
      .describe('Shuffle the training rows each epoch (a permutation seeded by data.seed and the epoch).'),
    seed: z.int().default(1).describe('Seed for shuffling and for the built-in task generators.'),
    filter_overlong_prompts: z
      .boolean()
      .default(true)
      .describe(
        'Drop rows whose prompt is longer than max_prompt_length tokens (reported, never silent); false = a bad row (see on_bad_row).',
      ),
    on_bad_row: z
      .enum(['stop', 'skip'])
      .default('stop')
      .describe('A row that fails validation: stop the load with its file:line, or skip it and report it.'),
    max_rows: posInt()
      .nullable()
      .default(null)
      .describe('Load at most this many rows per split (after validation); null = all.'),
    task: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        'Built-in data generator instead of files (number_game, number_game_vision — its prompts carry an image, resized by data.min_pixels / max_pixels —, arithmetic); its rows are seeded by data.seed.',
      ),
    task_size: section(
      {
        train: posInt().default(1024).describe('Training rows generated by data.task.'),
        val: nonNegInt().default(128).describe('Validation rows generated by data.task (0 = none).'),
      },
      'Row counts for data.task.',
    ),
  },
  'Datasets: files or a built-in task, keys, lengths and batch sizes.',
);

// ---------------------------------------------------------------------------------------------
// algorithm

const algorithmSchema = section(
  {
    adv_estimator: z
      .enum(ADV_ESTIMATORS)
      .default('grpo')
      .describe(
        'Advantage estimator. gae needs the critic; group estimators (grpo, rloo, …) need rollout.n ≥ 2; remax also samples one greedy response per training prompt as the baseline (not trained on). optimal_token_baseline and tir_optimal_token_baseline are in lib/rl only: the pipeline refuses them (they need full-vocabulary Σπ² per position).',
      ),
    norm_adv_by_std_in_grpo: z
      .boolean()
      .default(true)
      .describe('GRPO: divide group-centred rewards by the group std (false = Dr. GRPO).'),
    gamma: probability().default(1.0).describe('Discount factor γ (gae, reinforce_plus_plus).'),
    lam: probability().default(1.0).describe('GAE λ (bias–variance trade-off of the advantage).'),
    use_kl_in_reward: z
      .boolean()
      .default(false)
      .describe('Subtract kl_coef · KL(π‖π_ref) from the token rewards (verl use_kl_in_reward).'),
    kl_penalty: z
      .enum(KL_PENALTIES)
      .default('low_var_kl')
      .describe(
        'KL estimator for the in-reward penalty (and the KL loss when kl_loss_type is null): kl (k1), abs, mse (k2), low_var_kl (k3), full (lib/rl only: the pipeline refuses it, it needs full vocabulary distributions).',
      ),
    kl_coef: z
      .number()
      .gte(0)
      .default(1e-3)
      .describe(
        'KL coefficient, used both for the KL loss and the in-reward penalty (EasyR1 convention); the initial value when kl_type = adaptive.',
      ),
    kl_type: z
      .enum(['fixed', 'adaptive'])
      .default('fixed')
      .describe(
        'KL controller for the in-reward coefficient: fixed, or adaptive (Ziegler et al. 2019) towards kl_target.',
      ),
    kl_target: z.number().gt(0).default(0.1).describe('Adaptive KL controller: target KL.'),
    kl_horizon: posInt().default(10000).describe('Adaptive KL controller: horizon in samples.'),
    use_kl_loss: z.boolean().default(true).describe('Add kl_coef · KL(π‖π_ref) to the actor loss (GRPO style).'),
    kl_loss_type: z
      .enum(KL_PENALTIES)
      .nullable()
      .default(null)
      .describe('KL estimator for the KL loss; null → algorithm.kl_penalty.'),
    online_filtering: z
      .boolean()
      .default(false)
      .describe(
        'Drop prompt groups whose filter_key mean lies outside [filter_low, filter_high] and refill the batch (DAPO dynamic sampling).',
      ),
    filter_semantics: z
      .enum(['easyr1', 'dapo'])
      .default('easyr1')
      .describe(
        'easyr1: keep groups with filter_low < mean < filter_high; dapo: keep groups whose filter_key values are not all equal (std > 0).',
      ),
    filter_key: z
      .string()
      .min(1)
      .default('overall')
      .describe(
        'Reward metric the filter reads (e.g. overall, accuracy); overall is the total score (the built-in rewards report it as EasyR1 does; for a reward that does not, the scalar reward).',
      ),
    filter_low: probability().default(0.01).describe('Online filtering: lower bound on the group mean.'),
    filter_high: probability().default(0.99).describe('Online filtering: upper bound on the group mean.'),
    max_try_make_batch: posInt()
      .default(10)
      .describe('Online filtering: refill attempts per step before the run stops with an error.'),
    policy_loss: z
      .enum([...POLICY_LOSSES, ...IMAGE_RL_LOSSES])
      .default('vanilla')
      .describe(
        'Policy loss. An image policy (actor.model.kind = image): flow_grpo (Flow-GRPO, Liu et al. 2025, arXiv 2505.05470: the clipped ratio of every recorded SDE denoising step, KL to v0 with algorithm.use_kl_loss and kl_coef) or diffusion_nft (DiffusionNFT, Zheng et al. 2025, arXiv 2509.16117: the forward-process loss contrasting positive and negative generations, from the clean images and their rewards); see algorithm.image. A language policy: vanilla (PPO clip with dual clip), gspo, sapo, gpg, cispo, reinforce, geo_mean, clip_cov, kl_cov, nft. The update stage trains all of them (gspo and sapo aggregate their policy-gradient term seq-mean-token-mean and geo_mean as a plain mean over sequences, whatever actor.loss_agg_mode says, as verl; clip_cov and kl_cov select their tokens per micro-batch, see algorithm.clip_cov / kl_cov; nft needs a binary correctness per response, see algorithm.nft).',
      ),
    overlong: section(
      {
        enable: z
          .boolean()
          .default(false)
          .describe(
            'Soft overlong punishment (DAPO): a linear penalty for responses longer than max_length − buffer_length.',
          ),
        max_length: posInt()
          .nullable()
          .default(null)
          .describe('Expected maximum response length; null → data.max_response_length.'),
        buffer_length: nonNegInt()
          .default(0)
          .describe('Length of the penalty ramp before max_length (must be > 0 when enabled).'),
        penalty_factor: z
          .number()
          .gte(0)
          .default(1.0)
          .describe('Penalty at max_length (it grows linearly over the buffer).'),
      },
      'DAPO overlong reward shaping.',
    ),
    entropy_penalty_coef: z
      .number()
      .default(0)
      .describe(
        'Entropy penalty: adds entropy_penalty_coef · agg(−log π(token)) over response tokens (the sampled-token entropy estimate, in actor.loss_agg_mode) to the actor loss; > 0 sharpens the policy, < 0 rewards exploration (0 = off). Logged as actor/entropy_penalty. Unlike actor.entropy_coeff it needs no full-vocabulary entropy.',
      ),
    vppo: section(
      {
        enable: z
          .boolean()
          .default(false)
          .describe(
            "VPPO token perception RL (arXiv 2510.09285): the advantage stage scores each response again under a perturbed copy of its image, keeps the gradient of the most image-dependent (and, with enable_entropy_filtering, the highest-entropy) tokens and scales each trajectory's advantage by its mean visual dependency. Needs a vision-language actor (an actor model with a vision tower); with a text-only actor true is refused. The math is lib/rl/vppo.ts, the stage logic lib/rl/vppo-stage.ts.",
          ),
        top_p_perception_tokens: z
          .number()
          .gt(0)
          .lte(1)
          .default(0.2)
          .describe(
            'Per response, the fraction ⌈n·p⌉ of valid tokens with the largest visual dependency S_t = clamp(eᵈ − d − 1, 0, 10), d = clamp(log π_aug − log π_old, ±20), whose gradient is kept (VPPO: 0.2).',
          ),
        enable_entropy_filtering: z
          .boolean()
          .default(false)
          .describe(
            "Also keep the gradient of the top_p_entropy_tokens highest-entropy tokens of each response (the union with the perception tokens; MTRL's enable_entropy_filtering). Needs per-token entropies from the scorer, and algorithm.vppo.enable: without it true is refused (it would do nothing).",
          ),
        top_p_entropy_tokens: z
          .number()
          .gt(0)
          .lte(1)
          .default(0.2)
          .describe("Fraction of each response's valid tokens kept by entropy when enable_entropy_filtering is on."),
        advantage_scaling_min: probability()
          .default(0.8)
          .describe(
            "β_min of the trajectory advantage shaping: the least image-dependent trajectory of a batch gets α = β_min, the batch mean of α is 1 (VPPO's trajectory_scaling_min).",
          ),
        perturbation: z
          .enum(PERTURBATIONS)
          .default('patch_blackening')
          .describe(
            'How the image is perturbed for log π_aug (registry lib/data/perturb.ts, seeded by the sample id so replays reproduce it): patch_blackening (VPPO: each patch_size-pixel cell blackened with probability mask_prob), gaussian_noise (N(0, (noise_std·255)²) per channel value), blackout (the whole image black).',
          ),
        patch_size: posInt()
          .default(14)
          .describe('patch_blackening: cell side in pixels of the resized image (VPPO: 14, the ViT patch).'),
        mask_prob: probability()
          .default(0.5)
          .describe('patch_blackening: probability that a cell is blackened (VPPO: 0.5).'),
        noise_std: z
          .number()
          .gte(0)
          .default(0.1)
          .describe('gaussian_noise: standard deviation as a fraction of the 0–255 pixel range.'),
      },
      'VPPO token perception RL (multimodal; arXiv 2510.09285, huaixuheqing/VPPO-RL).',
    ),
    sapo: section(
      {
        tau_pos: z
          .number()
          .gt(0)
          .default(1.0)
          .describe('SAPO gate temperature τ for tokens with a positive advantage.'),
        tau_neg: z
          .number()
          .gt(0)
          .default(1.05)
          .describe('SAPO gate temperature τ for tokens with a zero or negative advantage.'),
      },
      'Soft adaptive policy optimization settings (policy_loss = sapo): loss = −σ(τ(r − 1))·4/τ·A.',
    ),
    clip_cov: section(
      {
        ratio: z
          .number()
          .gt(0)
          .default(0.0002)
          .describe(
            "At most max(⌊ratio·n⌋, 1) of a micro-batch's n response tokens get no gradient; when more are candidates, a random subset (seeded by data.seed, the optimizer step and the micro-batch) is taken.",
          ),
        lb: z
          .number()
          .default(1.0)
          .describe(
            'Lower bound (exclusive) of the covariance (A − mean A)·(log π − mean log π) of a candidate token.',
          ),
        ub: z.number().default(5.0).describe('Upper bound (exclusive) of that covariance.'),
      },
      'Clip-Cov settings (policy_loss = clip_cov; Cui et al. 2025, arXiv 2505.22617; verl clip_cov_ratio/lb/ub): PPO clip with actor.clip_ratio_low/high (no dual clip) whose unclipped tokens of high advantage–log-prob covariance are candidates to get no gradient. Means and the selection are over one micro-batch (actor.micro_batch_size_per_device_for_update), as verl.',
    ),
    kl_cov: section(
      {
        ratio: z
          .number()
          .gt(0)
          .default(0.0002)
          .describe(
            'The max(⌊ratio·n⌋, 1) response tokens of a micro-batch with the largest covariance get the KL penalty (ties to the earlier token).',
          ),
        ppo_kl_coef: z
          .number()
          .gte(0)
          .default(0.1)
          .describe('Coefficient of the |log π − log π_old| penalty on those tokens.'),
      },
      'KL-Cov settings (policy_loss = kl_cov; Cui et al. 2025, arXiv 2505.22617; verl kl_cov_ratio, ppo_kl_coef): unclipped −A·π/π_old, plus ppo_kl_coef·|log π − log π_old| on the tokens of largest advantage–log-prob covariance. Means and the selection are over one micro-batch, as verl.',
    ),
    nft: section(
      {
        neg_weight: z
          .number()
          .default(1.0)
          .describe(
            'NFT policy loss: weight of the negative-sample term (1 = NFT, 0 = RFT: positives only; < 0 = the DAPO-like variant of NVlabs NFT, i.e. the PPO clipped loss on the advantages, as policy_loss vanilla).',
          ),
        correct_key: z
          .string()
          .min(1)
          .default('accuracy')
          .describe(
            'Reward metric that says whether a response is correct: reward_details[correct_key] must be 1 (correct) or 0 / −1 (incorrect); "accuracy" and "overall" fall back to the scalar reward when the reward reports no such metric (a verifier returning a bare 1/0). The built-in rewards report accuracy (0/1) and overall (the total score, with the format bonus, as EasyR1). A non-binary value stops the run with an error naming the sample.',
          ),
      },
      "Negative-aware fine-tuning loss settings (policy_loss = nft; Chen et al. 2025, arXiv 2505.18116). NFT trains on each response's binary correctness and its group's accuracy r̂ (clamped to [0.02, 0.98]), not on advantages: correct responses maximise log π/π_old, incorrect ones the implicit negative policy (1 − r̂·π/π_old)/(1 − r̂); every token weighted by 1 − r̂, the policy-gradient term summed over tokens whatever actor.loss_agg_mode says (as NVlabs/NFT). adv_estimator still computes the logged advantages.",
    ),
    image: section(
      {
        steps: posInt()
          .default(10)
          .describe(
            "Denoising steps of a training sample (Flow-GRPO's denoising reduction: fewer while training than at evaluation). flow_grpo trains once per stochastic step (all but the last).",
          ),
        eval_steps: posInt()
          .default(10)
          .describe('Denoising steps of a validation sample (Euler ODE, deterministic given the sample id).'),
        noise_level: z
          .number()
          .gte(0)
          .default(0.7)
          .describe(
            "Flow-GRPO's SDE noise level a (σ_t = a·√(t/(1 − t))) of training samples; 0 samples them with the ODE (diffusion_nft needs no likelihoods and may use 0). flow_grpo needs a > 0.",
          ),
        cfg_scale: z
          .number()
          .gte(0)
          .default(1)
          .describe(
            "Classifier-free guidance scale w of validation samples: v = v_null + w·(v_c − v_null), v_null the model's null-prompt class; 1 = no guidance. Training samples use train_cfg_scale.",
          ),
        train_cfg_scale: z
          .number()
          .gte(0)
          .default(1)
          .describe(
            "Classifier-free guidance scale w of training samples and of the velocity the RL loss trains, v = v_null + w·(v_c − v_null) from the same weights (the DiT runs on the prompt's class and on the null class; the gradient reaches both). flow_grpo: each SDE step's recorded log-probability is that of the guided velocity it was sampled with, and the update recomputes it the same way (Flow-GRPO trains SD3.5 with CFG so). diffusion_nft: samples from the guided sampling policy, v_old and v_θ guided. 1 = unguided (diffusion_nft's CFG-free training, as its paper). Needs a model whose null class was trained (rlstream sft with sft.cfg_dropout > 0).",
          ),
        nft_updates: posInt()
          .default(2)
          .describe(
            'diffusion_nft: optimizer steps per training step, each on fresh forward-process (t, ε) of the clean images.',
          ),
        nft_beta: z
          .number()
          .gt(0)
          .default(1)
          .describe(
            'diffusion_nft: β, the step of the implicit positive and negative policies v± = (1 ∓ β)·v_old ± β·v_θ.',
          ),
        nft_old_decay_rate: z
          .number()
          .gte(0)
          .default(0.001)
          .describe(
            "diffusion_nft: the sampling policy θ_old (which samples the training images and gives v_old) is soft-updated after training step i: θ_old ← η_i·θ_old + (1 − η_i)·θ, η_i = min(nft_old_decay_rate·i, nft_old_decay_max) (DiffusionNFT's soft update, Zheng et al. 2025; defaults 0.001 and 0.5). Stored beside each version (policy-store kind `sampler`), so a resumed run continues from the same θ_old. 0: θ_old = θ (on-policy).",
          ),
        nft_old_decay_max: z
          .number()
          .gte(0)
          .lt(1)
          .default(0.5)
          .describe("diffusion_nft: the largest η_i of the sampling policy's soft update (nft_old_decay_rate)."),
        nft_adv_clip: z
          .number()
          .gt(0)
          .default(5)
          .describe(
            "diffusion_nft: c of the optimality r = ½ + ½·clip(A/c, −1, 1), A = (R − mean_group)/Z (Z: nft_adv_std). 5 is DiffusionNFT's (r linear in A up to 5 Z); 1 saturates r at one Z from the group's mean.",
          ),
        nft_adv_std: z
          .enum(['centred', 'global'])
          .default('global')
          .describe(
            "diffusion_nft: Z of the advantage A = (R − mean_group)/Z: global, the batch std of the raw rewards + 1e-4 (DiffusionNFT's code); centred, the batch std of the group-centred rewards.",
          ),
        nft_adaptive_weight: z
          .boolean()
          .default(true)
          .describe(
            "diffusion_nft: DiffusionNFT's adaptive loss weighting (false: the plain r·‖v⁺ − u‖² + (1 − r)·‖v⁻ − u‖²). Each of the positive and negative terms is the x₀-prediction error t·(u − v±) in squared pixel mean over its pixel-mean absolute value (no gradient through the weight), in place of ‖v± − u‖².",
          ),
      },
      "Image policies (actor.model.kind = image; docs/image-generation.md): sampling and the loss's settings. Advantages are group-normalised by the group's population std, as Flow-GRPO (algorithm.adv_estimator = grpo); diffusion_nft's optimality r = ½ + ½·clip((R − mean_group)/(Z·c), −1, 1) (nft_adv_clip c, nft_adv_std Z). actor.optim, actor.clip_ratio_low/high, actor.ppo_epochs, algorithm.use_kl_loss/kl_coef and algorithm.ema apply as for a language policy.",
    ),
    ema: section(
      {
        enable: z
          .boolean()
          .default(false)
          .describe(
            "Keep an exponential moving average of the policy weights, θ_ema ← decay·θ_ema + (1 − decay)·θ after every update, stored beside each policy version (artifact kind ema; <run_dir>/ema/vNNNNNN on a filesystem store). An image policy's validation samples are drawn with the EMA of the version they validate (docs/image-generation.md), and `rlstream sft` of an image policy keeps one too (checkpoint actor/ema.safetensors, drawn by the sample grids); a language policy's EMA is stored only (its samplers use the policy weights).",
          ),
        decay: z.number().gt(0).lt(1).default(0.999).describe('EMA decay per update.'),
      },
      'Exponential moving average of the weights.',
    ),
    rollout_correction: section(
      {
        mode: z
          .enum(ROLLOUT_CORRECTION_MODES)
          .default('off')
          .describe(
            "Rollout/training mismatch correction with w = π_train(token) / π_rollout(token) (trainer-recomputed old log-prob over the engine's behaviour log-prob), multiplied into the policy loss per token: off = none (the metrics rollout/mismatch_kl, rollout/is_weight_mean, rollout/is_weight_clipped_frac, rollout/logprob_mismatch_abs_mean and _max are still logged); tis = truncated importance sampling, w capped at threshold (verl rollout_is_mode=truncate, TRL vllm_importance_sampling_correction); mis = masked importance sampling, tokens (or sequences) whose w is outside [threshold_lower, threshold] get weight 0 (verl rollout_is_mode=mask).",
          ),
        level: z
          .enum(['token', 'sequence'])
          .default('token')
          .describe(
            'token = a weight per token; sequence = one weight per response, exp(Σ log w) over its tokens (verl rollout_is_level).',
          ),
        threshold: z
          .number()
          .gt(1)
          .default(2)
          .describe('Upper bound C of w (verl rollout_is_threshold, TRL vllm_importance_sampling_cap).'),
        threshold_lower: z
          .number()
          .gt(0)
          .lt(1)
          .nullable()
          .default(null)
          .describe('mis: lower bound of w; null = 1 / threshold (verl rollout_is_threshold_lower).'),
      },
      'Importance-sampling correction for responses sampled by another engine than the trainer (vLLM/SGLang precision and kernels differ); applies to on-policy samples, whose old log-probs the trainer recomputes.',
    ),
  },
  'Advantage estimation, KL control, online filtering and loss shaping.',
);

// ---------------------------------------------------------------------------------------------
// rollout

const rolloutSchema = section(
  {
    n: posInt().default(5).describe('Responses sampled per prompt (the group size).'),
    temperature: z.number().gt(0).default(1.0).describe('Sampling temperature for training rollouts.'),
    top_p: z.number().gt(0).lte(1).default(1.0).describe('Nucleus sampling threshold (1 = off).'),
    top_k: offOrPosInt().default(-1).describe('Top-k sampling (-1 = off).'),
    val_override: section(
      {
        temperature: z.number().gte(0).default(0.6).describe('Validation sampling temperature (0 = greedy).'),
        top_p: z.number().gt(0).lte(1).default(0.95).describe('Validation nucleus threshold.'),
        n: posInt().default(1).describe('Responses per validation prompt.'),
        top_k: offOrPosInt().nullable().default(null).describe('Validation top-k; null → rollout.top_k.'),
      },
      'Sampling settings for validation (verl: rollout.val_kwargs).',
    ),
    replicas: posInt().default(1).describe('Rollout workers (processes or pods) sharing the prompts.'),
    batch_size: posInt()
      .nullable()
      .default(null)
      .describe(
        'Sequences generated per forward batch; null = 64 (a batch is also capped at 262144 prompt + response tokens).',
      ),
    device: z
      .enum(DEVICES)
      .nullable()
      .default(null)
      .describe(
        'onnxruntime execution provider for sampling; null = actor.device. Token-by-token sampling is one small session.run per token, which a GPU EP makes slower (measured on an H100 over WebGPU: 4–16× slower than 2 CPU threads), so actor.device=webgpu with rollout.device=cpu is usually the faster pair.',
      ),
    multi_turn: section(
      {
        enable: z
          .boolean()
          .default(false)
          .describe(
            'Multi-turn episodes (verl: actor_rollout_ref.rollout.multi_turn.enable): each dataset row starts an episode; the policy samples an assistant turn, the environment (multi_turn.interaction) answers, until it says done, max_assistant_turns or the token budget data.max_response_length (all turns together). docs/agents.md.',
          ),
        max_assistant_turns: posInt()
          .default(8)
          .describe('Assistant turns per episode at most (verl: multi_turn.max_assistant_turns).'),
        max_user_turns: posInt()
          .nullable()
          .default(null)
          .describe(
            'Environment answers per episode at most (verl: multi_turn.max_user_turns); null = max_assistant_turns. The episode ends (finish reason stop) when reached.',
          ),
        max_tokens_per_turn: posInt()
          .nullable()
          .default(null)
          .describe('Tokens one assistant turn may sample; null = the budget left of data.max_response_length.'),
        max_episodes_in_flight: posInt()
          .default(64)
          .describe(
            'Episodes run concurrently per rollout batch: while some wait on their environment, the others are generated for in one batch (continuous batching across episodes).',
          ),
        gamma: z
          .number()
          .gt(0)
          .lte(1)
          .default(1)
          .describe("An episode's reward: Σ_t gamma^t · r_t over its assistant turns t = 0, 1, … (1 = the plain sum)."),
        interaction: section(
          {
            type: z
              .enum(['module', 'http'])
              .default('module')
              .describe(
                'module: a JS/TS module exporting start(row) and step(state, assistant_message); http: the HTTP environment protocol (POST /reset, /step, /close; docs/agents.md). verl: interaction_config_path.',
              ),
            path: z
              .string()
              .min(1)
              .nullable()
              .default(null)
              .describe(
                "type = module: the environment module; a relative path in the config file resolves against the file's directory.",
              ),
            url: z.string().min(1).nullable().default(null).describe("type = http: the environment server's base URL."),
            kwargs: z
              .record(z.string(), z.unknown())
              .default(() => ({}))
              .describe('Passed to the environment with every row (row.kwargs).'),
            timeout_s: z
              .number()
              .positive()
              .default(30)
              .describe(
                'Time limit of one environment call (start or step): past it the episode fails with a timeout.',
              ),
            max_retries: nonNegInt()
              .default(2)
              .describe('type = http: retries of a request that got no connection, a 5xx or 429 (backing off).'),
          },
          'The environment the policy talks to (verl: the interaction).',
        ),
        tools: z
          .array(z.record(z.string(), z.unknown()))
          .default(() => [])
          .describe(
            'Tools the policy may call, inline: OpenAI function schemas [{type: function, function: {name, description, parameters}}], handed to the chat template as its `tools` argument (prompts, sft and episode segments) and run by multi_turn.tool_executor. Added to the tools of tool_config_path. With tools the interaction is optional (without one an episode ends at the first assistant message without a tool call). docs/agents.md "Tools".',
          ),
        tool_config_path: z
          .string()
          .min(1)
          .nullable()
          .default(null)
          .describe(
            "verl: multi_turn.tool_config_path. A YAML or JSON file `tools: [{tool_schema: {type: function, function: {…}}}]` (verl's tool config; its class_name and config entries are not used: tools run through multi_turn.tool_executor). A relative path in the config file resolves against the file's directory.",
          ),
        format: z
          .enum(TOOL_CALL_FORMATS as [string, ...string[]])
          .default('hermes')
          .describe(
            'verl: multi_turn.format. How the policy writes tool calls: hermes = <tool_call>{"name": …, "arguments": {…}}</tool_call> blocks (Qwen2.5, Qwen3); llama3_json = the message is {"name": …, "parameters": {…}} (Llama 3.1/3.2).',
          ),
        max_parallel_calls: posInt()
          .default(1)
          .describe(
            'verl: multi_turn.max_parallel_calls. Tool calls run per assistant message at most (concurrently); further calls are answered with an error.',
          ),
        tool_executor: section(
          {
            type: z
              .enum(['module', 'http'])
              .default('module')
              .describe(
                'module: a JS/TS module exporting one function per tool, fn(arguments, {episode_id}); http: POST <url>/<tool name> {episode_id, arguments} → {result} or {error}. A malformed call or a tool error is answered to the model as a tool message and counted (env/tool_error_rate), never an episode failure.',
              ),
            path: z
              .string()
              .min(1)
              .nullable()
              .default(null)
              .describe(
                "type = module: the tools module; a relative path in the config file resolves against the file's directory.",
              ),
            url: z.string().min(1).nullable().default(null).describe("type = http: the tool server's base URL."),
            timeout_s: z
              .number()
              .positive()
              .default(30)
              .describe('Time limit of one tool call: past it the call is answered with a timeout error.'),
            max_retries: nonNegInt()
              .default(2)
              .describe('type = http: retries of a call that got no connection, a 5xx or 429 (backing off).'),
          },
          'How tool calls run (verl: the tool classes of tool_config_path).',
        ),
      },
      'Multi-turn episodes with an environment (verl: actor_rollout_ref.rollout.multi_turn).',
    ),
    engine: z
      .enum(ENGINE_NAMES)
      .default('onnx')
      .describe(
        "What samples the responses: onnx = the rollout stage's own onnxruntime sampler; openai = OpenAI-compatible inference servers at rollout.openai.urls (rlstream serve-policy, vLLM, SGLang), sent token-id prompts, told to load each new policy version (SGLang's update_weights_from_disk) before it is used. See docs/inference.md.",
      ),
    openai: section(
      {
        urls: z
          .array(z.url())
          .default([])
          .describe('Engine base URLs (http://host:port); requests go to the least-loaded healthy one.'),
        model: z
          .string()
          .nullable()
          .default(null)
          .describe("The `model` of each request; null = the first model the engine's GET /v1/models lists."),
        reload: z
          .boolean()
          .default(true)
          .describe(
            "Before sampling with a new policy version, POST /update_weights_from_disk {model_path: the version directory, weight_version} to each engine (SGLang's request; serve-policy answers it too). false = the engine loads versions itself (serve-policy following the run directory).",
          ),
        timeout_ms: posInt().default(120000).describe('Time limit of one completion request.'),
        max_retries: nonNegInt()
          .default(4)
          .describe(
            'Retries of a request that got no connection, a timeout, 429 or 5xx (backing off, on another engine when one is up); then the batch is retried as a whole.',
          ),
        concurrency_per_server: posInt().default(256).describe('Most requests in flight per engine.'),
        cooldown_ms: nonNegInt().default(2000).describe('An engine that failed gets no requests for this long.'),
        api_key_env: z
          .string()
          .nullable()
          .default(null)
          .describe('Environment variable holding a bearer token for the engines (vLLM --api-key); null = none.'),
      },
      'The inference engines of rollout.engine = openai.',
    ),
  },
  'Sampling of responses.',
);

// ---------------------------------------------------------------------------------------------
// actor

const modelSchema = section(
  {
    path: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        'Start from this model directory: a Hugging Face one (config.json with model_type llama, mistral, qwen2 or qwen3; generation_config.json; model.safetensors or sharded with model.safetensors.index.json, bf16/f16/f32; tokenizer.json + tokenizer_config.json) or an rlstream policy version / checkpoint actor/. Its config.json sets the architecture (the architecture keys below are then not used) and its tokenizer replaces actor.model.tokenizer; every policy version and checkpoint is written back in the same layout. null = initialise from the keys below.',
      ),
    kind: z
      .enum(POLICY_KINDS)
      .nullable()
      .default(null)
      .describe(
        'What the policy generates: language (token sequences) or image (a flow-matching DiT, docs/image-generation.md; actor.model.path names its model directory, config.json model_type rlstream_dit, and its class_names are the prompts it draws). null = decided by actor.model.path: a model_type rlstream_dit directory is an image policy, anything else a language one.',
      ),
    d_model: posInt().default(64).describe('Hidden size.'),
    n_layers: posInt().default(2).describe('Transformer layers.'),
    n_heads: posInt()
      .default(4)
      .describe(
        'Attention heads (must divide d_model; the head size d_model / n_heads must be even for rotary embeddings).',
      ),
    n_kv_heads: posInt().default(4).describe('Key/value heads (grouped-query attention; must divide n_heads).'),
    ffn: posInt().default(256).describe('Feed-forward hidden size.'),
    max_seq_len: posInt().default(1024).describe('Longest sequence (prompt + response) the model handles.'),
    qkv_bias: z.boolean().default(false).describe('Bias terms on the query/key/value projections (Qwen2 style).'),
    rope_theta: z.number().gt(0).default(10000).describe('Rotary position embedding base.'),
    rms_norm_eps: z.number().gt(0).default(1e-6).describe('RMSNorm ε.'),
    tie_embeddings: z.boolean().default(true).describe('Share the input embedding and output projection.'),
    init_seed: z.int().default(1).describe('Seed of the random initialisation (ignored with path).'),
    tokenizer: z
      .enum(['byte', 'alphabet'])
      .default('byte')
      .describe('byte: 256 byte tokens + specials; alphabet: one token per character of actor.model.alphabet.'),
    alphabet: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe('Characters of the alphabet tokenizer; null → the alphabet of data.task.'),
    vision: section(
      {
        enable: z
          .boolean()
          .default(false)
          .describe(
            'Make the fresh policy (and critic) vision-language models: a Qwen2-VL vision tower whose image tokens replace the <|image_pad|> embeddings of the prompt (docs/models.md "Vision-language policies"). Three token ids are added after the tokenizer\'s: <|image_pad|>, <|vision_start|>, <|vision_end|> (never sampled). With actor.model.path the directory\'s config.json vision_config decides instead.',
          ),
        depth: posInt().default(2).describe('ViT blocks.'),
        hidden_size: posInt()
          .default(64)
          .describe(
            'ViT width (Qwen2-VL embed_dim); its head size hidden_size / num_heads must be a multiple of 4 for 2-D rotary positions (2 for 1-D).',
          ),
        intermediate_size: posInt().default(128).describe('ViT MLP hidden width.'),
        num_heads: posInt().default(4).describe('ViT attention heads.'),
        patch_size: posInt()
          .default(14)
          .describe('Patch side in pixels; data.image_factor must be patch_size × spatial_merge_size.'),
        temporal_patch_size: posInt()
          .default(2)
          .describe('Frames per patch (an image is repeated over them, as Qwen2-VL).'),
        spatial_merge_size: z
          .union([z.literal(1), z.literal(2)])
          .default(2)
          .describe('2: each 2×2 patch window becomes one decoder token (Qwen2-VL merger); 1: one token per patch.'),
        rope: z
          .enum(['2d', '1d'])
          .default('2d')
          .describe('Rotary positions in the ViT: 2d = patch (row, column) (Qwen2-VL), 1d = patch index.'),
        init_std: z
          .number()
          .positive()
          .default(0.02)
          .describe(
            "Standard deviation of the fresh tower's weight init (its linear layers and patch embedding ~ N(0, init_std); norms 1, biases 0). 0.02 is Hugging Face's; a tower trained from scratch by RL may need larger (the vision number game uses 0.3: docs/experiments/number-game-vision.md).",
          ),
      },
      'Vision tower of a fresh vision-language policy (Qwen2-VL layout).',
    ),
    image: section(
      {
        image_size: posInt().default(32).describe('Image side S in pixels (square images; a multiple of patch_size).'),
        channels: z
          .union([z.literal(1), z.literal(3)])
          .default(1)
          .describe('Channels: 1 = greyscale, 3 = RGB. Training images are converted to it.'),
        patch_size: posInt().default(4).describe('Patch side p: the DiT sees (S/p)² tokens of C·p·p pixels.'),
        hidden_size: posInt().default(64).describe('Hidden size D (a multiple of num_heads).'),
        depth: posInt().default(2).describe('Transformer blocks.'),
        num_heads: posInt().default(4).describe('Attention heads.'),
        mlp_ratio: posInt().default(2).describe('MLP hidden size = mlp_ratio × hidden_size.'),
        time_freqs: posInt().default(32).describe('Sinusoidal timestep features (even).'),
        init_seed: z
          .int()
          .default(1)
          .describe('Seed of the random initialisation (adaLN-Zero: the fresh model predicts v = 0).'),
      },
      "Shape of a fresh image policy (actor.model.kind = image without actor.model.path; `rlstream sft` initialises it, docs/image-generation.md): the keys of an image model directory's config.json. With actor.model.path the directory's config.json decides instead.",
    ),
    enable_gradient_checkpointing: z
      .boolean()
      .default(false)
      .describe(
        "Gradient (activation) checkpointing in the training graph (verl: model.enable_gradient_checkpointing): each decoder layer keeps only its input for the backward and recomputes its forward there, so activation memory is one layer's instead of all layers' (SmolLM2-135M, 2 × 1024 tokens: docs/benchmarks.md) for about one more forward pass of compute; gradients are bit-identical. Applies to rlstream train (policy, and the critic unless critic.model says otherwise) and sft, with or without LoRA.",
      ),
    freeze_vision_tower: z
      .boolean()
      .default(false)
      .describe(
        "Do not train a vision-language policy's vision tower: no gradient reaches it and its weights and optimizer moments stay as loaded (no weight decay either).",
      ),
    lora: z
      .strictObject({
        rank: z.int().default(16).describe('Adapter rank r (≥ 1).'),
        alpha: z.number().default(32).describe('Scale numerator: the update is (alpha / rank)·B·A (PEFT lora_alpha).'),
        dropout: z
          .number()
          .default(0)
          .describe('LoRA dropout; only 0 is accepted (dropout on the adapter input is not implemented).'),
        target_modules: z
          .union([z.literal('all-linear'), z.array(z.string().min(1))])
          .default('all-linear')
          .describe(
            "Adapted linear layers: a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or all-linear (all seven; the LM head is never adapted). An image policy's: ada, qkv, proj, fc1, fc2 of every DiT block, or all-linear (all five; docs/image-generation.md).",
          ),
        vision_target_modules: z
          .union([z.literal('all-linear'), z.array(z.string().min(1))])
          .nullable()
          .default(null)
          .describe(
            "A vision-language policy's ViT-block linear layers to adapt too: a list of qkv, proj (attention) and the MLP's gate_proj, up_proj, down_proj (Qwen2.5-VL) or fc1, fc2 (Qwen2-VL and rlstream's fresh tower), or all-linear (every one the tower has; the patch embedding and the merger are never adapted). The tower's base weights stay frozen; its adapters are trained (at actor.optim.vision_lr_scale × the learning rate) and saved with PEFT's names for the model (base_model.model.visual.blocks.N.attn.qkv.lora_A.weight, or base_model.model.model.visual.… for a checkpoint in transformers 5's layout). null = the tower is not adapted.",
          ),
      })
      .nullable()
      .default(null)
      .describe(
        "LoRA (Hu et al. 2021, PEFT conventions): train low-rank adapters A [r, in] (Kaiming-uniform) and B [out, r] (zeros) on the chosen linear layers while the base weights stay frozen (no gradients, no AdamW state). The reference policy is the base with the adapters off; policy versions and checkpoints carry only the adapter in PEFT layout (adapter_config.json + adapter_model.safetensors); `rlstream export --merge` writes the merged model. An image policy's versions and checkpoints hold the merged weights (model.safetensors) with the adapter beside them (adapter.safetensors), and its EMA may be on. null = full fine-tuning.",
      ),
  },
  'Policy model: a checkpoint to load or the architecture of a fresh one.',
);

function optimSchema(lr: number, description: string) {
  return section(
    {
      lr: z.number().gt(0).default(lr).describe('Peak learning rate.'),
      weight_decay: z.number().gte(0).default(1e-2).describe('AdamW decoupled weight decay.'),
      betas: z
        .tuple([z.number().gte(0).lt(1), z.number().gte(0).lt(1)])
        .default([0.9, 0.999])
        .describe('AdamW β1, β2.'),
      eps: z.number().gt(0).default(1e-8).describe('AdamW ε.'),
      lr_warmup_ratio: probability()
        .default(0)
        .describe('Linear warmup over this fraction of the total optimizer steps.'),
      lr_warmup_steps: nonNegInt()
        .nullable()
        .default(null)
        .describe('Linear warmup over this many optimizer steps; overrides lr_warmup_ratio when set.'),
      lr_scheduler: z.enum(['constant', 'cosine']).default('constant').describe('Schedule after warmup.'),
      min_lr_ratio: probability().default(0).describe('Cosine schedule: final lr as a fraction of lr.'),
      max_grad_norm: z.number().gt(0).default(1.0).describe('Clip the global gradient norm to this value.'),
      vision_lr_scale: z
        .number()
        .gt(0)
        .default(1)
        .describe(
          "Learning-rate multiplier of a vision-language model's vision tower (its visual.* parameters): their AdamW step and weight decay use lr × vision_lr_scale at every point of the schedule; 1 = one lr for all. No effect on a text-only model (docs/experiments/number-game-vision.md).",
        ),
    },
    description,
  );
}

const actorSchema = section(
  {
    model: modelSchema,
    optim: optimSchema(1e-6, 'Actor optimizer (AdamW) and learning-rate schedule.'),
    global_batch_size: posInt()
      .default(128)
      .describe(
        'Samples per optimizer update (verl: ppo_mini_batch_size × n); must divide data.rollout_batch_size × rollout.n.',
      ),
    micro_batch_size_per_device_for_update: posInt()
      .default(4)
      .describe(
        'Samples per forward/backward pass in the update (gradient accumulation); must divide global_batch_size.',
      ),
    micro_batch_size_per_device_for_experience: posInt()
      .default(16)
      .describe(
        'Samples per forward pass when computing reference and old log-probs and critic values (verl: log_prob_micro_batch_size_per_gpu); the results do not depend on it beyond float rounding (rows are padded to the longest row of their pass, which changes summation order by ulps), speed and peak memory do (CPU: larger is faster); must divide global_batch_size.',
      ),
    ppo_epochs: posInt().default(1).describe('Passes over each step’s samples.'),
    clip_ratio_low: z.number().gte(0).default(0.2).describe('PPO clip: lower ratio bound 1 − clip_ratio_low.'),
    clip_ratio_high: z
      .number()
      .gte(0)
      .default(0.3)
      .describe('PPO clip: upper ratio bound 1 + clip_ratio_high (DAPO clip-higher).'),
    clip_ratio_dual: z
      .number()
      .default(3.0)
      .describe('Dual-clip bound c for negative advantages (Ye et al. 2020); must be > 1.'),
    loss_agg_mode: z
      .enum(LOSS_AGG_MODES)
      .default('token-mean')
      .describe('How token losses are aggregated into the batch loss.'),
    entropy_coeff: z
      .number()
      .default(0)
      .describe(
        'Entropy bonus coefficient in the actor loss (0 = off); with entropy_coeff_end, its value at the first optimizer step.',
      ),
    entropy_coeff_end: z
      .number()
      .nullable()
      .default(null)
      .describe(
        "The entropy bonus coefficient at the last optimizer step of the run: the coefficient goes linearly from entropy_coeff at the first optimizer step to this at the last (the learning-rate schedule's span), logged as actor/entropy_coeff. A high bonus early keeps the policy exploring; decayed, it lets the policy settle. null = entropy_coeff throughout.",
      ),
    threads: posInt().default(2).describe('onnxruntime intra-op threads for the actor.'),
    device: z
      .enum(DEVICES)
      .default('cpu')
      .describe(
        'onnxruntime execution provider for every policy and critic session (sampling, scoring, values, training; rollout.device can move sampling elsewhere). cuda: the CUDA EP, which `npm ci` skips: on a networked machine with CUDA 12 and cuDNN 9 run `ONNXRUNTIME_NODE_INSTALL=cuda12 node node_modules/onnxruntime-node/script/install.js`. webgpu: the WebGPU EP shipped in onnxruntime-node, on any GPU with a Vulkan driver (Linux: libvulkan1). A device that cannot start stops the run at start saying why.',
      ),
  },
  'The policy: model, optimizer and PPO update settings.',
);

// ---------------------------------------------------------------------------------------------
// critic

const criticModelSchema = section(
  {
    path: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        'Start the critic from this model directory (a value model, or a causal-LM Hugging Face directory whose trunk is used with a fresh score head); null → actor.model.path the same way when set (as verl does), else a fresh model from the keys below.',
      ),
    d_model: posInt().nullable().default(null).describe('Hidden size; null → actor.model.d_model.'),
    n_layers: posInt().nullable().default(null).describe('Layers; null → actor.model.n_layers.'),
    n_heads: posInt().nullable().default(null).describe('Attention heads; null → actor.model.n_heads.'),
    n_kv_heads: posInt().nullable().default(null).describe('Key/value heads; null → actor.model.n_kv_heads.'),
    ffn: posInt().nullable().default(null).describe('Feed-forward size; null → actor.model.ffn.'),
    max_seq_len: posInt().nullable().default(null).describe('Longest sequence; null → actor.model.max_seq_len.'),
    init_seed: z.int().nullable().default(null).describe('Initialisation seed; null → actor.model.init_seed + 1.'),
    enable_gradient_checkpointing: z
      .boolean()
      .nullable()
      .default(null)
      .describe(
        "Gradient checkpointing in the critic's training graph (see actor.model.enable_gradient_checkpointing); null → the actor's setting.",
      ),
  },
  'Critic model: overrides of actor.model (null = same as the actor).',
);

const criticSchema = section(
  {
    enable: z
      .boolean()
      .nullable()
      .default(null)
      .describe('Train a value function; null → true exactly when algorithm.adv_estimator = gae.'),
    model: criticModelSchema,
    optim: optimSchema(1e-5, 'Critic optimizer (AdamW).'),
    cliprange_value: z.number().gt(0).default(0.5).describe('Value clipping range around the old values.'),
    ppo_epochs: posInt().nullable().default(null).describe('Passes over each step’s samples; null → actor.ppo_epochs.'),
  },
  'Value function for GAE.',
);

// ---------------------------------------------------------------------------------------------
// reward

const remoteSchema = section(
  {
    enabled: z
      .boolean()
      .nullable()
      .default(null)
      .describe(
        'Call the reward servers; null → true when reward.type = remote. DISABLE_RL_REWARD_MODEL=true sets it to false (rewards then come from reward.reward_fn).',
      ),
    urls: z
      .array(z.string().min(1))
      .nullable()
      .default(null)
      .describe('Reward server URLs (http/https); alternatively host + start_port + count.'),
    host: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe('Seed-style endpoints: http://host:(start_port + i) for i < count.'),
    start_port: z.int().gte(1).lte(65535).default(8000).describe('First port of the seed-style endpoints.'),
    count: posInt().default(1).describe('Number of seed-style endpoints.'),
    request_preset: z
      .enum(REQUEST_PRESET_NAMES)
      .default('seed_image_prompt')
      .describe(
        'Request body: seed_image_prompt = {image, prompt} (image as base64 PNG); text = {prompt, response, ground_truth}.',
      ),
    request_template: z
      .record(z.string().min(1), z.enum(TRAJECTORY_FIELDS))
      .nullable()
      .default(null)
      .describe(
        `Custom request body: body field → trajectory field (${TRAJECTORY_FIELDS.join(', ')}); overrides request_preset.`,
      ),
    response_mapping: section(
      {
        weights: z
          .record(z.string().min(1), z.number().gte(0))
          .default(() => ({ vlm_score: 0.5, ocr_confidence: 0.5 }))
          .describe('Reward = Σ weight · response[field]; each listed field must be a number in range.'),
        range: z
          .tuple([z.number(), z.number()])
          .default([0, 1])
          .describe('Allowed [low, high] of each mapped response field; a value outside is a failed reward.'),
      },
      'How a server response becomes a scalar reward.',
    ),
    auth_header: z.string().min(1).default('Authorization').describe('Header carrying the token.'),
    auth_scheme: z.string().default('Bearer').describe('Prefix before the token in auth_header ("" = the bare token).'),
    auth_token_env: z
      .string()
      .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, { message: 'must be an environment variable name' })
      .nullable()
      .default(null)
      .describe(
        'Name of the environment variable holding the token (the token itself is never in the config); null = no auth.',
      ),
    timeout_ms: posInt().default(30000).describe('Per-request timeout.'),
    max_retries: nonNegInt().default(5).describe('Retries of a failed request (exponential backoff with jitter).'),
    backoff_initial_ms: posInt().default(200).describe('First retry delay.'),
    backoff_max_ms: posInt().default(10000).describe('Largest retry delay.'),
    concurrency_per_server: posInt().default(4).describe('In-flight requests per server.'),
    batch_size: posInt().default(1).describe('Trajectories per request (1 = the server does not accept batches).'),
    breaker: section(
      {
        failure_threshold: posInt().default(5).describe('Consecutive failures that open a server’s circuit.'),
        reset_timeout_ms: posInt().default(10000).describe('Time an open circuit waits before probing.'),
        probe_interval_ms: posInt().default(2000).describe('Interval between probes of an open circuit.'),
      },
      'Per-server circuit breaker.',
    ),
    batch_budget_ms: posInt()
      .default(600000)
      .describe('Time budget to score one step’s batch before reward.on_failure applies to the rest.'),
  },
  'HTTP reward servers.',
);

const rewardModelSchema = section(
  {
    path: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe('ONNX reward model (scorer) file; required when reward.type = model.'),
    transform: z.enum(['none', 'sigmoid']).default('none').describe('Transform applied to the raw score.'),
    scale: z.number().default(1.0).describe('Reward = scale · transform(score).'),
    threshold: z
      .number()
      .nullable()
      .default(null)
      .describe('If set, reward = 1 when scale · transform(score) ≥ threshold, else 0.'),
  },
  'ONNX reward model.',
);

const rewardSchema = section(
  {
    type: z
      .enum(REWARD_TYPES)
      .default('function')
      .describe('function: a built-in or user function; remote: HTTP reward servers; model: an ONNX scorer.'),
    reward_fn: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        'Built-in reward function (e.g. number_game, exact_match, format, arithmetic, gsm8k); null → data.task’s reward when data.task is set.',
      ),
    reward_fn_path: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        "User reward module (JS/TS, or Python when the path ends in .py: see reward_fn_name, reward_fn_form, python), instead of reward_fn: a JS/TS module's default (or `reward`) export is called with {prompt, response, ground_truth, data_source, extra_info, kwargs}, or else its `compute_score` export verl-style as compute_score(data_source, solution_str, ground_truth, extra_info, kwargs); it returns a number, {score, …} or {reward, metrics} (docs/rewards.md). A relative path in the config file resolves against the file's directory.",
      ),
    reward_fn_kwargs: z
      .record(z.string(), z.unknown())
      .default(() => ({}))
      .describe('Keyword arguments passed to the reward function.'),
    timeout_s: z
      .number()
      .positive()
      .default(30)
      .describe(
        'Time limit per call of a reward function (reward_fn, reward_fn_path), which runs in a worker thread (Python: a worker process; the batch form: per call of the batch): a call that takes longer is a recorded reward failure (HTTP servers: reward.remote.timeout_ms).',
      ),
    on_failure: z
      .enum(['retry', 'drop_group', 'stop'])
      .default('retry')
      .describe('A trajectory whose reward failed: retry it later, drop its prompt group, or stop the run.'),
    max_retries_later: nonNegInt()
      .default(3)
      .describe('on_failure = retry: later attempts before the group is dropped.'),
    reward_fn_name: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        'Function to call in reward_fn_path (verl custom_reward_function.name, EasyR1 reward_function_name); null → compute_score for a Python module, the default/`reward`/`compute_score` export for a JS/TS module (a name given there is called verl-style).',
      ),
    reward_fn_form: z
      .enum(['verl', 'easyr1_batch', 'easyr1_sequential', 'mtrl'])
      .default('verl')
      .describe(
        "How a Python reward function (reward_fn_path ending in .py) is called: verl — fn(data_source, solution_str, ground_truth, extra_info, **reward_fn_kwargs) per sample, returning a number or {score, …}; easyr1_batch — fn([{response, response_length, ground_truth, prompt, data_source, extra_info, images?}, …]) returning [{overall, …}, …]; easyr1_sequential — the same dict per sample, returning {overall, …}; mtrl — fn(data_dict) with the same keys, returning (reward, metrics). Images reach the function as PNG file paths (verl: extra_info['images']).",
      ),
    python: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        'Python interpreter for a .py reward_fn_path: a path (e.g. .venv/bin/python; relative to the config file like the other paths) or a name looked up on PATH; null → python3 on PATH. Checked at start: missing, or the module or function missing, stops the start with one line.',
      ),
    python_workers: posInt()
      .nullable()
      .default(null)
      .describe(
        'Long-lived Python worker processes scoring a .py reward_fn_path in parallel (each imports the module once); null → min(4, CPU cores).',
      ),
    remote: remoteSchema,
    model: rewardModelSchema,
  },
  'Reward computation.',
);

// ---------------------------------------------------------------------------------------------
// trainer

const trainerSchema = section(
  {
    total_epochs: posInt().default(1).describe('Passes over the training data.'),
    max_steps: posInt()
      .nullable()
      .default(null)
      .describe('Stop after this many steps (verl total_training_steps); null = total_epochs.'),
    val_freq: offOrPosInt().default(-1).describe('Validate every val_freq steps (-1 = off).'),
    val_before_train: z.boolean().default(true).describe('Validate the initial policy before the first step.'),
    val_only: z
      .boolean()
      .default(false)
      .describe(
        'Only validate, do not train: one validation round of the initial policy (actor.model.path, or trainer.load_checkpoint_path: a model directory, or a checkpoint global_step_N, whose actor/ is evaluated).',
      ),
    val_generations_to_log: nonNegInt()
      .default(3)
      .describe('Validation samples (prompt, response, reward) logged per validation round.'),
    save_freq: offOrPosInt()
      .default(-1)
      .describe(
        'Save a checkpoint every save_freq steps; -1 = only the final checkpoint at the end of training (the final one is always saved).',
      ),
    save_limit: offOrPosInt()
      .default(-1)
      .describe('Keep at most this many checkpoints (oldest removed first); -1 = unlimited.'),
    keep_policy_versions: nonNegInt()
      .default(0)
      .describe(
        'Stored policy versions (weights, and the critic and EMA versions beside them; a version kept in memory only, policy.version_files, is no file to keep) kept beyond those still needed. The update stage prunes every version that is not: the newest two, the reference (v0), one a kept checkpoint links, one a validation round still evaluates, or one within pipeline.max_staleness of the newest (a rollout may still sample with it); 0 keeps only those. Raise it to keep the last N versions as well.',
      ),
    find_last_checkpoint: z
      .boolean()
      .default(true)
      .describe('Resume from the newest checkpoint in run_dir when there is one.'),
    resume_with_changed_config: z
      .boolean()
      .default(false)
      .describe(
        'Resuming a run whose config differs from the one it was started with is refused, listing the keys; true accepts the changes that keep the stored state meaningful (e.g. actor.optim.lr, rollout.temperature, algorithm.kl_coef). Changes of the dataset position (data.rollout_batch_size, train_files, seed, shuffle), rollout.n, the model architecture or tokenizer, the advantage estimator or the log layout are refused either way. Run length, validation and save frequency, logging, threads and devices may always change (a finished run is extended by raising trainer.total_epochs or max_steps).',
      ),
    load_checkpoint_path: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        "Start a new run from this checkpoint (<run_dir>/checkpoints/global_step_N: policy weights + AdamW state, step, dataset position, LR and KL state; wins over find_last_checkpoint), or from a plain model directory (weights only, step 0). With critic.enable (e.g. adv_estimator gae) the critic's weights and AdamW state are restored from the checkpoint's critic/ too; a checkpoint without a critic is refused unless critic.model.path names a value model to start the critic from.",
      ),
    project_name: safeName().default('rlstream').describe('Project name (logs, run id).'),
    experiment_name: safeName().default('default').describe('Experiment name (logs, run id, run_dir).'),
    logger: z
      .array(z.enum(['console', 'tensorboard']))
      .default(['console'])
      .describe(
        'Metric sinks: console (progress bar or JSON lines, and the summary) and tensorboard (event files under <run_dir>/tensorboard/, appended live as steps finish — by the controller process in distributed mode — and identical to `rlstream report --tensorboard` at the end of a completed run).',
      ),
    run_dir: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        "Directory for checkpoints, logs and the embedded store; null → runs/<experiment_name> (under the working directory). A relative path in the config file resolves against the file's directory (on the command line: against the working directory).",
      ),
    seed: z.int().default(1).describe('Seed for everything not seeded elsewhere (sampling, dropout of groups, ids).'),
  },
  'Training loop, validation, checkpoints and naming.',
);

// ---------------------------------------------------------------------------------------------
// sft

const sftSchema = section(
  {
    epochs: posInt()
      .default(1)
      .describe('`rlstream sft`: passes over the training rows (data.train_files); trainer.max_steps caps the steps.'),
    max_length: posInt()
      .default(1024)
      .describe(
        '`rlstream sft`: longest example (prompt + response tokens, after the chat template); a longer row is a bad row (data.on_bad_row: stop names its file:line, skip reports it). With packing, the length of a packed row.',
      ),
    packing: z
      .boolean()
      .default(false)
      .describe(
        "`rlstream sft`: concatenate examples (in the epoch's order) into rows of at most max_length tokens instead of one padded example per row. Positions run on across the row and a token attends to the earlier examples of its row (the training graph has no block-diagonal mask); each example's loss is still on its own response tokens. actor.global_batch_size then counts packed rows.",
      ),
    prompt_key: z
      .string()
      .min(1)
      .default('prompt')
      .describe(
        '`rlstream sft`: field holding the prompt (a string, or chat messages [{role, content}]); dotted paths reach nested fields.',
      ),
    response_key: z
      .string()
      .min(1)
      .default('response')
      .describe('`rlstream sft`: field holding the response (a string) the loss is on, for prompt + response rows.'),
    messages_key: z
      .string()
      .min(1)
      .default('messages')
      .describe(
        '`rlstream sft`: field holding a conversation [{role, content}] (a row with it needs no prompt/response); the loss is on every assistant turn.',
      ),
    cfg_dropout: probability()
      .default(0.1)
      .describe(
        "`rlstream sft` of an image policy: probability that a training image's prompt is replaced by the null prompt (the class table's last row), so that the model also learns the unconditional velocity that classifier-free guidance (algorithm.image.cfg_scale, `rlstream generate --cfg-scale`) steers away from; 0 = never (guidance then has an untrained null prompt). 0.1 is DiT's class dropout (Peebles & Xie 2023). Drawn per image from the step's seeded stream, so a resumed run drops the same ones.",
      ),
  },
  'Supervised fine-tuning (`rlstream sft`): data keys, epochs, lengths and packing. The model, optimizer, LR schedule and batch sizes are actor.* (actor.global_batch_size examples per optimizer step, actor.micro_batch_size_per_device_for_update per forward/backward pass), the data files, shuffling and rendering data.*, checkpoints and logging trainer.*.',
);

// ---------------------------------------------------------------------------------------------
// policy

/** Dtypes a policy version's weights are stored in (policy.dtype). */
export const POLICY_DTYPES = ['f32', 'bf16'] as const;
export type PolicyDtype = (typeof POLICY_DTYPES)[number];

/** Which policy versions are written as files (policy.version_files; auto: by where the rollout runs). */
export const VERSION_FILES = ['auto', 'every_step', 'checkpoints'] as const;
/** policy.version_files as applied (auto resolved). */
export type VersionFiles = Exclude<(typeof VERSION_FILES)[number], 'auto'>;

const policySchema = section(
  {
    dtype: z
      .enum(POLICY_DTYPES)
      .default('f32')
      .describe(
        "Dtype of the policy versions' weights, which the rollout samples with: f32 = the trainer's weights exactly; bf16 = rounded to bfloat16 (nearest, ties to even), half the bytes of the weights written and read per version; the KL reference (version 0) is read as stored too. The trainer keeps f32 master weights and f32 optimizer state either way (a version's optimizer.safetensors holds the f32 masters training resumes from). With bf16 the sampler's log-probs differ from the trainer's: rollout/logprob_mismatch_abs_mean and rollout/logprob_mismatch_abs_max report by how much (with f32 only f32 rounding, ~1e-7). Full fine-tuning only (a LoRA policy's versions are its adapters).",
      ),
    version_files: z
      .enum(VERSION_FILES)
      .default('auto')
      .describe(
        "Which policy versions the update stage writes to the policy store. every_step: every version (each is a file other processes read: `rlstream serve <stage>`, `rlstream serve-policy <run dir>` following every version). checkpoints: a full policy's version is handed to the rollout in memory and written only where a file is needed: a checkpoint step (trainer.save_freq, the last step) and the pipeline.max_staleness versions before it (a restart's rollout may still sample with them), and a version a validation round samples with; the others exist in memory only and are named by the sha256 of the bytes they would be written as (a resume re-trains them from the log: docs/durability.md). auto: checkpoints when the rollout runs in the update stage's process (`rlstream train` with one rollout replica), every_step for `rlstream serve update` and `rlstream replay`. A LoRA policy's versions (small adapters), an image policy's (model directories) and those an inference engine samples with (rollout.engine other than onnx) are written every step either way.",
      ),
  },
  'Policy versions: what the update stage stores for the rollout to sample with.',
);

// ---------------------------------------------------------------------------------------------
// pipeline

const pipelineSchema = section(
  {
    bus: z
      .enum(['embedded', 'kafka'])
      .default('embedded')
      .describe('Event transport: embedded (in-process log in the store) or kafka.'),
    brokers: z.array(z.string().min(1)).default([]).describe('Kafka brokers host:port; required when bus = kafka.'),
    topic_prefix: z
      .string()
      .regex(/^[A-Za-z0-9._-]+$/, { message: "may contain only letters, digits, '.', '_' and '-'" })
      .default('rlstream')
      .describe('Prefix of every topic name.'),
    partitions: posInt().default(1).describe('Partitions per topic when topics are created.'),
    store: z
      .enum(['embedded', 'postgres'])
      .default('embedded')
      .describe('Tables and event log: embedded (PGlite under run_dir) or postgres.'),
    database_url: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe('postgres:// URL; required when store = postgres. A secret: its password is never printed.'),
    max_staleness: nonNegInt()
      .default(0)
      .describe('Policy versions a rollout may lag behind (0 = strictly on-policy).'),
    schema_wire_format: z
      .enum(['plain', 'confluent'])
      .default('plain')
      .describe('Avro framing on Kafka: plain, or confluent (magic byte + schema id; needs schema_registry_url).'),
    schema_registry_url: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe('Confluent schema registry URL (schema_wire_format = confluent).'),
    kafka: section(
      {
        idempotent: z.boolean().default(true).describe('Idempotent producer (requires acks = all).'),
        acks: z
          .union([z.literal('all'), z.literal(-1), z.literal(0), z.literal(1)])
          .default('all')
          .describe('Producer acknowledgements: all (= -1), 1 (leader) or 0 (none).'),
        session_timeout_ms: posInt().default(6000).describe('Consumer group session timeout.'),
        heartbeat_interval_ms: posInt()
          .default(500)
          .describe('Consumer heartbeat interval (below session_timeout_ms).'),
        max_wait_ms: nonNegInt()
          .default(25)
          .describe(
            "Longest a fetch waits for data. A broker answers a waiting fetch as soon as data arrives, but one that does not (librdkafka's mock) holds it this long, and a training step crosses six topics, so keep it short; raise it to cut idle fetch requests.",
          ),
        sasl: section(
          {
            mechanism: z
              .enum(['none', 'plain', 'scram-sha-256', 'scram-sha-512'])
              .default('none')
              .describe(
                'SASL authentication (kafkajs): none, plain (Confluent Cloud API keys, Event Hubs), scram-sha-256 or scram-sha-512 (Strimzi KafkaUser type scram-sha-512, MSK SASL/SCRAM). MSK IAM and OAUTHBEARER are not supported.',
              ),
            username: z
              .string()
              .min(1)
              .nullable()
              .default(null)
              .describe('SASL user name; null → the variable named by username_env.'),
            username_env: z
              .string()
              .min(1)
              .default('KAFKA_USERNAME')
              .describe(
                'Environment variable holding the user name when username is null (a Kubernetes Secret as env).',
              ),
            password_env: z
              .string()
              .min(1)
              .default('KAFKA_PASSWORD')
              .describe(
                'Environment variable holding the SASL password (a Kubernetes Secret as env); the password is never in the config.',
              ),
          },
          'SASL authentication to Kafka.',
        ),
        tls: section(
          {
            enabled: z
              .boolean()
              .default(false)
              .describe(
                "Connect over TLS (the brokers' TLS listener, e.g. 9093; SASL_SSL with sasl set). Automatically on when ca_file or cert_file is set.",
              ),
            ca_file: z
              .string()
              .min(1)
              .nullable()
              .default(null)
              .describe(
                "PEM file of the CA that signed the brokers' certificates (Strimzi: the <cluster>-cluster-ca-cert Secret's ca.crt); null → the system CAs.",
              ),
            cert_file: z
              .string()
              .min(1)
              .nullable()
              .default(null)
              .describe(
                'PEM client certificate for mutual TLS (Strimzi KafkaUser type tls: user.crt); needs key_file.',
              ),
            key_file: z
              .string()
              .min(1)
              .nullable()
              .default(null)
              .describe('PEM private key of cert_file (Strimzi: user.key).'),
            servername: z
              .string()
              .min(1)
              .nullable()
              .default(null)
              .describe('TLS server name (SNI) to verify instead of the broker host name.'),
            reject_unauthorized: z
              .boolean()
              .default(true)
              .describe('Refuse brokers whose certificate does not verify; false only for testing.'),
          },
          'TLS to Kafka.',
        ),
      },
      'Kafka client settings.',
    ),
    policy_store: z
      .enum(['filesystem', 'postgres', 's3'])
      .default('filesystem')
      .describe(
        "Where policy versions (and critic and EMA versions) live: filesystem (<run_dir>/policy/vNNNNNN; in distributed mode run_dir must be a volume shared by the stages), postgres (bytea chunks in the run's database, pipeline.store = postgres; for small models) or s3 (objects in an S3-compatible bucket, pipeline.s3; for large models: docs/kubernetes.md). postgres and s3: each process keeps a local cache under pipeline.policy_cache_dir, so no stage needs a shared volume.",
      ),
    policy_cache_dir: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        'policy_store = postgres or s3: local directory where a process caches the versions it read (verified by sha256; safe to lose, e.g. a Kubernetes emptyDir); null → <run_dir>/policy-cache.',
      ),
    s3: section(
      {
        bucket: z
          .string()
          .min(3)
          .nullable()
          .default(null)
          .describe(
            'policy_store = s3: the bucket (it must exist). Credentials are never in the config: the SDK reads AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (a Kubernetes Secret as env), a web identity (EKS IRSA) or an instance role.',
          ),
        prefix: z
          .string()
          .default('rlstream/')
          .describe('Key prefix: objects are <prefix><run_id>/<kind>/vNNNNNN/<sha256>/<file>.'),
        endpoint: z
          .string()
          .min(1)
          .nullable()
          .default(null)
          .describe(
            'S3 API endpoint URL; null → AWS S3 in the region. MinIO: http://minio:9000; GCS: https://storage.googleapis.com (HMAC keys as the AWS_* variables).',
          ),
        region: z
          .string()
          .min(1)
          .nullable()
          .default(null)
          .describe('Region; null → AWS_REGION, else us-east-1 (MinIO and GCS accept any).'),
        force_path_style: z
          .boolean()
          .default(false)
          .describe(
            'Path-style URLs (endpoint/bucket/key) instead of virtual-hosted (bucket.endpoint/key): true for MinIO and most self-hosted stores.',
          ),
        part_size_mb: z
          .int()
          .min(5)
          .max(5120)
          .default(64)
          .describe(
            'Files larger than this are uploaded in parts of this size (multipart upload; S3 allows 5 MiB to 5 GiB per part and 10,000 parts).',
          ),
      },
      'Object storage for pipeline.policy_store = s3.',
    ),
    on_run_end: z
      .enum(['idle', 'exit'])
      .default('idle')
      .describe(
        '`rlstream serve`: what a stage does when its run has finished or failed (also when started after that): idle (stay up, say so in the log, /readyz answers 503 "run finished", metric rlstream_run_finished = 1; for Deployments, which restart exited pods) or exit (exit 0, or 1 when the run failed).',
      ),
    migrate_on_start: z
      .boolean()
      .default(false)
      .describe(
        '`rlstream serve` over PostgreSQL: apply missing migrations at start (under an advisory lock, safe from several processes) instead of waiting for `rlstream migrate` to apply them (a Job or init container). `rlstream train` always applies them.',
      ),
    http_port: z
      .int()
      .gte(0)
      .lte(65535)
      .default(9464)
      .describe(
        '`rlstream serve`: port of GET /healthz, /readyz and /metrics (0 = any free port, logged at start). --http-port overrides it.',
      ),
    grace_seconds: z
      .number()
      .gt(0)
      .default(25)
      .describe(
        "`rlstream serve`: after SIGTERM, the most seconds a stage takes to stop (stop fetching, abandon the batch in hand uncommitted, leave the consumer group, close bus and store) before it exits anyway; keep it below the pod's terminationGracePeriodSeconds (default 30). --grace-seconds overrides it. `rlstream train` / `sft`: after the first Ctrl-C or SIGTERM, the most seconds the run takes to stop (a stage still busy after half of it is left uncommitted) before the process exits anyway.",
      ),
    heartbeat_seconds: z
      .number()
      .gt(0)
      .default(5)
      .describe(
        "Over PostgreSQL (pipeline.store = postgres): every this many seconds each stage process renews its lease in table stage_heartbeats (one small upsert, off the stage's path), stamped with the database's clock.",
      ),
    lease_seconds: z
      .number()
      .gt(0)
      .default(30)
      .describe(
        'Over PostgreSQL: a stage whose last heartbeat is older than this has lost its lease; `rlstream runs --db` shows a run still marked running whose every stage lost its lease as "stale" (its processes were killed). At least twice pipeline.heartbeat_seconds; longer than the longest pause of a stage\'s event loop (a model load).',
      ),
    run_id: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/, { message: "must be 1–128 letters, digits, '.', '_' or '-'" })
      .nullable()
      .default(null)
      .describe(
        'Run id on every event, row and log line; null → derived from trainer.project_name and experiment_name (deterministic, never random).',
      ),
  },
  'Event bus, store and staleness.',
);

// ---------------------------------------------------------------------------------------------

export const configSchema = z
  .strictObject({
    data: dataSchema,
    algorithm: algorithmSchema,
    rollout: rolloutSchema,
    actor: actorSchema,
    critic: criticSchema,
    reward: rewardSchema,
    trainer: trainerSchema,
    sft: sftSchema,
    policy: policySchema,
    pipeline: pipelineSchema,
  })
  .describe('rlstream run configuration');

export type Config = z.infer<typeof configSchema>;
export type ConfigInput = z.input<typeof configSchema>;

/** The defaults, as parsed from `{}` (derived `null`s not yet filled: see `resolveDerived`). */
export function schemaDefaults(): Config {
  return configSchema.parse({});
}
