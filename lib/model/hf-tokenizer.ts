/**
 * The tokenizer of a Hugging Face model directory as the engine's `Tokenizer`: `tokenizer.json`
 * and `tokenizer_config.json` through @huggingface/tokenizers (pure JS; ids identical to HF's
 * native Rust tokenizers, test/unit/model/hf-tokenizer.test.ts), its chat template through
 * chat-template.ts.
 *  - encode: no specials unless `addSpecialTokens` (then the post-processor's, as transformers'
 *    add_special_tokens=True); special tokens written in the text are matched as such.
 *  - decode: specials skipped, clean_up_tokenization_spaces off, invalid UTF-8 as U+FFFD.
 *  - bos/eos/pad: tokenizer_config.json's tokens; an unset one takes the caller's fallback (the
 *    model's config.json ids); pad then falls back to eos (verl's rule when pad_token is None),
 *    bos to pad (Qwen has no bos_token; the template writes what it needs).
 *  - chat template: chat_template.jinja if present, else chat_template.json's (a processor's), else
 *    tokenizer_config.json's chat_template.
 *  - specialIds: every added token marked special plus bos/eos/pad/unk; stopIds: eos then the
 *    fallback's stop ids (config.json / generation_config.json eos lists); textlessIds: tokens
 *    whose text contains NUL (byte-level `Ā`, SentencePiece `<0x00>`).
 * `loadTokenizerDir` is synchronous (the files are read once at start).
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer as JsTokenizer } from '@huggingface/tokenizers';
import { ConfigError } from '../errors.ts';
import { ChatTemplate, type ChatMessage } from './chat-template.ts';
import type { EncodeOptions, Tokenizer } from './tokenizer.ts';

export const TOKENIZER_FILE = 'tokenizer.json';
export const TOKENIZER_CONFIG_FILE = 'tokenizer_config.json';
export const CHAT_TEMPLATE_FILE = 'chat_template.jinja';

/** Ids from the model's config.json / generation_config.json, used where tokenizer_config.json is silent. */
export interface TokenizerFallback {
  bos?: number | null;
  eos?: number | null;
  pad?: number | null;
  stopIds?: readonly number[];
}

type Json = Record<string, unknown>;

function readJson(file: string): Json {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new ConfigError(`${file}: cannot read it (${(e as Error).message})`);
  }
  try {
    const v = JSON.parse(text) as unknown;
    if (!v || typeof v !== 'object' || Array.isArray(v)) throw new Error('not a JSON object');
    return v as Json;
  } catch (e) {
    throw new ConfigError(`${file}: not valid JSON (${(e as Error).message}); copy the model's original file`);
  }
}

/** A special-token entry of tokenizer_config.json: a string or an AddedToken object {content}. */
function tokenText(t: unknown): string | null {
  if (typeof t === 'string') return t;
  if (t && typeof t === 'object' && typeof (t as { content?: unknown }).content === 'string')
    return (t as { content: string }).content;
  return null;
}

/** The chat template: chat_template.jinja when present (transformers reads it over the config's), else chat_template.json's, else tokenizer_config.json's. */
function chatTemplateSource(dir: string, config: Json): { source: string; where: string } | null {
  const file = join(dir, CHAT_TEMPLATE_FILE);
  if (existsSync(file)) return { source: readFileSync(file, 'utf8'), where: file };
  // a processor's chat_template.json ({"chat_template": "…"}, Qwen2-VL / Qwen2.5-VL directories)
  const pfile = join(dir, 'chat_template.json');
  if (existsSync(pfile)) {
    let j: unknown;
    try {
      j = JSON.parse(readFileSync(pfile, 'utf8'));
    } catch (e) {
      throw new ConfigError(`${pfile} is not valid JSON (${(e as Error).message})`);
    }
    const t = (j as { chat_template?: unknown } | null)?.chat_template;
    if (typeof t !== 'string') throw new ConfigError(`${pfile}: "chat_template" must be a string`);
    return { source: t, where: pfile };
  }
  const where = join(dir, TOKENIZER_CONFIG_FILE);
  const t = config.chat_template;
  if (typeof t === 'string') return { source: t, where };
  if (Array.isArray(t)) {
    // the older list form: [{name, template}], transformers uses the one named "default"
    const d = t.find((x) => x && typeof x === 'object' && (x as { name?: unknown }).name === 'default') as
      { template?: unknown } | undefined;
    if (d && typeof d.template === 'string') return { source: d.template, where };
  }
  return null;
}

