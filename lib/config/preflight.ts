/**
 * What can be checked before a run opens anything (`rlstream config`, `rlstream train`): the
 * files the config names exist and are complete — model directories (config.json and every
 * weight file, the shards an index names included), data files, the reward module (it is
 * imported, so a syntax error or a missing export shows here), the checkpoint to start from — and
 * the run directory can be written. One line per problem, each naming the key to fix. A run
 * refused here creates nothing (no run directory, no run row, no locked config).
 */
import { accessSync, constants, existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { resolveCriticModel, resolveRunDir, usesRewardFunction } from './checks.ts';
import type { Config } from './schema.ts';
import { errorMessage } from '../errors.ts';

const MODEL_FILE = 'model.safetensors';
const MODEL_INDEX_FILE = 'model.safetensors.index.json';

/** Problems of one Hugging Face / rlstream model directory (`key` names it in the messages). */
export function modelDirProblems(key: string, dir: string): string[] {
  if (!existsSync(dir)) return [`${key}: ${dir} does not exist`];
  if (!statSync(dir).isDirectory()) return [`${key}: ${dir} is not a directory (give the model's directory)`];
  try {
    accessSync(dir, constants.R_OK | constants.X_OK);
  } catch {
    return [`${key}: ${dir} is not readable by this user (uid ${process.getuid?.() ?? '?'})`];
  }
  const cfg = join(dir, 'config.json');
  if (!existsSync(cfg) && existsSync(join(dir, 'adapter_config.json')))
    return [
      `${key}: ${dir} is a LoRA adapter (PEFT adapter_config.json, no config.json), not a full model; merge it into its base with \`rlstream export ${dir} --merge --out DIR\` and give DIR as ${key} (with actor.model.lora to train a new adapter on the merged model)`,
    ];
  const out: string[] = [];
  if (!existsSync(cfg)) out.push(`${key}: ${dir} has no config.json (not a model directory, or a partial copy)`);
  else {
    try {
      JSON.parse(readFileSync(cfg, 'utf8'));
    } catch (e) {
      out.push(`${key}: ${cfg} is not valid JSON (${errorMessage(e)}); a partial copy?`);
    }
  }
  const single = join(dir, MODEL_FILE),
    index = join(dir, MODEL_INDEX_FILE);
  if (existsSync(single)) {
    if (statSync(single).size < 8) out.push(`${key}: ${single} is truncated (${statSync(single).size} bytes)`);
  } else if (existsSync(index)) {
    try {
      const map = (JSON.parse(readFileSync(index, 'utf8')) as { weight_map?: Record<string, string> }).weight_map;
      if (!map || typeof map !== 'object') out.push(`${key}: ${index} has no "weight_map"`);
      else {
        const missing = [...new Set(Object.values(map).map(String))].filter((f) => !existsSync(join(dir, f)));
        if (missing.length)
          out.push(
            `${key}: ${dir} lacks ${missing.length} of the shards ${MODEL_INDEX_FILE} names: ${missing.slice(0, 4).join(', ')}${missing.length > 4 ? ', …' : ''} (an incomplete download?)`,
          );
      }
    } catch (e) {
      out.push(`${key}: ${index} is not valid JSON (${errorMessage(e)})`);
    }
  } else {
    out.push(`${key}: ${dir} has neither ${MODEL_FILE} nor ${MODEL_INDEX_FILE} (the weights are missing)`);
  }
  return out;
}

function fileProblems(key: string, path: string): string[] {
  if (!existsSync(path)) return [`${key}: ${path} does not exist`];
  try {
    accessSync(path, constants.R_OK);
  } catch {
    return [`${key}: ${path} is not readable by this user`];
  }
  return [];
}

/** The nearest existing directory at or above `dir`, and whether this process may create/write there. */
export function runDirProblems(dir: string): string[] {
  let d = resolve(dir);
  while (!existsSync(d) && dirname(d) !== d) d = dirname(d);
  if (!statSync(d).isDirectory()) return [`trainer.run_dir: ${d} is a file, not a directory`];
  try {
    accessSync(d, constants.W_OK | constants.X_OK);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EROFS')
      return [
        `trainer.run_dir: ${resolve(dir)} is on a read-only file system (EROFS); remount it read-write or choose another trainer.run_dir`,
      ];
    return [
      `trainer.run_dir: ${resolve(dir)} cannot be ${d === resolve(dir) ? 'written' : `created (${d} is not writable)`} by this user; choose a writable trainer.run_dir`,
    ];
  }
  return [];
}

/** Every problem found, one line each (empty: nothing found to stop the run before it starts). */
export async function preflightProblems(cfg: Config): Promise<string[]> {
  const out: string[] = [];
  if (cfg.actor.model.path) out.push(...modelDirProblems('actor.model.path', cfg.actor.model.path));
  if (cfg.critic.enable && cfg.critic.model.path) {
    const critic = resolveCriticModel(cfg).path;
    if (critic) out.push(...modelDirProblems('critic.model.path', critic));
  }
  const files = (v: string | string[] | null | undefined) => (v == null ? [] : Array.isArray(v) ? v : [v]);
  for (const f of files(cfg.data.train_files)) out.push(...fileProblems('data.train_files', f));
  for (const f of files(cfg.data.val_files)) out.push(...fileProblems('data.val_files', f));
  if (cfg.reward.model.path) out.push(...fileProblems('reward.model.path', cfg.reward.model.path));
  if (cfg.trainer.load_checkpoint_path && !existsSync(cfg.trainer.load_checkpoint_path))
    out.push(`trainer.load_checkpoint_path: ${cfg.trainer.load_checkpoint_path} does not exist`);
  if (cfg.reward.reward_fn_path && usesRewardFunction(cfg)) {
    const p = fileProblems('reward.reward_fn_path', cfg.reward.reward_fn_path);
    if (p.length) out.push(...p);
    else if (!/\.py$/i.test(cfg.reward.reward_fn_path)) {
      // (a Python module is checked by its own worker before the run: lib/reward-fns' checkPythonReward)
      const { loadRewardModule } = await import('../reward-fns/index.ts');
      try {
        await loadRewardModule(cfg.reward.reward_fn_path, cfg.reward.reward_fn_name);
      } catch (e) {
        out.push(errorMessage(e).split('\n')[0]);
      }
    }
  }
  out.push(...runDirProblems(resolveRunDir(cfg)));
  return out;
}
