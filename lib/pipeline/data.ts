/**
 * The run's datasets as the controller uses them: rows from files (JSONL / verl parquet) or from a
 * built-in task generator, rendered and tokenized with the policy's tokenizer (`renderPrompt`),
 * overlong prompts (counted after rendering) filtered out (reported, never silently) or treated
 * as bad rows.
 */
import { readFileSync } from 'node:fs';
import { Template } from '@huggingface/jinja';
import type { Config } from '../config/index.ts';
import { loadDataset, type DatasetRow } from '../data/dataset.ts';
import { ImageError, prepareRgbImage, type ImageOptions, type PromptImage } from '../data/images.ts';
import { tasks, type TaskRow } from '../tasks/index.ts';
import type { Tokenizer } from '../model/index.ts';
import { promptMessages, type ChatMessage } from '../model/chat-template.ts';
import { ConfigError } from '../errors.ts';
import { loadToolSchemas } from '../env/tools.ts';
import type { VisionConfig } from '../model/config.ts';
import { imagePromptIds, withImageMarks, IMAGE_MARK } from './images.ts';
import { policyModelConfig } from './policy.ts';
import { isImagePolicy } from './image-policy.ts';

export interface PromptRendering {
  /** data.apply_chat_template: use the tokenizer's chat template when it has one. */
  applyChatTemplate: boolean;
  systemPrompt: string | null;
  /** data.format_prompt, loaded: applied to string prompts first (variable `content`). */
  formatPrompt: { render(content: string): string } | null;
  chatTemplateKwargs: Record<string, unknown>;
}

/** data.format_prompt's Jinja file, read and parsed once (one ConfigError naming the file). */
export function loadFormatPrompt(file: string): { render(content: string): string } {
  let src: string;
  try {
    src = readFileSync(file, 'utf8');
  } catch (e) {
    throw new ConfigError(`data.format_prompt: cannot read ${file} (${(e as Error).message})`);
  }
  let t: Template;
  try {
    t = new Template(src.trim());
  } catch (e) {
    throw new ConfigError(`data.format_prompt: ${file} is not a valid Jinja template (${(e as Error).message})`);
  }
  return { render: (content) => t.render({ content }) };
}

/**
 * The chat template's variables besides the messages: the run's tool schemas as `tools` (when
 * rollout.multi_turn has tools; transformers' apply_chat_template(tools=…)), then
 * data.chat_template_kwargs.
 */
export function chatTemplateKwargs(cfg: Pick<Config, 'data' | 'rollout'>): Record<string, unknown> {
  const tools = loadToolSchemas(cfg.rollout.multi_turn);
  return { ...(tools.length ? { tools } : {}), ...cfg.data.chat_template_kwargs };
}

export function promptRendering(cfg: Config): PromptRendering {
  const d = cfg.data;
  return {
    applyChatTemplate: d.apply_chat_template,
    systemPrompt: d.system_prompt,
    formatPrompt: d.format_prompt ? loadFormatPrompt(d.format_prompt) : null,
    chatTemplateKwargs: chatTemplateKwargs(cfg),
  };
}

/**
 * A prompt as the policy sees it: the text and its ids. With a chat template (and
 * applyChatTemplate): format_prompt on a string prompt, then the messages (the string as one user
 * message, system_prompt first when set) rendered with the generation prompt, encoded without
 * added specials (the template writes them, as transformers' apply_chat_template). Without:
 * the (formatted) text with the tokenizer's own specials (BOS for the built-ins). With `images`
 * (a vision policy and a row with images): each image's block at its `<image>` marker, else before
 * the (first user message's) text, pads expanded (lib/pipeline/images.ts).
 */
export function renderPrompt(
  tok: Tokenizer,
  prompt: string,
  messages: ChatMessage[] | null,
  r: PromptRendering,
  images: PromptVision | null = null,
): { text: string; ids: Int32Array } {
  const n = images?.sizes.length ?? 0;
  let content = messages === null && r.formatPrompt ? r.formatPrompt.render(prompt) : prompt;
  // a vision policy: the images' markers where the prompt has them, else before its (first user) text
  if (n > 0 && messages === null) content = withImageMarks(content, n);
  if (n > 0 && messages !== null && !messages.some((m) => m.content.includes(IMAGE_MARK))) {
    const u = Math.max(
      0,
      messages.findIndex((m) => m.role === 'user'),
    );
    messages = messages.map((m, i) => (i === u ? { ...m, content: withImageMarks(m.content, n) } : m));
  }
  const encode = (text: string, addSpecialTokens: boolean): Int32Array =>
    n > 0
      ? imagePromptIds(tok, text, addSpecialTokens, images!.vision, images!.sizes)
      : tok.encode(text, { addSpecialTokens });
  if (r.applyChatTemplate && tok.chatTemplate) {
    const text = tok.chatTemplate.render(promptMessages(messages ?? content, r.systemPrompt), {
      addGenerationPrompt: true,
      kwargs: r.chatTemplateKwargs,
    });
    return { text, ids: encode(text, false) };
  }
  return { text: content, ids: encode(content, true) };
}