export class HfTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bos: number;
  readonly eos: number;
  readonly pad: number;
  readonly specialIds: readonly number[];
  readonly stopIds: readonly number[];
  readonly textlessIds: readonly number[];
  readonly chatTemplate: ChatTemplate | null;
  /** The special-token strings (bos_token, eos_token, …) as transformers' special_tokens_map. */
  readonly specialTokens: Readonly<Record<string, string | string[]>>;

  constructor(
    private readonly js: JsTokenizer,
    config: Json,
    fallback: TokenizerFallback,
    readonly dir: string,
  ) {
    const vocab = js.get_vocab(true);
    let max = -1;
    for (const id of vocab.values()) if (id > max) max = id;
    this.vocabSize = max + 1;
    const where = join(dir, TOKENIZER_CONFIG_FILE);
    const idOf = (key: string): number | null => {
      const t = tokenText(config[key]);
      if (t === null) return null;
      const id = js.token_to_id(t);
      if (id === undefined)
        throw new ConfigError(`${where}: ${key} ${JSON.stringify(t)} is not a token of ${join(dir, TOKENIZER_FILE)}`);
      return id;
    };
    const eos = idOf('eos_token') ?? fallback.eos ?? null;
    if (eos === null)
      throw new ConfigError(
        `${where}: no eos_token (and the model's config.json has no eos_token_id); set eos_token to the model's end-of-text token`,
      );
    this.eos = eos;
    this.pad = idOf('pad_token') ?? fallback.pad ?? eos;
    this.bos = idOf('bos_token') ?? fallback.bos ?? this.pad;
    const specials = new Set<number>([this.eos, this.pad, this.bos]);
    const unk = idOf('unk_token');
    if (unk !== null) specials.add(unk);
    for (const [id, t] of js.get_added_tokens_decoder()) if (t.special) specials.add(id);
    this.specialIds = [...specials].sort((a, b) => a - b);
    this.stopIds = [...new Set([this.eos, ...(fallback.stopIds ?? [])])];
    const textless: number[] = [];
    for (const [token, id] of vocab) {
      if (specials.has(id) || !(token.includes('\u0100') || token.includes('<0x00>') || token.includes('\0'))) continue;
      if (js.decode([id], { skip_special_tokens: false, clean_up_tokenization_spaces: false }).includes('\0'))
        textless.push(id);
    }
    this.textlessIds = textless.sort((a, b) => a - b);
    const map: Record<string, string | string[]> = {};
    for (const k of ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token']) {
      const t = tokenText(config[k]);
      if (t !== null) map[k] = t;
    }
    if (Array.isArray(config.additional_special_tokens))
      map.additional_special_tokens = config.additional_special_tokens
        .map(tokenText)
        .filter((t): t is string => t !== null);
    this.specialTokens = map;
    const tpl = chatTemplateSource(dir, config);
    this.chatTemplate = tpl ? new ChatTemplate(tpl.source, map, tpl.where) : null;
  }

  encode(text: string, opts: EncodeOptions = {}): Int32Array {
    return Int32Array.from(this.js.encode(text, { add_special_tokens: opts.addSpecialTokens ?? false }).ids);
  }

  decode(ids: ArrayLike<number>): string {
    const list = Array.from(ids);
    for (let i = 0; i < list.length; i++) {
      const id = list[i];
      if (!(Number.isInteger(id) && id >= 0 && id < this.vocabSize))
        throw new ConfigError(
          `HfTokenizer.decode: id ${id} at position ${i} is outside [0, ${this.vocabSize}) of ${join(this.dir, TOKENIZER_FILE)}`,
        );
    }
    if (list.length === 0) return ''; // the library refuses an empty list
    return this.js.decode(list, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
  }

  /** The token string of an id (specials included), or undefined. */
  idToToken(id: number): string | undefined {
    return this.js.id_to_token(id);
  }

  /**
   * The chat template rendered with the generation prompt (transformers'
   * apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)).
   */
  applyChatTemplate(messages: ChatMessage[], kwargs: Record<string, unknown> = {}): string {
    if (!this.chatTemplate)
      throw new ConfigError(
        `${join(this.dir, TOKENIZER_CONFIG_FILE)} has no chat_template (nor is there a ${CHAT_TEMPLATE_FILE}); use the prompt without a chat template (data.apply_chat_template=false, or generate without --chat)`,
      );
    return this.chatTemplate.render(messages, { addGenerationPrompt: true, kwargs });
  }
}

/** Whether `dir` holds a Hugging Face tokenizer (tokenizer.json). */
export function hasTokenizerFiles(dir: string): boolean {
  return existsSync(join(dir, TOKENIZER_FILE));
}

/**
 * Loads the tokenizer of a model directory (tokenizer.json, tokenizer_config.json optional,
 * chat_template.jinja optional). A missing or unreadable file is one ConfigError naming it.
 */
export function loadTokenizerDir(dir: string, fallback: TokenizerFallback = {}): HfTokenizer {
  const tj = join(dir, TOKENIZER_FILE),
    tc = join(dir, TOKENIZER_CONFIG_FILE);
  if (!existsSync(tj))
    throw new ConfigError(
      `${dir} has no ${TOKENIZER_FILE}; copy the model's tokenizer files (${TOKENIZER_FILE}, ${TOKENIZER_CONFIG_FILE}) into it`,
    );
  const json = readJson(tj),
    config = existsSync(tc) ? readJson(tc) : {};
  let js: JsTokenizer;
  try {
    js = new JsTokenizer(json, config);
  } catch (e) {
    throw new ConfigError(`${tj}: not a tokenizer @huggingface/tokenizers can read (${(e as Error).message})`);
  }
  return new HfTokenizer(js, config, fallback, dir);
}
