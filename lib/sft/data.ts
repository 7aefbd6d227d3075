/**
 * `rlstream sft`'s rows: JSONL or parquet records (data.train_files) with a prompt + response
 * (sft.prompt_key, sft.response_key) or a conversation (sft.messages_key), rendered through the
 * model's chat template and tokenized with the loss on the assistant tokens only.
 *
 * With a chat template, the conversation is rendered once (transformers' apply_chat_template, no
 * generation prompt) and cut at each assistant turn's content, found in order; the pieces are
 * tokenized one by one. The loss is on each reply's tokens and on the stop token that closes it
 * (e.g. <|im_end|>); the template's glue around them is context. For a prompt + response row the
 * text before the reply is exactly the prompt `rlstream train` feeds the policy (the generation
 * prompt, lib/pipeline/data.ts renderPrompt; Qwen3's empty think block included). Cutting at the
 * contents rather than rendering turn by turn keeps templates that write earlier turns
 * differently (Qwen3 drops their think blocks) working. Without a template (byte,
 * alphabet tokenizers) a row is the prompt with the tokenizer's specials, then the response and EOS;
 * a conversation is tokenised as a multi-turn episode is (episodeConversation below).
 *
 * A row without a response, without an assistant turn, or longer than sft.max_length is a bad row:
 * one line naming its file:line and what to change; data.on_bad_row = skip reports it instead.
 */
import type { Config } from '../config/index.ts';
import { ConfigError } from '../errors.ts';
import { getPath, readRecords } from '../data/dataset.ts';
import { promptMessages, type ChatMessage } from '../model/chat-template.ts';
import type { Tokenizer } from '../model/tokenizer.ts';
import { promptRendering, type PromptRendering } from '../pipeline/data.ts';
import type { SftExample } from './logic.ts';

export interface SftData {
  examples: SftExample[];
  /** Rows skipped (data.on_bad_row = skip): file:line and why. */
  skipped: Array<{ where: string; reason: string }>;
}

type Parsed = { messages: ChatMessage[]; promptOnly: string | null; response: string | null } | { reason: string };

/** A record as a conversation: sft.messages_key, or sft.prompt_key + sft.response_key. */
export function parseSftRow(rec: unknown, cfg: Pick<Config, 'sft' | 'data'>, r: PromptRendering): Parsed {
  const { prompt_key: pk, response_key: rk, messages_key: mk } = cfg.sft;
  if (rec === null || typeof rec !== 'object' || Array.isArray(rec))
    return {
      reason: `a row is a JSON object with "${pk}" + "${rk}" or "${mk}", got ${JSON.stringify(rec)?.slice(0, 60)}`,
    };
  const conv = getPath(rec, mk);
  if (conv !== undefined && conv !== null) {
    let msgs: ChatMessage[];
    try {
      msgs = promptMessages(conv, r.systemPrompt, `"${mk}"`);
    } catch (e) {
      return { reason: (e as Error).message };
    }
    if (!msgs.some((m) => m.role === 'assistant')) {
      return {
        reason: `no assistant turn in "${mk}" (roles: ${[...new Set(msgs.map((m) => m.role))].join(', ')}); the loss is on assistant turns — add the assistant's reply ({role: assistant, content: …})`,
      };
    }
    if (msgs[0].role === 'assistant')
      return { reason: `"${mk}" starts with an assistant turn; an assistant turn needs a prompt before it` };
    return { messages: msgs, promptOnly: null, response: null };
  }
  const prompt = getPath(rec, pk);
  if (prompt === undefined || prompt === null)
    return {
      reason: `no "${pk}" (sft.prompt_key) and no "${mk}" (sft.messages_key); give a prompt + response or a conversation`,
    };
  const response = getPath(rec, rk);
  if (typeof response !== 'string' || response.length === 0) {
    return {
      reason: `no response: "${rk}" (sft.response_key) is ${response === undefined ? 'missing' : JSON.stringify(response)?.slice(0, 40)}; give the target reply as a non-empty string (or the conversation in "${mk}")`,
    };
  }
  const content = typeof prompt === 'string' && r.formatPrompt ? r.formatPrompt.render(prompt) : prompt;
  let msgs: ChatMessage[];
  try {
    msgs = promptMessages(content, r.systemPrompt, `"${pk}"`);
  } catch (e) {
    return { reason: (e as Error).message };
  }
  return {
    messages: [...msgs, { role: 'assistant', content: response }],
    promptOnly: typeof content === 'string' ? content : null,
    response,
  };
}