/** A vision policy's tower and the sizes of the row's images (renderPrompt expands their pads). */
export interface PromptVision {
  vision: VisionConfig;
  sizes: readonly { width: number; height: number }[];
}

export interface PromptRow {
  index: number;
  prompt: string;
  answer: string;
  images: PromptImage[];
  promptIds: Int32Array;
  source: string;
  /** The row's own data_source and extra_info (JSON text), when the file gives them (verl). */
  dataSource?: string;
  extraInfo?: string;
}
/** Rows left out of a split: bad rows skipped (data.on_bad_row = skip) and overlong prompts dropped. */
export interface LeftOut {
  bad: Array<{ where: string; reason: string }>;
  overlong: Array<{ where: string; tokens: number }>;
}
export interface RunData {
  train: PromptRow[];
  val: PromptRow[];
  dropped: { train: number; val: number };
  dataSource: string;
  leftOut: { train: LeftOut; val: LeftOut };
  /** The policy has a vision tower: prompt ids hold the images' expanded pads and the stages pass the pixels. */
  visionPolicy?: boolean;
}

/** How many file:line examples a data note names. */
const EXAMPLES = 3;

/**
 * One line per kind of row left out of a split, with the count and the first few file:line
 * examples (logged once by the controller at start); [] when every row was used.
 */
export function dataNotes(data: Pick<RunData, 'leftOut'>, cfg: Pick<Config, 'data'>): string[] {
  const out: string[] = [];
  const more = (n: number) => (n > EXAMPLES ? `, … (${n - EXAMPLES} more)` : '');
  for (const split of ['train', 'val'] as const) {
    const { bad, overlong } = data.leftOut[split];
    if (bad.length) {
      out.push(
        `${bad.length} bad ${split} row${bad.length === 1 ? '' : 's'} skipped (data.on_bad_row = skip): ${bad
          .slice(0, EXAMPLES)
          .map((b) => `${b.where}: ${b.reason}`)
          .join('; ')}${more(bad.length)}`,
      );
    }
    if (overlong.length) {
      out.push(
        `${overlong.length} ${split} prompt${overlong.length === 1 ? '' : 's'} longer than data.max_prompt_length = ${cfg.data.max_prompt_length} tokens dropped (data.filter_overlong_prompts = true; raise max_prompt_length to keep ${overlong.length === 1 ? 'it' : 'them'}): ${overlong
          .slice(0, EXAMPLES)
          .map((o) => `${o.where} (${o.tokens} tokens)`)
          .join(', ')}${more(overlong.length)}`,
      );
    }
  }
  return out;
}

const taskRowsCache = new Map<string, Promise<Omit<DatasetRow, 'index'>[]>>();

/** A task's generated rows as dataset rows; a generated image goes through the same resize and encoding as a dataset image. */
async function taskRows(
  gen: readonly TaskRow[],
  file: string,
  imageOpts: ImageOptions,
): Promise<Omit<DatasetRow, 'index'>[]> {
  const rows: Omit<DatasetRow, 'index'>[] = new Array(gen.length);
  const one = async (i: number) => {
    const r = gen[i]!;
    const images: PromptImage[] = [];
    if (r.image) {
      try {
        images.push(await prepareRgbImage(r.image, imageOpts));
      } catch (e) {
        if (!(e instanceof ImageError)) throw e;
        throw new ConfigError(
          `${file}:${i + 1}: the task's ${r.image.width}×${r.image.height} image ${e.message}; check data.min_pixels / max_pixels / image_factor`,
        );
      }
    }
    rows[i] = {
      prompt: r.prompt,
      messages: null,
      answer: r.answer,
      images,
      source: { file, line: i + 1 },
      ...(r.extraInfo ? { extraInfo: JSON.stringify(r.extraInfo) } : {}),
    };
  };
  // libvips works on its own threads: a few images in flight at a time keep them busy
  const CONCURRENCY = 16;
  for (let i = 0; i < gen.length; i += CONCURRENCY) {
    await Promise.all(Array.from({ length: Math.min(CONCURRENCY, gen.length - i) }, (_, k) => one(i + k)));
  }
  return rows;
}

