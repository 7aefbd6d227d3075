/**
 * The text of one choice as its tokens arrive: decoded incrementally, cut at the first stop string
 * (the tokens are kept whole, as vLLM keeps `token_ids`), and released in deltas that never end
 * inside a possible stop string or a partial UTF-8 character, so the concatenated stream deltas
 * equal the final text. A stop id (EOS) ends the choice and is not part of the text; the `max`-th
 * token ends it with 'length'.
 *
 * Without stop strings and with `deltas: false` (a response sent whole) nothing is decoded per
 * token: the text is decoded once, when it is read, so a choice costs one decode, not one per
 * token over a growing prefix.
 */
import type { Tokenizer } from '../model/tokenizer.ts';

export type ChoiceFinish = 'stop' | 'length';

export class ChoiceText {
  readonly tokens: number[] = [];
  readonly logprobs: number[] = [];
  finish: ChoiceFinish | null = null;
  private sent = 0;
  private readonly hold: number;
  private readonly eager: boolean;
  /** The first `textTokens` tokens make the text (a final stop id is not part of it). */
  private textTokens = 0;
  /** Their decoded text (cut at a stop string), or null when not decoded yet. */
  private decoded: string | null = '';

  constructor(
    private readonly tok: Pick<Tokenizer, 'decode'>,
    private readonly stops: readonly string[],
    private readonly eos: ReadonlySet<number>,
    /** Tokens at most (the choice ends with 'length' at the last). */
    private readonly max: number,
    /** Deltas are sent as tokens arrive (streaming); false: `push` returns empty deltas. */
    deltas = true,
  ) {
    this.hold = Math.max(0, ...stops.map((s) => s.length - 1));
    this.eager = deltas || stops.length > 0;
  }

  /** The text so far (cut at a stop string; without a final stop id). */
  get text(): string {
    this.decoded ??= this.tok.decode(this.tokens.slice(0, this.textTokens));
    return this.decoded;
  }

  /** Adds a sampled token; returns the text now safe to send and whether the choice has ended. */
  push(token: number, logprob: number): { delta: string; done: boolean } {
    if (this.finish) return { delta: '', done: true };
    this.tokens.push(token);
    this.logprobs.push(logprob);
    if (this.eos.has(token)) return this.end('stop');
    this.textTokens = this.tokens.length;
    this.decoded = null;
    if (!this.eager) {
      if (this.tokens.length >= this.max) return this.end('length');
      return { delta: '', done: false };
    }
    const text = this.text;
    const hits = this.stops.map((s) => (s ? text.indexOf(s, Math.max(0, this.sent - s.length)) : -1));
    const cut = Math.min(...hits.filter((i) => i >= 0));
    if (Number.isFinite(cut)) {
      this.decoded = text.slice(0, cut);
      return this.end('stop');
    }
    if (this.tokens.length >= this.max) return this.end('length');
    let safe = text.length - this.hold;
    while (safe > this.sent && text.charCodeAt(safe - 1) === 0xfffd) safe--;
    return { delta: this.release(safe), done: false };
  }

  /** Ends the choice (no more tokens) and returns the text not yet sent. */
  end(finish: ChoiceFinish): { delta: string; done: true } {
    if (!this.finish) this.finish = finish;
    return { delta: this.eager ? this.release(this.text.length) : '', done: true };
  }

  private release(upto: number): string {
    if (upto <= this.sent) return '';
    const d = this.text.slice(this.sent, upto);
    this.sent = upto;
    return d;
  }
}
