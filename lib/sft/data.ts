/**
 * `rlstream sft`'s rows: JSONL or parquet records (data.train_files) with a prompt + response
 * (sft.prompt_key, sft.response_key) or a conversation (sft.messages_key), rendered through the
 * model's chat template and tokenized with the loss on the assistant tokens only.
 *
 * With a chat template, assistant turn i is cut out of the rendering as transformers renders it:
 * the turns before it with the generation prompt added (exactly the prompt `rlstream train` feeds
 * the policy, lib/pipeline/data.ts renderPrompt) and the turns up to it without; the text between
 * is the response, whose tokens up to and including the first stop token (e.g. <|im_end|>) carry
 * the loss — what follows it (the template's newline) is context. Without a template (byte,
 * alphabet tokenizers) a row is the prompt with the tokenizer's specials, then the response and EOS.
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
  if (rec === null || typeof rec !== 'object' || Array.isArray(rec)) return { reason: `a row is a JSON object with "${pk}" + "${rk}" or "${mk}", got ${JSON.stringify(rec)?.slice(0, 60)}` };
  const conv = getPath(rec, mk);
  if (conv !== undefined && conv !== null) {
    let msgs: ChatMessage[];
    try { msgs = promptMessages(conv, r.systemPrompt, `"${mk}"`); } catch (e) { return { reason: (e as Error).message }; }
    if (!msgs.some((m) => m.role === 'assistant')) {
      return { reason: `no assistant turn in "${mk}" (roles: ${[...new Set(msgs.map((m) => m.role))].join(', ')}); the loss is on assistant turns — add the assistant's reply ({role: assistant, content: …})` };
    }
    if (msgs[0].role === 'assistant') return { reason: `"${mk}" starts with an assistant turn; an assistant turn needs a prompt before it` };
    return { messages: msgs, promptOnly: null, response: null };
  }
  const prompt = getPath(rec, pk);
  if (prompt === undefined || prompt === null) return { reason: `no "${pk}" (sft.prompt_key) and no "${mk}" (sft.messages_key); give a prompt + response or a conversation` };
  const response = getPath(rec, rk);
  if (typeof response !== 'string' || response.length === 0) {
    return { reason: `no response: "${rk}" (sft.response_key) is ${response === undefined ? 'missing' : JSON.stringify(response)?.slice(0, 40)}; give the target reply as a non-empty string (or the conversation in "${mk}")` };
  }
  const content = typeof prompt === 'string' && r.formatPrompt ? r.formatPrompt.render(prompt) : prompt;
  let msgs: ChatMessage[];
  try { msgs = promptMessages(content, r.systemPrompt, `"${pk}"`); } catch (e) { return { reason: (e as Error).message }; }
  return { messages: [...msgs, { role: 'assistant', content: response }], promptOnly: typeof content === 'string' ? content : null, response };
}

/** Token ids and loss mask of a conversation; a string is why it cannot be tokenized. */
export function tokenizeConversation(tok: Tokenizer, p: Extract<Parsed, { messages: ChatMessage[] }>, r: PromptRendering): { tokens: Int32Array; mask: Uint8Array; promptTokens: number } | string {
  const ids: number[] = [], mask: number[] = [];
  const stops = new Set(tok.stopIds);
  if (r.applyChatTemplate && tok.chatTemplate) {
    const tpl = tok.chatTemplate;
    let text = '';
    let promptTokens = -1;
    for (let i = 0; i < p.messages.length; i++) {
      if (p.messages[i].role !== 'assistant') continue;
      const prefix = tpl.render(p.messages.slice(0, i), { addGenerationPrompt: true, kwargs: r.chatTemplateKwargs });
      if (!prefix.startsWith(text)) return `the chat template renders the turns before assistant turn ${i} differently from the conversation so far (it rewrites earlier turns), so the turns cannot be cut apart; split the conversation into one row per assistant turn`;
      for (const id of tok.encode(prefix.slice(text.length))) { ids.push(id); mask.push(0); }
      if (promptTokens < 0) promptTokens = ids.length;
      const full = tpl.render(p.messages.slice(0, i + 1), { addGenerationPrompt: false, kwargs: r.chatTemplateKwargs });
      if (!full.startsWith(prefix)) return `the chat template's rendering of assistant turn ${i} does not begin with its generation prompt, so the response cannot be cut out`;
      let inLoss = true;
      for (const id of tok.encode(full.slice(prefix.length))) { ids.push(id); mask.push(inLoss ? 1 : 0); if (stops.has(id)) inLoss = false; }
      text = full;
    }
    return { tokens: Int32Array.from(ids), mask: Uint8Array.from(mask), promptTokens };
  }
  if (p.promptOnly === null || p.response === null) return 'a conversation (or a chat-message prompt) needs a chat template, and the tokenizer has none (or data.apply_chat_template = false); give a string prompt + response, or use a model directory whose tokenizer has a chat_template';
  for (const id of tok.encode(p.promptOnly, { addSpecialTokens: true })) { ids.push(id); mask.push(0); }
  const promptTokens = ids.length;
  for (const id of tok.encode(p.response)) { ids.push(id); mask.push(1); }
  ids.push(tok.eos); mask.push(1);
  return { tokens: Int32Array.from(ids), mask: Uint8Array.from(mask), promptTokens };
}

/** The training examples of data.train_files, tokenized with `tok`. */
export async function loadSftExamples(cfg: Config, tok: Tokenizer): Promise<SftData> {
  const r = promptRendering(cfg);
  if (r.systemPrompt !== null && !(r.applyChatTemplate && tok.chatTemplate)) {
    throw new ConfigError('data.system_prompt needs a chat template to go into, and the tokenizer has none (or data.apply_chat_template is false); unset data.system_prompt or write it into the rows');
  }
  const out: SftData = { examples: [], skipped: [] };
  const max = cfg.sft.max_length;
  const bad = (where: string, reason: string) => {
    if (cfg.data.on_bad_row === 'stop') throw new ConfigError(`${where}: ${reason} (or set data.on_bad_row=skip to skip such rows)`);
    out.skipped.push({ where, reason });
  };
  for (const file of cfg.data.train_files) {
    for (const rec of await readRecords(file, cfg.data.format)) {
      if (cfg.data.max_rows && out.examples.length >= cfg.data.max_rows) break;
      const where = `${file}:${rec.line}`;
      if ('error' in rec) { bad(where, rec.error); continue; }
      const parsed = parseSftRow(rec.rec, cfg, r);
      if ('reason' in parsed) { bad(where, parsed.reason); continue; }
      let t: ReturnType<typeof tokenizeConversation>;
      try { t = tokenizeConversation(tok, parsed, r); } catch (e) { bad(where, `cannot be rendered or tokenized: ${(e as Error).message}`); continue; }
      if (typeof t === 'string') { bad(where, t); continue; }
      if (t.tokens.length > max) {
        bad(where, `prompt + response is ${t.tokens.length} tokens (prompt ${t.promptTokens}, response ${t.tokens.length - t.promptTokens}), over sft.max_length = ${max}; raise sft.max_length or shorten the row`);
        continue;
      }
      out.examples.push({ tokens: t.tokens, mask: t.mask, source: where });
    }
  }
  if (out.examples.length === 0) {
    throw new ConfigError(`no usable rows in ${cfg.data.train_files.join(', ')}${out.skipped.length ? ` (${out.skipped.length} bad rows skipped; first: ${out.skipped[0].where}: ${out.skipped[0].reason})` : ''}`);
  }
  return out;
}
