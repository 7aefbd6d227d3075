import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { createLogger } from '../../../lib/log.ts';
import { replayRun } from '../../replay.ts';

function interruptSignal(): AbortSignal {
  const ac = new AbortController();
  const on = () => ac.abort();
  process.once('SIGINT', on);
  process.once('SIGTERM', on);
  return ac.signal;
}

/** `rlstream replay --from <run> [--until-step N] [a.b=c …]` (app/replay.ts). */
export const replayCommand: Command = {
  name: 'replay',
  summary:
    "Re-run the reward, advantage and update stages over a run's recorded trajectories into a new run (generates nothing)",
  usage: 'rlstream replay --from <run-dir | run-id> [--until-step N] [a.b.c=value …]',
  help: [
    'Copies the training trajectories of a run into a new run (new run id and run_dir, its own tables',
    "and topics; runs.parent_run_id names the source) and trains on them with the source's config plus",
    'the overrides — e.g. algorithm.adv_estimator=rloo against the original GRPO on identical rollouts,',
    'or another reward.reward_fn. Nothing is generated. With the original config the replay reproduces',
    "the source's checkpoints exactly. Samples count as on-policy only while the replay's policy has the",
    "source's exact bytes; after that the importance ratio uses the recorded behaviour log-probs.",
    'Running the same command again resumes (or reports) the same replay. See docs/durability.md.',
    '',
    'options:',
    '  --from RUN       an embedded run directory (with db/), or a run id stored in the PostgreSQL named',
    '                   by pipeline.store=postgres pipeline.database_url=… (and its pipeline.bus/brokers)',
    '  --until-step N   replay steps 1..N only',
    "  a.b.c=value      override of the source's config (pipeline.run_id / trainer.run_dir name the new run;",
    '                   default <source>.replay-<hash of the overrides> next to the source)',
    '',
    'example:',
    '  rlstream replay --from runs/number-game algorithm.adv_estimator=rloo',
    '  rlstream sql runs/number-game.replay-1a2b3c4d "select * from v_checkpoint_lineage"',
  ].join('\n'),
  async run(argv) {
    const { positionals, flags } = parseArgs(argv, { flags: ['from', 'until-step'] });
    if (!flags.from) throw new UsageError('missing --from <run-dir | run-id>');
    for (const o of positionals)
      if (!o.includes('=')) throw new UsageError(`expected an override a.b.c=value, got "${o}"`);
    let untilStep: number | undefined;
    if (flags['until-step'] !== undefined) {
      untilStep = Number(flags['until-step']);
      if (!Number.isInteger(untilStep) || untilStep < 1)
        throw new UsageError(`--until-step must be a positive integer, got ${flags['until-step']}`);
    }
    const out = await replayRun({
      from: flags.from,
      untilStep,
      overrides: positionals,
      log: (runId) => createLogger({ runId }),
      signal: interruptSignal(),
      onWarning: (m) => console.error(`warning: ${m}`),
    });
    console.log(out.summary);
    console.log(
      `replay ${out.runId} of ${out.sourceRunId}: ${out.status}, step ${out.finalStep}${out.finalSha256 ? `, policy sha256 ${out.finalSha256}` : ''}`,
    );
    if (out.status !== 'completed') {
      console.error(`rlstream replay: ${out.status}${out.message ? `: ${out.message}` : ''}`);
      return 1;
    }
    return 0;
  },
};
