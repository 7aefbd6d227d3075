/**
 * The tokenizer of a Hugging Face model directory, as the engine's `Tokenizer`: `tokenizer.json`
 * through @huggingface/tokenizers (encode without added specials, decode skipping specials with
 * clean_up_tokenization_spaces off), specials from `tokenizer_config.json`, and its `chat_template`
 * rendered with @huggingface/jinja (messages, add_generation_prompt, bos/eos tokens, extra kwargs).
 *
 * Delegates to lib/model/hf-tokenizer.ts (loadTokenizerDir) and lib/model/chat-template.ts.
 */
import type { Tokenizer } from './tokenizer.ts';
import { loadTokenizerDir } from './hf-tokenizer.ts';
import type { ChatMessage } from './chat-template.ts';

export type { ChatMessage };

/** A Tokenizer that may render chat messages through the model's chat template. */
export interface ModelTokenizer extends Tokenizer {
  /** The chat template rendered with the generation prompt added; absent when the tokenizer has none. */
  applyChatTemplate?(messages: ChatMessage[], kwargs?: Record<string, unknown>): string;
}

export function loadModelDirTokenizer(
  dir: string,
  fallback: { bos: number; eos: number; pad: number; stopIds?: readonly number[] },
): ModelTokenizer {
  return loadTokenizerDir(dir, fallback);
}
