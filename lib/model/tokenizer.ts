/**
 * Tokenizers. The `Tokenizer` interface is what the model engine needs; a Hugging Face
 * `tokenizer.json` implementation can fill it later. Built-ins:
 *  - `ByteTokenizer`: ids 0–255 are UTF-8 bytes, then PAD 256, BOS 257, EOS 258 (vocab 259);
 *    round-trips any string (lone surrogates become U+FFFD, as UTF-8 requires).
 *  - `AlphabetTokenizer`: PAD 0, BOS 1, EOS 2, then one id per character of a task alphabet; an
 *    unknown character is a ConfigError naming it and its position.
 * `encode` never adds specials; `decode` drops them.
 */
import { ConfigError } from '../errors.ts';

export interface Tokenizer {
  readonly vocabSize: number;
  readonly bos: number;
  readonly eos: number;
  readonly pad: number;
  encode(text: string): Int32Array;
  decode(ids: ArrayLike<number>): string;
}

export type TokenizerSpec = { type: 'byte' } | { type: 'alphabet'; alphabet: string };

export class ByteTokenizer implements Tokenizer {
  readonly vocabSize = 259;
  readonly pad = 256;
  readonly bos = 257;
  readonly eos = 258;
  private readonly enc = new TextEncoder();
  private readonly dec = new TextDecoder('utf-8');

  encode(text: string): Int32Array { return Int32Array.from(this.enc.encode(text)); }

  decode(ids: ArrayLike<number>): string {
    const bytes: number[] = [];
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (!(Number.isInteger(id) && id >= 0 && id < this.vocabSize)) throw new ConfigError(`ByteTokenizer.decode: id ${id} at position ${i} is outside [0, ${this.vocabSize})`);
      if (id < 256) bytes.push(id);
    }
    return this.dec.decode(Uint8Array.from(bytes));
  }

  spec(): TokenizerSpec { return { type: 'byte' }; }
}

export class AlphabetTokenizer implements Tokenizer {
  readonly pad = 0;
  readonly bos = 1;
  readonly eos = 2;
  readonly vocabSize: number;
  private readonly chars: string[];
  private readonly index = new Map<string, number>();

  constructor(readonly alphabet: string) {
    this.chars = [...alphabet];
    if (this.chars.length === 0) throw new ConfigError('AlphabetTokenizer: the alphabet is empty');
    this.chars.forEach((ch, i) => {
      if (this.index.has(ch)) throw new ConfigError(`AlphabetTokenizer: character ${JSON.stringify(ch)} appears twice in the alphabet ${JSON.stringify(alphabet)}`);
      this.index.set(ch, i + 3);
    });
    this.vocabSize = this.chars.length + 3;
  }

  encode(text: string): Int32Array {
    const out: number[] = [];
    let pos = 0;
    for (const ch of text) {
      const id = this.index.get(ch);
      if (id === undefined) throw new ConfigError(`AlphabetTokenizer: character ${JSON.stringify(ch)} at position ${pos} of ${JSON.stringify(text.length > 60 ? text.slice(0, 60) + '…' : text)} is not in the alphabet ${JSON.stringify(this.alphabet)}`);
      out.push(id);
      pos++;
    }
    return Int32Array.from(out);
  }

  decode(ids: ArrayLike<number>): string {
    let s = '';
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (!(Number.isInteger(id) && id >= 0 && id < this.vocabSize)) throw new ConfigError(`AlphabetTokenizer.decode: id ${id} at position ${i} is outside [0, ${this.vocabSize})`);
      if (id >= 3) s += this.chars[id - 3];
    }
    return s;
  }

  spec(): TokenizerSpec { return { type: 'alphabet', alphabet: this.alphabet }; }
}

export function createTokenizer(spec: TokenizerSpec): Tokenizer & { spec(): TokenizerSpec } {
  switch (spec.type) {
    case 'byte': return new ByteTokenizer();
    case 'alphabet': return new AlphabetTokenizer(spec.alphabet);
    default: throw new ConfigError(`unknown tokenizer type ${JSON.stringify((spec as { type: unknown }).type)} — valid: alphabet, byte`);
  }
}