async function rowsOf(
  cfg: Config,
  split: 'train' | 'val',
): Promise<{ rows: Omit<DatasetRow, 'index'>[]; source: string; bad: Array<{ where: string; reason: string }> }> {
  const d = cfg.data;
  if (d.task) {
    const task = tasks.get(d.task);
    const count = split === 'train' ? d.task_size.train : d.task_size.val;
    // train and val come from disjoint seeds
    const seed = split === 'train' ? d.seed : d.seed + 1_000_003;
    const imageOpts = {
      factor: d.image_factor,
      minPixels: d.min_pixels,
      maxPixels: d.max_pixels,
      resample: d.image_resample,
    };
    const file = `task:${task.name}:${split}`;
    const key = JSON.stringify([task.name, split, count, seed, imageOpts]);
    let rows = taskRowsCache.get(key);
    if (!rows) {
      rows = taskRows(task.generate(count, seed), file, imageOpts);
      // a run loads its data in several places (start check, controller, update): the rows are a
      // pure function of the key, so one process makes them (and their images) once
      taskRowsCache.set(key, rows);
      if (taskRowsCache.size > 4) taskRowsCache.delete(taskRowsCache.keys().next().value!);
      rows.catch(() => taskRowsCache.delete(key));
    }
    return { rows: await rows, source: task.name, bad: [] };
  }
  const files = split === 'train' ? d.train_files : d.val_files;
  if (files.length === 0) return { rows: [], source: 'files', bad: [] };
  const { rows, bad } = await loadDataset(files, {
    prompt_key: d.prompt_key,
    answer_key: d.answer_key,
    image_key: d.image_key,
    video_key: d.video_key,
    format: d.format,
    on_bad_row: d.on_bad_row,
    max_rows: d.max_rows,
    image_dir: d.image_dir,
    limit_images: d.limit_images,
    image: { factor: d.image_factor, minPixels: d.min_pixels, maxPixels: d.max_pixels, resample: d.image_resample },
  });
  return { rows, source: files.join(','), bad: bad.map((b) => ({ where: `${b.file}:${b.line}`, reason: b.reason })) };
}

export async function loadRunData(cfg: Config, tok: Tokenizer): Promise<RunData> {
  const out: RunData = {
    train: [],
    val: [],
    dropped: { train: 0, val: 0 },
    dataSource: '',
    leftOut: { train: { bad: [], overlong: [] }, val: { bad: [], overlong: [] } },
  };
  const r = promptRendering(cfg);
  if (r.systemPrompt !== null && !(r.applyChatTemplate && tok.chatTemplate)) {
    throw new ConfigError(
      `data.system_prompt needs a chat template to go into, and ${tok.chatTemplate ? 'data.apply_chat_template is false' : 'the tokenizer has none (a model directory with a chat_template brings one)'}; unset data.system_prompt or write it into the prompts`,
    );
  }
  // a vision-language policy sees the images: their pads are expanded in the prompt ids here, once
  // an image policy's prompts are its classes (lib/pipeline/image-policy.ts): no images to see
  const vision = isImagePolicy(cfg) ? null : (policyModelConfig(cfg, tok).vision ?? null);
  out.visionPolicy = vision !== null;
  for (const split of ['train', 'val'] as const) {
    const { rows, source, bad } = await rowsOf(cfg, split);
    out.leftOut[split].bad.push(...bad);
    out.dataSource = out.dataSource || source;
    for (const row of rows) {
      let rendered: { text: string; ids: Int32Array };
      try {
        rendered = renderPrompt(
          tok,
          row.prompt,
          row.messages,
          r,
          vision && row.images.length > 0 ? { vision, sizes: row.images } : null,
        );
      } catch (e) {
        const msg = `${row.source.file}:${row.source.line}: prompt cannot be rendered or tokenized: ${(e as Error).message}`;
        if (cfg.data.on_bad_row === 'stop')
          throw new ConfigError(`${msg} (set data.on_bad_row=skip to skip such rows)`);
        out.dropped[split]++;
        out.leftOut[split].bad.push({
          where: `${row.source.file}:${row.source.line}`,
          reason: `prompt cannot be rendered or tokenized: ${(e as Error).message}`,
        });
        continue;
      }
      const ids = rendered.ids;
      if (ids.length > cfg.data.max_prompt_length) {
        if (!cfg.data.filter_overlong_prompts && cfg.data.on_bad_row === 'stop')
          throw new ConfigError(
            `${row.source.file}:${row.source.line}: prompt is ${ids.length} tokens (after the chat template), over data.max_prompt_length = ${cfg.data.max_prompt_length} (raise it, or set data.filter_overlong_prompts=true)`,
          );
        out.dropped[split]++;
        if (cfg.data.filter_overlong_prompts)
          out.leftOut[split].overlong.push({ where: `${row.source.file}:${row.source.line}`, tokens: ids.length });
        else
          out.leftOut[split].bad.push({
            where: `${row.source.file}:${row.source.line}`,
            reason: `prompt is ${ids.length} tokens (after the chat template), over data.max_prompt_length = ${cfg.data.max_prompt_length}`,
          });
        continue;
      }
      out[split].push({
        index: out[split].length,
        prompt: rendered.text,
        answer: row.answer,
        images: row.images,
        promptIds: ids,
        source: `${row.source.file}:${row.source.line}`,
        dataSource: row.dataSource,
        extraInfo: row.extraInfo,
      });
    }
  }
  return out;
}
