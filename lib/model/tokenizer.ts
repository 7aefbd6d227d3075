/**
 * Tokenizers. The `Tokenizer` interface is what the model engine needs; a Hugging Face model
 * directory's `tokenizer.json` fills it in hf-tokenizer.ts. Built-ins:
 *  - `ByteTokenizer`: ids 0–255 are UTF-8 bytes, then PAD 256, BOS 257, EOS 258 (vocab 259);
 *    round-trips any string (lone surrogates become U+FFFD, as UTF-8 requires).
 *  - `AlphabetTokenizer`: PAD 0, BOS 1, EOS 2, then one id per character of a task alphabet; an
 *    unknown character is a ConfigError naming it and its position.
 * `encode` adds no specials unless asked (`addSpecialTokens`: BOS first for the built-ins, the
 * post-processor's for a Hugging Face tokenizer); `decode` drops specials.
 */
import { ConfigError } from '../errors.ts';
import type { ChatTemplate } from './chat-template.ts';

export interface EncodeOptions {
  /** Add the specials a plain prompt starts with (BOS for the built-ins; transformers' add_special_tokens). */
  addSpecialTokens?: boolean;
}

export interface Tokenizer {
  readonly vocabSize: number;
  readonly bos: number;
  readonly eos: number;
  readonly pad: number;
  /** Every special id (`decode` drops them; none appears in text). */
  readonly specialIds: readonly number[];
  /** Ids that end a response: eos first, then any other end-of-turn/eos ids. */
  readonly stopIds: readonly number[];
  /** Ids that are not special but whose text cannot be stored (NUL, U+0000, for the byte tokenizer). */
  readonly textlessIds: readonly number[];
  /** The chat template, or null when the tokenizer has none (the built-ins). */
  readonly chatTemplate: ChatTemplate | null;
  encode(text: string, opts?: EncodeOptions): Int32Array;
  decode(ids: ArrayLike<number>): string;
}

/**
 * The ids sampling must never emit in a model of `vocabSize` logits: specials other
 * than the stop ids, ids without storable text (NUL), and the padding rows of a model whose
 * vocabulary is larger than its tokenizer's. Sorted, distinct.
 */
export function samplingMaskIds(
  tok: Tokenizer,
  vocabSize: number = tok.vocabSize,
  stopIds: readonly number[] = tok.stopIds,
): Int32Array {
  const stop = new Set(stopIds);
  const out = new Set<number>();
  for (const id of [...tok.specialIds, ...tok.textlessIds]) if (id < vocabSize && !stop.has(id)) out.add(id);
  for (let id = tok.vocabSize; id < vocabSize; id++) if (!stop.has(id)) out.add(id);
  return Int32Array.from([...out].sort((a, b) => a - b));
}

export type TokenizerSpec = { type: 'byte' } | { type: 'alphabet'; alphabet: string };

export class ByteTokenizer implements Tokenizer {
  readonly vocabSize = 259;
  readonly pad = 256;
  readonly bos = 257;
  readonly eos = 258;
  readonly specialIds = [256, 257, 258];
  readonly stopIds = [258];
  readonly textlessIds = [0];
  readonly chatTemplate = null;
  private readonly enc = new TextEncoder();
  private readonly dec = new TextDecoder('utf-8');

  encode(text: string, opts: EncodeOptions = {}): Int32Array {
    const bytes = this.enc.encode(text);
    if (!opts.addSpecialTokens) return Int32Array.from(bytes);
    const out = new Int32Array(bytes.length + 1);
    out[0] = this.bos;
    out.set(bytes, 1);
    return out;
  }

  decode(ids: ArrayLike<number>): string {
    const bytes: number[] = [];
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (!(Number.isInteger(id) && id >= 0 && id < this.vocabSize))
        throw new ConfigError(`ByteTokenizer.decode: id ${id} at position ${i} is outside [0, ${this.vocabSize})`);
      if (id < 256) bytes.push(id);
    }
    return this.dec.decode(Uint8Array.from(bytes));
  }

  spec(): TokenizerSpec {
    return { type: 'byte' };
  }
}

export class AlphabetTokenizer implements Tokenizer {
  readonly pad = 0;
  readonly bos = 1;
  readonly eos = 2;
  readonly specialIds = [0, 1, 2];
  readonly stopIds = [2];
  readonly textlessIds: number[];
  readonly chatTemplate = null;
  readonly vocabSize: number;
  private readonly chars: string[];
  private readonly index = new Map<string, number>();

  constructor(readonly alphabet: string) {
    this.chars = [...alphabet];
    if (this.chars.length === 0) throw new ConfigError('AlphabetTokenizer: the alphabet is empty');
    this.chars.forEach((ch, i) => {
      if (this.index.has(ch))
        throw new ConfigError(
          `AlphabetTokenizer: character ${JSON.stringify(ch)} appears twice in the alphabet ${JSON.stringify(alphabet)}`,
        );
      this.index.set(ch, i + 3);
    });
    this.vocabSize = this.chars.length + 3;
    this.textlessIds = this.index.has('\0') ? [this.index.get('\0')!] : [];
  }

  encode(text: string, opts: EncodeOptions = {}): Int32Array {
    const out: number[] = opts.addSpecialTokens ? [this.bos] : [];
    let pos = 0;
    for (const ch of text) {
      const id = this.index.get(ch);
      if (id === undefined)
        throw new ConfigError(
          `AlphabetTokenizer: character ${JSON.stringify(ch)} at position ${pos} of ${JSON.stringify(text.length > 60 ? text.slice(0, 60) + '…' : text)} is not in the alphabet ${JSON.stringify(this.alphabet)}`,
        );
      out.push(id);
      pos++;
    }
    return Int32Array.from(out);
  }

  decode(ids: ArrayLike<number>): string {
    let s = '';
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (!(Number.isInteger(id) && id >= 0 && id < this.vocabSize))
        throw new ConfigError(`AlphabetTokenizer.decode: id ${id} at position ${i} is outside [0, ${this.vocabSize})`);
      if (id >= 3) s += this.chars[id - 3];
    }
    return s;
  }

  spec(): TokenizerSpec {
    return { type: 'alphabet', alphabet: this.alphabet };
  }
}

export function createTokenizer(spec: TokenizerSpec): Tokenizer & { spec(): TokenizerSpec } {
  switch (spec.type) {
    case 'byte':
      return new ByteTokenizer();
    case 'alphabet':
      return new AlphabetTokenizer(spec.alphabet);
    default:
      throw new ConfigError(
        `unknown tokenizer type ${JSON.stringify((spec as { type: unknown }).type)} — valid: alphabet, byte`,
      );
  }
}