/** Token ids and loss mask of a conversation; a string is why it cannot be tokenized. */
export function tokenizeConversation(
  tok: Tokenizer,
  p: Extract<Parsed, { messages: ChatMessage[] }>,
  r: PromptRendering,
): { tokens: Int32Array; mask: Uint8Array; promptTokens: number } | string {
  const ids: number[] = [],
    mask: number[] = [];
  const stops = new Set(tok.stopIds);
  if (r.applyChatTemplate && tok.chatTemplate) {
    // the whole conversation rendered once, cut at each assistant turn's content (in order)
    const full = tok.chatTemplate.render(p.messages, { addGenerationPrompt: false, kwargs: r.chatTemplateKwargs });
    const segments: Array<{ text: string; loss: boolean }> = [];
    let at = 0;
    for (let i = 0; i < p.messages.length; i++) {
      const m = p.messages[i];
      if (m.role !== 'assistant') continue;
      if (m.content.length === 0) return `assistant turn ${i} is empty; give it the reply to train on`;
      const k = full.indexOf(m.content, at);
      if (k < 0)
        return `the chat template does not write assistant turn ${i}'s content as given (it rewrites it), so its tokens cannot be found; give the reply as the template writes it, or one row per assistant turn`;
      segments.push({ text: full.slice(at, k), loss: false }, { text: m.content, loss: true });
      at = k + m.content.length;
    }
    segments.push({ text: full.slice(at), loss: false });
    let promptTokens = -1;
    let afterReply = false;
    for (const seg of segments) {
      const enc = seg.text ? tok.encode(seg.text) : new Int32Array(0);
      // the end-of-turn token that closes a reply (e.g. <|im_end|>) is what the policy must learn to emit to stop
      let stopAt = -1;
      if (afterReply)
        for (let j = 0; j < enc.length; j++)
          if (stops.has(enc[j])) {
            stopAt = j;
            break;
          }
      if (seg.loss && promptTokens < 0) promptTokens = ids.length;
      enc.forEach((id, j) => {
        ids.push(id);
        mask.push(seg.loss || j <= stopAt ? 1 : 0);
      });
      afterReply = seg.loss;
    }
    return { tokens: Int32Array.from(ids), mask: Uint8Array.from(mask), promptTokens };
  }
  if (p.promptOnly === null || p.response === null) return episodeConversation(tok, p.messages);
  for (const id of tok.encode(p.promptOnly, { addSpecialTokens: true })) {
    ids.push(id);
    mask.push(0);
  }
  const promptTokens = ids.length;
  for (const id of tok.encode(p.response)) {
    ids.push(id);
    mask.push(1);
  }
  ids.push(tok.eos);
  mask.push(1);
  return { tokens: Int32Array.from(ids), mask: Uint8Array.from(mask), promptTokens };
}

/**
 * A conversation without a chat template, tokenised as a multi-turn episode is
 * (lib/model/episode-tokens.ts): the first user message with the tokenizer's specials (the
 * prompt), each assistant reply then EOS (the loss), each other message's content without
 * specials (the environment's and tools' answers: context).
 */
function episodeConversation(
  tok: Tokenizer,
  msgs: readonly ChatMessage[],
): { tokens: Int32Array; mask: Uint8Array; promptTokens: number } | string {
  if (msgs[0].role !== 'user')
    return `without a chat template a conversation starts with the user's prompt, not a ${msgs[0].role} message; write a system prompt into the user message`;
  const ids: number[] = [],
    mask: number[] = [];
  const push = (a: ArrayLike<number>, m: number) => {
    for (let i = 0; i < a.length; i++) {
      ids.push(a[i]);
      mask.push(m);
    }
  };
  push(tok.encode(msgs[0].content, { addSpecialTokens: true }), 0);
  const promptTokens = ids.length;
  for (const m of msgs.slice(1)) {
    if (m.role === 'assistant') push([...tok.encode(m.content, { addSpecialTokens: false }), tok.eos], 1);
    else push(tok.encode(m.content, { addSpecialTokens: false }), 0);
  }
  return { tokens: Int32Array.from(ids), mask: Uint8Array.from(mask), promptTokens };
}

/** The training examples of data.train_files, tokenized with `tok`. */
export async function loadSftExamples(cfg: Config, tok: Tokenizer): Promise<SftData> {
  const r = promptRendering(cfg);
  if (r.systemPrompt !== null && !(r.applyChatTemplate && tok.chatTemplate)) {
    throw new ConfigError(
      'data.system_prompt needs a chat template to go into, and the tokenizer has none (or data.apply_chat_template is false); unset data.system_prompt or write it into the rows',
    );
  }
  const out: SftData = { examples: [], skipped: [] };
  const max = cfg.sft.max_length;
  const bad = (where: string, reason: string) => {
    if (cfg.data.on_bad_row === 'stop')
      throw new ConfigError(`${where}: ${reason} (or set data.on_bad_row=skip to skip such rows)`);
    out.skipped.push({ where, reason });
  };
  for (const file of cfg.data.train_files) {
    for (const rec of await readRecords(file, cfg.data.format)) {
      if (cfg.data.max_rows && out.examples.length >= cfg.data.max_rows) break;
      const where = `${file}:${rec.line}`;
      if ('error' in rec) {
        bad(where, rec.error);
        continue;
      }
      const parsed = parseSftRow(rec.rec, cfg, r);
      if ('reason' in parsed) {
        bad(where, parsed.reason);
        continue;
      }
      let t: ReturnType<typeof tokenizeConversation>;
      try {
        t = tokenizeConversation(tok, parsed, r);
      } catch (e) {
        bad(where, `cannot be rendered or tokenized: ${(e as Error).message}`);
        continue;
      }
      if (typeof t === 'string') {
        bad(where, t);
        continue;
      }
      if (t.tokens.length > max) {
        bad(
          where,
          `prompt + response is ${t.tokens.length} tokens (prompt ${t.promptTokens}, response ${t.tokens.length - t.promptTokens}), over sft.max_length = ${max}; raise sft.max_length or shorten the row`,
        );
        continue;
      }
      out.examples.push({ tokens: t.tokens, mask: t.mask, source: where });
    }
  }
  if (out.examples.length === 0) {
    throw new ConfigError(
      `no usable rows in ${cfg.data.train_files.join(', ')}${out.skipped.length ? ` (${out.skipped.length} bad rows skipped; first: ${out.skipped[0].where}: ${out.skipped[0].reason})` : ''}`,
    );
  }
  return out;
}
