/**
 * "Did you mean" for unknown keys and enum values: optimal-string-alignment edit distance
 * (Levenshtein plus adjacent transpositions), and a short table of verl/EasyR1 keys whose
 * rlstream name differs.
 */

/** Edit distance with insertions, deletions, substitutions and adjacent transpositions. */
export function editDistance(a: string, b: string): number {
  const m = a.length,
    n = b.length;
  if (m === 0) return n;
  if (n === 0) return m;
  const d: number[][] = Array.from({ length: m + 1 }, (_, i) => {
    const row = new Array<number>(n + 1).fill(0);
    row[0] = i;
    return row;
  });
  for (let j = 0; j <= n; j++) d[0][j] = j;
  for (let i = 1; i <= m; i++) {
    for (let j = 1; j <= n; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[m][n];
}

/** Largest distance still considered a typo of a word of this length. */
function tolerance(word: string): number {
  return Math.max(1, Math.floor(word.length / 3));
}

/**
 * The candidate closest to `word` within typo tolerance (ties: the earlier candidate), or null.
 * Case differences count as half an edit, so `LR` finds `lr`.
 */
export function closest(word: string, candidates: readonly string[]): string | null {
  let best: string | null = null,
    bestD = Infinity;
  for (const c of candidates) {
    const d = c.toLowerCase() === word.toLowerCase() ? 0.5 : editDistance(word.toLowerCase(), c.toLowerCase());
    if (d < bestD) {
      best = c;
      bestD = d;
    }
  }
  return best !== null && bestD <= tolerance(word) ? best : null;
}

/**
 * verl/EasyR1 keys that rlstream names differently (full dotted path → hint). Checked before the
 * edit-distance suggestion, since e.g. `algorithm.kl_loss_coef` is one edit from nothing useful.
 */
export const RENAMED_KEYS: Readonly<Record<string, string>> = {
  'data.train_batch_size': 'data.rollout_batch_size',
  'data.val_max_samples': 'data.max_rows',
  'data.max_samples': 'data.max_rows',
  'algorithm.kl_loss_coef': 'algorithm.kl_coef (one coefficient for the KL loss and the KL penalty)',
  'actor.kl_loss_coef': 'algorithm.kl_coef (one coefficient for the KL loss and the KL penalty)',
  'actor.use_kl_loss': 'algorithm.use_kl_loss',
  'actor.kl_loss_type': 'algorithm.kl_loss_type',
  'algorithm.kl_ctrl': 'algorithm.kl_type, algorithm.kl_coef, algorithm.kl_target and algorithm.kl_horizon',
  'actor.clip_ratio': 'actor.clip_ratio_low and actor.clip_ratio_high',
  'actor.clip_ratio_c': 'actor.clip_ratio_dual',
  'actor.ppo_mini_batch_size': 'actor.global_batch_size (in samples, i.e. prompts × rollout.n)',
  'actor.ppo_micro_batch_size_per_gpu': 'actor.micro_batch_size_per_device_for_update',
  'actor.log_prob_micro_batch_size_per_gpu': 'actor.micro_batch_size_per_device_for_experience',
  'actor.optim.lr_warmup_steps_ratio': 'actor.optim.lr_warmup_ratio',
  'actor.optim.warmup_style': 'actor.optim.lr_scheduler',
  'actor.optim.clip_grad': 'actor.optim.max_grad_norm',
  'actor.max_grad_norm': 'actor.optim.max_grad_norm',
  'actor.grad_clip': 'actor.optim.max_grad_norm',
  'rollout.val_kwargs': 'rollout.val_override',
  'trainer.test_freq': 'trainer.val_freq',
  'trainer.total_training_steps': 'trainer.max_steps',
  'trainer.max_actor_ckpt_to_keep': 'trainer.save_limit',
  'trainer.resume_from_path': 'trainer.load_checkpoint_path',
  'trainer.default_local_dir': 'trainer.run_dir',
  'trainer.save_checkpoint_path': 'trainer.run_dir',
  'trainer.val_generations_to_log_to_wandb': 'trainer.val_generations_to_log',
  'trainer.log_val_generations': 'trainer.val_generations_to_log',
  'critic.cliprange': 'critic.cliprange_value',
};
