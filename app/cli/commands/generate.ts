import { parse as parseYaml } from 'yaml';
import type { Command } from '../command.ts';
import { parseArgs, UsageError } from '../command.ts';
import { isAdapterDir, loadCheckpoint } from '../../../lib/model/checkpoint.ts';
import { stopTokenIds } from '../../../lib/model/config.ts';
import { Sampler } from '../../../lib/model/sample.ts';
import { Scorer } from '../../../lib/model/score.ts';
import { modelDirTokenizer, type ModelTokenizer } from '../../../lib/pipeline/policy.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { loadMergedAdapter, modelDirOf } from './export.ts';
import {
  decodePixels,
  imageBytes,
  ImageError,
  prepareImage,
  IMAGE_RESAMPLES,
  type ImageResample,
} from '../../../lib/data/images.ts';
import type { ImagePixels } from '../../../lib/model/vision.ts';
import { IMAGE_MARK, imagePromptIds } from '../../../lib/pipeline/images.ts';
import type { ModelConfig } from '../../../lib/model/config.ts';
import { readImageProcessor, type ImageProcessorConfig } from '../../../lib/model/processor.ts';
import { isDitDir } from '../../../lib/image/checkpoint.ts';
import { generateImage } from '../../../lib/image/generate.ts';
import { writeFileSync } from 'node:fs';

/**
 * The --image file resized as the pipeline does (Qwen2-VL smart_resize to the patch × merge grid;
 * min/max pixels from --min-pixels / --max-pixels, else the directory's preprocessor_config.json).
 */
async function loadImage(
  path: string,
  c: ModelConfig,
  flags: Record<string, string>,
  processor: ImageProcessorConfig | null,
): Promise<ImagePixels> {
  const v = c.vision!;
  const factor = v.patchSize * v.spatialMergeSize;
  const minPixels =
    num(flags, 'min-pixels', (x) => Number.isInteger(x) && x > 0, 'a positive integer') ??
    processor?.minPixels ??
    factor * factor;
  const maxPixels =
    num(
      flags,
      'max-pixels',
      (x) => Number.isInteger(x) && x >= minPixels,
      `an integer ≥ --min-pixels (${minPixels})`,
    ) ?? (processor && processor.maxPixels >= minPixels ? processor.maxPixels : Math.max(1003520, minPixels));
  const resample = (flags.resample ?? 'bicubic') as ImageResample;
  if (!IMAGE_RESAMPLES.includes(resample))
    throw new UsageError(`--resample must be one of ${IMAGE_RESAMPLES.join(', ')}, got "${flags.resample}"`);
  try {
    const img = await prepareImage(imageBytes(path, process.cwd()), { factor, minPixels, maxPixels, resample });
    return await decodePixels(img.png);
  } catch (e) {
    if (e instanceof ImageError) throw new ConfigError(`--image ${path} ${e.message}`);
    throw e;
  }
}

/** --chat-template-kwargs: a YAML (or JSON) mapping, e.g. `{enable_thinking: false}`. */
function chatTemplateKwargs(text: string | undefined): Record<string, unknown> | null {
  if (text === undefined) return null;
  let v: unknown;
  try {
    v = parseYaml(text);
  } catch {
    v = undefined;
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v))
    throw new UsageError(`--chat-template-kwargs must be a mapping such as '{enable_thinking: false}', got "${text}"`);
  return v as Record<string, unknown>;
}

function num(
  flags: Record<string, string>,
  k: string,
  check: (v: number) => boolean,
  what: string,
): number | undefined {
  if (flags[k] === undefined) return undefined;
  const v = Number(flags[k]);
  if (!Number.isFinite(v) || !check(v)) throw new UsageError(`--${k} must be ${what}, got "${flags[k]}"`);
  return v;
}

/**
 * `rlstream generate <model-dir | checkpoint-dir> --prompt TEXT …`: one completion from a model
 * directory. Sampling defaults come from the model's generation_config.json, as in transformers'
 * generate (do_sample false → greedy); flags override them. The log-probs are of the untempered
 * distribution: sampled at temperature T ∉ {0, 1}, the response is scored again at T = 1.
 */
