/**
 * `rlstream serve-policy <model dir | run dir>`: the OpenAI-compatible policy server
 * (lib/inference/policy-server.ts). This file parses the flags and runs the server until SIGTERM/SIGINT.
 */
import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { createLogger } from '../../../lib/log.ts';
import { openServedPolicy } from '../../../lib/inference/served-policy.ts';
import { startPolicyServer } from '../../../lib/inference/policy-server.ts';

function num(flags: Record<string, string>, k: string, ok: (v: number) => boolean, what: string): number | undefined {
  if (flags[k] === undefined) return undefined;
  const v = Number(flags[k]);
  if (!Number.isFinite(v) || !ok(v)) throw new UsageError(`--${k} must be ${what}, got "${flags[k]}"`);
  return v;
}

export const servePolicyCommand: Command = {
  name: 'serve-policy',
  summary: 'Serve a policy over the OpenAI API (/v1/completions, /v1/chat/completions), following a run',
  usage:
    'rlstream serve-policy <model-dir | run-dir> [--port 8000] [--host 127.0.0.1] [--served-model-name NAME] [--chat-template FILE] [--threads N] [--max-batch-size N] [--max-body-bytes B] [--follow-ms MS] [--batch-window-ms MS] [--steps-per-run N] [--debug-temperature-scale F]',
  help: [
    'Serves /v1/completions and /v1/chat/completions (OpenAI shapes; prompts as text or token ids,',
    "vLLM's return_token_ids, top_k, stop_token_ids, request_id), /v1/models, /health, /metrics",
    "(Prometheus) and SGLang's POST /update_weights_from_disk {model_path, weight_version}.",
    'Given a run directory (<run_dir>/config.yaml and policy/), serves its newest policy version and',
    'loads each new one as the run writes it; every response says its policy_version.',
    'Requests are batched continuously: one joins the running batch at the next decode step, and',
    '`stream: true` sends each token as it is sampled. See docs/inference.md.',
    '',
    'options:',
    '  --port P                    listen port (default 8000; 0 = any free port, printed on stdout)',
    '  --host H                    listen address (default 127.0.0.1; 0.0.0.0 for every interface)',
    '  --served-model-name NAME    the `model` clients name (default: the directory name)',
    '  --chat-template FILE        a Jinja chat template for a model without one',
    '  --threads N                 ORT threads of the sampler (default 1)',
    '  --max-batch-size N          sequences decoding together at most (default 64)',
    '  --max-body-bytes B          largest request body (default 16777216)',
    '  --follow-ms MS              poll a run directory for new versions every MS (default 500; 0 = off)',
    '  --batch-window-ms MS        an idle server waits this long for more requests to batch (default 5)',
    '  --steps-per-run N           decode steps between admissions of new requests (default 1; more delay',
    '                              joins and streamed tokens up to N − 1 steps)',
    '  --debug-temperature-scale F sample at temperature × F (a deliberately mismatched engine, for',
    '                              testing rollout correction; default 1)',
  ].join('\n'),
  async run(argv) {
    const { positionals, flags } = parseArgs(argv, {
      flags: [
        'port',
        'host',
        'served-model-name',
        'chat-template',
        'threads',
        'max-batch-size',
        'max-body-bytes',
        'follow-ms',
        'batch-window-ms',
        'steps-per-run',
        'debug-temperature-scale',
      ],
    });
    if (positionals.length !== 1)
      throw new UsageError(`expected one model or run directory, got ${positionals.length}`);
    const int = (v: number) => Number.isInteger(v);
    const port = num(flags, 'port', (v) => int(v) && v >= 0 && v <= 65535, 'a port 0–65535') ?? 8000;
    const threads = num(flags, 'threads', (v) => int(v) && v >= 1, 'an integer ≥ 1') ?? 1;
    const maxBatchSize = num(flags, 'max-batch-size', (v) => int(v) && v >= 1, 'an integer ≥ 1');
    const maxBodyBytes = num(flags, 'max-body-bytes', (v) => int(v) && v >= 1024, 'an integer ≥ 1024');
    const followMs = num(flags, 'follow-ms', (v) => int(v) && v >= 0, 'an integer ≥ 0');
    const batchWindowMs = num(flags, 'batch-window-ms', (v) => v >= 0, 'a number ≥ 0');
    const stepsPerRun = num(flags, 'steps-per-run', (v) => int(v) && v >= 1, 'an integer ≥ 1');
    const temperatureScale = num(flags, 'debug-temperature-scale', (v) => v > 0, 'a number > 0');
    const { policy, initial } = await openServedPolicy(positionals[0], {
      name: flags['served-model-name'],
      chatTemplateFile: flags['chat-template'],
    });
    const log = createLogger({ runId: policy.name, stage: 'serve-policy' });
    const server = await startPolicyServer({
      policy,
      initial,
      port,
      host: flags.host,
      threads,
      maxBatchSize,
      maxBodyBytes,
      followMs,
      batchWindowMs,
      stepsPerRun,
      temperatureScale,
      log,
    });
    process.stdout.write(`serving ${policy.name} (policy version ${initial.version}) at ${server.url}\n`);
    await new Promise<void>((resolve) => {
      const stop = () => resolve();
      process.once('SIGTERM', stop);
      process.once('SIGINT', stop);
    });
    await server.close();
    return 0;
  },
};
