/**
 * The tokenizer of a Hugging Face model directory, as the engine's `Tokenizer`: `tokenizer.json`
 * through @huggingface/tokenizers (encode without added specials, decode skipping specials with
 * clean_up_tokenization_spaces off), specials from `tokenizer_config.json`, and its `chat_template`
 * rendered with @huggingface/jinja (messages, add_generation_prompt, bos/eos tokens, extra kwargs).
 *
 * Interim: "tok" (lib/model/hf-tokenizer.ts, lib/model/chat-template.ts) owns the full tokenizer
 * and chat-template support; this adapter is what model directories (`rlstream generate`, the
 * policy of a run) use until that lands, and should then delegate to it.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { Template } from '@huggingface/jinja';
import { ConfigError } from '../errors.ts';
import type { Tokenizer } from './tokenizer.ts';

export interface ChatMessage { role: string; content: string }

/** A Tokenizer that may render chat messages through the model's chat template. */
export interface ModelTokenizer extends Tokenizer {
  /** The chat template rendered with the generation prompt added; absent when the tokenizer has none. */
  applyChatTemplate?(messages: ChatMessage[], kwargs?: Record<string, unknown>): string;
}

function readJson(file: string): Record<string, unknown> {
  try { return JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>; } catch (e) { throw new ConfigError(`${file}: cannot read it as JSON (${(e as Error).message})`); }
}

const tokenText = (t: unknown): string | null => (typeof t === 'string' ? t : t && typeof t === 'object' && typeof (t as { content?: unknown }).content === 'string' ? (t as { content: string }).content : null);

export function loadModelDirTokenizer(dir: string, fallback: { bos: number; eos: number; pad: number }): ModelTokenizer {
  const tj = join(dir, 'tokenizer.json'), tc = join(dir, 'tokenizer_config.json');
  if (!existsSync(tj)) throw new ConfigError(`${dir} has no tokenizer.json; copy the model's tokenizer files (tokenizer.json, tokenizer_config.json) into it`);
  const json = readJson(tj), config = existsSync(tc) ? readJson(tc) : {};
  let hf: HfTokenizer;
  try { hf = new HfTokenizer(json, config); } catch (e) { throw new ConfigError(`${tj}: not a tokenizer this engine can read (${(e as Error).message})`); }
  const vocab = (json.model as { vocab?: Record<string, number> | unknown[] } | undefined)?.vocab;
  const ids = new Map<string, number>();
  let maxId = Array.isArray(vocab) ? vocab.length - 1 : -1;
  if (vocab && !Array.isArray(vocab)) for (const [k, v] of Object.entries(vocab)) { ids.set(k, v); if (v > maxId) maxId = v; }
  for (const a of (json.added_tokens ?? []) as Array<{ id: number; content: string }>) { ids.set(a.content, a.id); maxId = Math.max(maxId, a.id); }
  const idOf = (key: string, dflt: number): number => { const t = tokenText(config[key]); return t !== null && ids.has(t) ? ids.get(t)! : dflt; };
  const eos = idOf('eos_token', fallback.eos);
  const template = typeof config.chat_template === 'string' ? new Template(config.chat_template) : null;
  const tok: ModelTokenizer = {
    vocabSize: maxId + 1,
    bos: idOf('bos_token', fallback.bos),
    eos,
    pad: idOf('pad_token', fallback.pad),
    encode: (text) => Int32Array.from(hf.encode(text, { add_special_tokens: false }).ids),
    decode: (list) => hf.decode(Array.from(list), { skip_special_tokens: true, clean_up_tokenization_spaces: false }),
  };
  if (template) {
    tok.applyChatTemplate = (messages, kwargs = {}) => template.render({
      messages, add_generation_prompt: true, bos_token: tokenText(config.bos_token) ?? '', eos_token: tokenText(config.eos_token) ?? '', ...kwargs,
    });
  }
  return tok;
}
