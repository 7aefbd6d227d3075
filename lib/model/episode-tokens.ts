/**
 * Token-exact multi-turn episodes (token in, token out). An episode's response is the
 * concatenation of the policy's sampled turns and the environment's messages between them:
 *
 *   prompt_ids | sampled₁ | env₁ | sampled₂ | env₂ | … | sampledₖ
 *
 * Sampled ids are kept as sampled (never decoded and encoded again). Each environment segment
 * is tokenised alone, as the chat template renders it after the conversation so far: the
 * conversation is rendered with the last assistant message's content replaced by a sentinel,
 * the environment's messages after it and the generation prompt; the text after the sentinel is
 * the assistant turn's closing (the stop token the policy sampled, then the separator the
 * template writes between messages, e.g. Qwen's "\n" after <|im_end|>), the environment's
 * messages and the next assistant opening. It is encoded without added specials, and its first
 * id — the stop token the policy already sampled — is dropped. Where the policy stopped by
 * length (no stop token), the template's whole closing is environment tokens.
 *
 * Where a template is append-only (Llama 3; Qwen3 without <think> blocks), the assembled ids
 * equal the full conversation's rendering, tokenised (test/unit/model/episode-tokens.test.ts
 * against Python jinja2 + native tokenizers). Qwen3's template is not append-only: it drops the
 * <think>…</think> block of assistant turns before the last user message; the episode keeps the
 * sampled tokens (what the policy saw and produced), so it differs from a re-rendering exactly
 * by those blocks (docs/agents.md).
 *
 * Without a chat template (the built-in byte and alphabet tokenizers) an environment segment is
 * its messages' contents, encoded without specials, one after another.
 */
import { ConfigError } from '../errors.ts';
import type { ChatMessage } from './chat-template.ts';
import type { Tokenizer } from './tokenizer.ts';

/** Stands in for the last assistant message's content while its closing is located. */
const SENTINEL = '\u2063rlstream-assistant-turn\u2063';

export interface EnvSegmentInput {
  /** The conversation so far: the prompt's messages, then assistant and environment messages; the last is the assistant turn just sampled. */
  history: readonly ChatMessage[];
  /** The environment's messages answering it. */
  messages: readonly ChatMessage[];
  /** The stop id the assistant turn ended with (its last sampled id), or null when it stopped by length. */
  stopId: number | null;
}

export class EpisodeTokenizer {
  constructor(
    private readonly tok: Tokenizer,
    private readonly kwargs: Record<string, unknown> = {},
  ) {}

  /** Whether environment segments go through the chat template. */
  get templated(): boolean {
    return this.tok.chatTemplate !== null;
  }

  /** The ids of the environment's messages after the conversation so far (see the file comment). */
  envSegment(x: EnvSegmentInput): Int32Array {
    if (!this.tok.chatTemplate) {
      const parts = x.messages.map((m) => this.tok.encode(m.content, { addSpecialTokens: false }));
      const out = new Int32Array(parts.reduce((a, p) => a + p.length, 0));
      let o = 0;
      for (const p of parts) {
        out.set(p, o);
        o += p.length;
      }
      return out;
    }
    const last = x.history[x.history.length - 1];
    if (!last || last.role !== 'assistant')
      throw new Error('internal: an environment segment follows an assistant message');
    const msgs: ChatMessage[] = [...x.history.slice(0, -1), { ...last, content: SENTINEL }, ...x.messages];
    const text = this.tok.chatTemplate.render(msgs, { addGenerationPrompt: true, kwargs: this.kwargs });
    const at = text.indexOf(SENTINEL);
    if (at < 0 || text.indexOf(SENTINEL, at + 1) >= 0)
      throw new ConfigError(
        'chat template: the assistant message content does not appear exactly once in its rendering, so environment messages cannot be placed token-exactly',
      );
    const ids = this.tok.encode(text.slice(at + SENTINEL.length), { addSpecialTokens: false });
    if (x.stopId === null) return ids;
    if (ids[0] !== x.stopId)
      throw new ConfigError(
        `chat template: an assistant turn is closed by id ${ids[0]}, not by the stop id ${x.stopId} the policy sampled; set rollout stop ids (generation_config.json eos_token_id) to the template's end-of-turn token`,
      );
    return ids.subarray(1);
  }
}
