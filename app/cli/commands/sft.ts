import type { Command } from '../command.ts';
import { sftRun } from '../../sft.ts';
import { consoleRun } from './train.ts';

export const sftCommand: Command = {
  name: 'sft',
  summary:
    'Supervised fine-tuning on prompt + response (or chat) rows, or (prompt, image) rows for an image policy; checkpoints are model directories for `train`',
  usage:
    'rlstream sft <config.yaml> [a.b.c=value …] [--dialect easyr1|verl|mtrl] [--verbose] [--print-config] [--break-lock]',
  help: [
    'Next-token loss on the response (assistant) tokens only, over data.train_files (JSONL or parquet):',
    'rows with sft.prompt_key + sft.response_key, or a conversation in sft.messages_key (loss on every',
    "assistant turn), rendered through the model's chat template. The model, optimizer, LR schedule and",
    'batch sizes are actor.* as for `train` (actor.global_batch_size examples per step); sft.* sets',
    'epochs, max_length and packing. Checkpoints go to <run_dir>/checkpoints/global_step_N (every',
    'trainer.save_freq steps and at the end); the actor/ of one is a model directory that',
    '`rlstream train` takes as actor.model.path. Metrics (sft/loss, sft/token_acc, sft/lr, sft/grad_norm)',
    "go to the run's store (rlstream runs / sql / report) and, with trainer.logger including",
    'tensorboard, to <run_dir>/tensorboard. Interrupted (Ctrl-C, a kill), the same command resumes from',
    'the newest checkpoint; a finished run says so.',
    '',
    'An image policy (actor.model.kind: image; docs/image-generation.md) learns by flow matching on rows',
    'with a prompt (sft.prompt_key) and one image (data.image_key: a path relative to the data file, base64',
    "or bytes): a fresh DiT of actor.model.image's shape whose prompts are the data's, or actor.model.path;",
    'sft.cfg_dropout trains the null prompt classifier-free guidance needs.',
    '',
    'arguments:',
    '  config.yaml     run config (see docs/config.md); an EasyR1, verl or MTRL config is translated first',
    '                  (docs/dialects.md)',
    '  a.b.c=value     override, value parsed as a YAML scalar (e.g. sft.epochs=2)',
    '',
    'options:',
    '  --dialect NAME  read the config as easyr1, verl or mtrl (default: recognised by its sections)',
    '  --verbose       on a terminal, also print the info log lines (one per step)',
    '  --print-config  also print the resolved config (it is always written to <run_dir>/config.yaml)',
    "  --break-lock    take over the run directory's lock when another host holds it",
  ].join('\n'),
  async run(argv) {
    // as train: after Ctrl-C the stop message is the last line printed
    const { cfg, log, bar, stop, breakLock } = consoleRun(argv, 'sft');
    const out = await sftRun(cfg, log, { bar, signal: stop.signal, breakLock });
    bar?.finish();
    if (out.message && out.status === 'completed') console.error(out.message);
    console.log(out.summary);
    if (out.status === 'stopped') {
      console.error(
        `rlstream sft: run stopped: ${out.message ?? 'interrupted'}; run the same command again to continue`,
      );
      return stop.exitCode();
    }
    return 0;
  },
};