export const generateCommand: Command = {
  name: 'generate',
  summary: 'Generate one completion from a model directory or checkpoint (try a model before training it)',
  usage:
    'rlstream generate <model-dir | checkpoint-dir> --prompt TEXT [--image-out PATH [--steps N] [--cfg-scale W]] [--image PATH]… [--chat] [--system TEXT] [--chat-template-kwargs MAP] [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--json]',
  help: [
    'Loads a Hugging Face model directory, a policy version (<run_dir>/policy/vNNNNNN) or a run checkpoint',
    '(<run_dir>/checkpoints/global_step_N) and prints the completion of --prompt. A LoRA adapter (PEFT',
    'adapter_config.json, as a LoRA run writes) is merged into its base_model_name_or_path first.',
    '',
    'options:',
    '  --prompt TEXT          the prompt (required)',
    "  --chat                 render the prompt as a user message through the tokenizer's chat template",
    '                         (with the generation prompt added)',
    '  --system TEXT          a system message before it (with --chat)',
    '  --chat-template-kwargs MAP  extra chat-template variables as a YAML/JSON mapping (with --chat), as',
    "                         data.chat_template_kwargs in training, e.g. '{enable_thinking: false}' for Qwen3",
    '  --image PATH           an image for a vision-language model (repeat for several): resized to its patch',
    '                         grid (smart_resize, --min-pixels / --max-pixels [preprocessor_config.json, else',
    '                         patch·merge squared / 1003520], --resample [bicubic]) and placed as',
    `                         <|vision_start|><|image_pad|>…<|vision_end|> where the k-th ${IMAGE_MARK} is in the prompt,`,
    '                         else all before it',
    '  --max-new-tokens N     response length cap (default: generation_config max_new_tokens, else 256)',
    '  --temperature T        0 = greedy (default: generation_config, greedy when do_sample is false)',
    '  --top-p P              nucleus sampling threshold, 1 = off',
    '  --top-k K              top-k sampling, 0 = off',
    '  --seed S               sampling seed (default 0); the same seed gives the same completion',
    '  --image-out PATH       an image policy (config.json model_type rlstream_dit): write the PNG it draws',
    '                         for --prompt (one of its class_names) there, Euler ODE over --steps [10]',
    '                         steps from the noise of --seed',
    '  --cfg-scale W          with --image-out: classifier-free guidance v_null + W·(v_prompt − v_null) [1 = none];',
    '                         the null prompt is learnt by `rlstream sft` with sft.cfg_dropout > 0',
    '  --json                 print one JSON object as the last line: {"prompt_ids", "response_ids",',
    '                         "logprobs", "text"}; logprobs[i] = ln p(response_ids[i]) under the model\'s',
    '                         untempered distribution',
  ].join('\n'),
  async run(argv) {
    const { positionals, flags, lists, booleans } = parseArgs(argv, {
      flags: [
        'prompt',
        'system',
        'chat-template-kwargs',
        'max-new-tokens',
        'temperature',
        'top-p',
        'top-k',
        'seed',
        'image',
        'min-pixels',
        'max-pixels',
        'resample',
        'image-out',
        'steps',
        'cfg-scale',
      ],
      booleans: ['chat', 'json'],
    });
    if (positionals.length !== 1)
      throw new UsageError(`expected one model or checkpoint directory, got ${positionals.length}`);
    if (flags.prompt === undefined) throw new UsageError('--prompt TEXT is required');
    if (flags.system !== undefined && !booleans.has('chat')) throw new UsageError('--system needs --chat');
    const templateKwargs = chatTemplateKwargs(flags['chat-template-kwargs']);
    if (templateKwargs && !booleans.has('chat')) throw new UsageError('--chat-template-kwargs needs --chat');
    const maxNew = num(flags, 'max-new-tokens', (v) => Number.isInteger(v) && v > 0, 'a positive integer');
    const temperature = num(flags, 'temperature', (v) => v >= 0, 'a number ≥ 0');
    const topP = num(flags, 'top-p', (v) => v > 0 && v <= 1, 'in (0, 1]');
    const topK = num(flags, 'top-k', (v) => Number.isInteger(v) && v >= 0, 'an integer ≥ 0');
    const seed = num(flags, 'seed', (v) => Number.isInteger(v), 'an integer') ?? 0;

    const src = modelDirOf(positionals[0]);
    if (isDitDir(src)) {
      if (flags['image-out'] === undefined) throw new UsageError(`${src} is an image policy; give --image-out PATH`);
      const steps = num(flags, 'steps', (v) => Number.isInteger(v) && v > 0, 'a positive integer') ?? 10;
      const cfgScale = num(flags, 'cfg-scale', (v) => v >= 0, 'a number ≥ 0') ?? 1;
      writeFileSync(flags['image-out'], await generateImage(src, flags.prompt, { steps, seed, cfgScale }));
      return 0;
    }
    if (flags['image-out'] !== undefined || flags.steps !== undefined || flags['cfg-scale'] !== undefined)
      throw new UsageError(
        '--image-out, --steps and --cfg-scale need an image policy (config.json model_type rlstream_dit)',
      );
    // a LoRA adapter (a LoRA run's policy version or checkpoint) generates with its merged base
    const merged = isAdapterDir(src) ? await loadMergedAdapter(src, undefined) : null;
    const dir = merged ? merged.baseDir : src;
    const ck = merged ? { ...merged.base, weights: merged.weights } : await loadCheckpoint(dir, { optimizer: false });
    const c = ck.config;
    if (c.head !== 'lm')
      throw new ConfigError(
        `${dir} is a value model (${String((c.extra?.architectures as unknown) ?? 'score head')}); generate needs a causal LM`,
      );
    const tok: ModelTokenizer = modelDirTokenizer(dir, c);
    if (flags.image !== undefined && !c.vision)
      throw new ConfigError(`${dir} is a text-only model (no vision_config in config.json); drop --image`);
    for (const k of ['min-pixels', 'max-pixels', 'resample'])
      if (flags[k] !== undefined && flags.image === undefined) throw new UsageError(`--${k} needs --image`);
    const processor = c.vision ? readImageProcessor(dir, c) : null;
    const imageList: ImagePixels[] = [];
    for (const path of lists.image ?? []) imageList.push(await loadImage(path, c, flags, processor));
    const image = imageList.length ? imageList : null;
    let promptText =
      image && !flags.prompt.includes(IMAGE_MARK) ? IMAGE_MARK.repeat(image.length) + flags.prompt : flags.prompt;
    if (booleans.has('chat')) {
      if (!tok.applyChatTemplate || !tok.chatTemplate)
        throw new ConfigError(`${dir} has no chat template (tokenizer_config.json chat_template); drop --chat`);
      const messages = [
        ...(flags.system !== undefined ? [{ role: 'system', content: flags.system }] : []),
        { role: 'user', content: promptText },
      ];
      promptText = tok.applyChatTemplate(messages, templateKwargs ?? {});
    }
    // as transformers: a plain prompt gets the tokenizer's leading specials (e.g. Llama's BOS); a
    // rendered chat template already has them. The image block goes where the marker is (the text
    // around it encoded on its own), pads expanded to the image's tokens, as the pipeline does.
    const promptIds = Array.from(
      image
        ? imagePromptIds(tok, promptText, !booleans.has('chat'), c.vision!, image)
        : tok.encode(promptText, { addSpecialTokens: !booleans.has('chat') }),
    );
    const images = image ?? undefined;
    if (!promptIds.length) throw new ConfigError('the prompt encodes to no tokens; give a non-empty --prompt');
    const g = ck.generation ?? {};
    const gnum = (k: string): number | undefined => (typeof g[k] === 'number' ? (g[k] as number) : undefined);
    const sampling = g.do_sample === true;
    const T = temperature ?? (sampling ? (gnum('temperature') ?? 1) : 0);
    const room = c.maxPositionEmbeddings - promptIds.length;
    if (room <= 0)
      throw new ConfigError(
        `the prompt has ${promptIds.length} tokens, the model's max_position_embeddings is ${c.maxPositionEmbeddings}; shorten it`,
      );
    const N = Math.min(maxNew ?? gnum('max_new_tokens') ?? 256, room);
    // every eos id of config.json, generation_config.json and the tokenizer stops the response
    const stopIds = [...new Set([...stopTokenIds(c), ...tok.stopIds])].filter((id) => id < c.vocabSize);
    const [gen] = await new Sampler(c, { threads: 2 }).generate(
      ck.weights,
      [{ id: 'generate', prompt: promptIds, ...(images ? { images } : {}) }],
      {
        maxNewTokens: N,
        seed,
        temperature: T,
        topP: topP ?? (sampling ? (gnum('top_p') ?? 1) : 1),
        topK: topK ?? (sampling ? (gnum('top_k') ?? 0) : 0),
        eosTokenIds: stopIds,
      },
    );
    const responseIds = Array.from(gen.tokens);
    // the sampler's log-probs are of the temperature-scaled distribution (greedy: T = 1)
    const logprobs =
      T === 0 || T === 1
        ? Array.from(gen.logprobs)
        : Array.from(
            (
              await new Scorer(c, { threads: 2 }).score(
                ck.weights,
                [{ prompt: promptIds, response: responseIds, ...(images ? { images } : {}) }],
                { temperature: 1, entropy: false },
              )
            )[0].logprobs,
          );
    const stops = new Set(stopIds);
    const text = tok.decode(responseIds.filter((t) => !stops.has(t)));
    if (booleans.has('json'))
      process.stdout.write(JSON.stringify({ prompt_ids: promptIds, response_ids: responseIds, logprobs, text }) + '\n');
    else process.stdout.write(text + '\n');
    return 0;
  },
};
