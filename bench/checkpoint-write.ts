/**
 * A checkpoint directory at the SmolLM2-135M shape (f32 version, AdamW state, v0 as reference),
 * built by writeCheckpointDir with the linked files' sha256 read back from disk against taken from
 * the policy store's record (`known`), interleaved, RLSTREAM_BENCH_CKPT_ITERS times each (default 3):
 * the median wall time of each and their ratio.
 * `node --import tsx bench/checkpoint-write.ts`
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { formatTable } from '../lib/console/progress.ts';
import { modelConfig } from '../lib/model/config.ts';
import { initWeights } from '../lib/model/init.ts';
import { saveCheckpoint, saveOptimizer, type WrittenFile } from '../lib/model/checkpoint.ts';
import { zerosLikeWeights } from '../lib/model/params.ts';
import { writeCheckpointDir, TRAINER_STATE_FORMAT } from '../lib/pipeline/checkpoints.ts';
import { REAL_SHAPES } from './model.ts';

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

export async function run(): Promise<Array<[string, number, string]>> {
  const iters = Number(process.env.RLSTREAM_BENCH_CKPT_ITERS ?? 3);
  const c = modelConfig(REAL_SHAPES.find((x) => x.name === 'smollm2_135m')!.config);
  const root = mkdtempSync(join(tmpdir(), 'rlstream-ckpt-bench-'));
  try {
    const w = initWeights(c, 1);
    const known: Record<string, string> = {};
    const add = (sub: string, files: WrittenFile[]) => {
      for (const f of files) known[`${sub}/${f.name}`] = f.sha256;
    };
    add('actor', (await saveCheckpoint(join(root, 'v1'), c, w)).files);
    add('reference', (await saveCheckpoint(join(root, 'v0'), c, w)).files);
    const state = { step: 1, expAvg: zerosLikeWeights(c), expAvgSq: zerosLikeWeights(c) };
    add('actor', await saveOptimizer(join(root, 'opt1'), c, state));
    const times: Record<'read back' | 'recorded', number[]> = { 'read back': [], recorded: [] };
    for (let i = 0; i < iters; i++)
      for (const mode of ['read back', 'recorded'] as const) {
        const runDir = join(root, `run-${mode === 'recorded' ? 'k' : 'r'}${i}`);
        const ts = {
          format: TRAINER_STATE_FORMAT,
          run_id: 'bench',
          step: 1,
          policy_version: 1,
          sha256: known['actor/model.safetensors'],
          dataset_position: { epoch: 0, index: 0, train_size: 1, seed: 1 },
          consumed_offsets: {},
          rng_state: { seed: 1 },
          kl_ctl_state: { value: 0 },
          lr_state: {},
        } as unknown as Parameters<typeof writeCheckpointDir>[1];
        const t0 = performance.now();
        await writeCheckpointDir(
          runDir,
          ts,
          join(root, 'v1'),
          join(root, 'v0'),
          null,
          {
            actor: join(root, 'opt1'),
            critic: null,
          },
          mode === 'recorded' ? known : {},
        );
        times[mode].push((performance.now() - t0) / 1000);
        rmSync(runDir, { recursive: true, force: true });
      }
    const r = median(times['read back']),
      k = median(times.recorded);
    return [
      ['135M checkpoint directory, files_sha256 read back (median)', r, 's'],
      ['135M checkpoint directory, files_sha256 from the store record (median)', k, 's'],
      ['ratio read back ÷ recorded', r / k, '×'],
    ];
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const rows = await run();
  console.log(
    `load average ${loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
  );
  console.log(formatTable([['measure', 'value', 'unit'], ...rows]));
}
