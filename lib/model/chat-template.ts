/**
 * Chat templates: a tokenizer's Jinja `chat_template` rendered with @huggingface/jinja the way
 * transformers' `apply_chat_template` does — trim_blocks and lstrip_blocks on, the context is
 * `messages`, `add_generation_prompt`, the tokenizer's special-token strings (`bos_token`,
 * `eos_token`, `pad_token`, `unk_token`; unset ones stay undefined, as transformers passes None),
 * then the caller's template kwargs (e.g.
 * Qwen3's `enable_thinking: false`), which override the rest. `raise_exception` and
 * `strftime_now` come from the engine.
 */
import { Template } from '@huggingface/jinja';
import { ConfigError } from '../errors.ts';

export interface ChatMessage {
  role: string;
  content: string;
  [key: string]: unknown;
}

export interface RenderOptions {
  /** End with the assistant turn's opening (the prompt a response continues); default true. */
  addGenerationPrompt?: boolean;
  /** Extra template variables (transformers' **kwargs of apply_chat_template). */
  kwargs?: Record<string, unknown>;
}

export class ChatTemplate {
  private readonly template: Template;

  /**
   * @param source the template text (tokenizer_config.json `chat_template`, or chat_template.jinja)
   * @param specials special-token strings of the tokenizer (null or absent: undefined in the template)
   * @param where what to name in errors (the file the template came from)
   */
  constructor(
    readonly source: string,
    private readonly specials: Readonly<Record<string, string | string[] | null | undefined>> = {},
    private readonly where = 'chat template',
  ) {
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new ConfigError(`${where}: the chat template does not parse (${(e as Error).message})`);
    }
  }

  render(messages: ChatMessage[], opts: RenderOptions = {}): string {
    const ctx: Record<string, unknown> = { messages, add_generation_prompt: opts.addGenerationPrompt ?? true };
    for (const [k, v] of Object.entries(this.specials)) if (v !== null && v !== undefined) ctx[k] = v;
    Object.assign(ctx, opts.kwargs ?? {});
    try {
      return this.template.render(ctx);
    } catch (e) {
      throw new ConfigError(`${this.where}: rendering ${messages.length} message(s) failed: ${(e as Error).message}`);
    }
  }
}

/**
 * The messages of a prompt: chat messages as given (verl's parquet `prompt`: a list of
 * {role, content}) or a string wrapped as one user message; `system` (if set and the messages
 * have no system message) is put first. Anything else is a ConfigError naming what was found.
 */
export function promptMessages(prompt: unknown, system: string | null = null, where = 'prompt'): ChatMessage[] {
  let msgs: ChatMessage[];
  if (typeof prompt === 'string') msgs = [{ role: 'user', content: prompt }];
  else if (Array.isArray(prompt)) {
    msgs = prompt.map((m, i) => {
      if (
        !m ||
        typeof m !== 'object' ||
        typeof (m as { role?: unknown }).role !== 'string' ||
        typeof (m as { content?: unknown }).content !== 'string'
      ) {
        throw new ConfigError(
          `${where}: message ${i} is ${JSON.stringify(m)?.slice(0, 80)}; each chat message needs a string role and a string content`,
        );
      }
      return { ...(m as ChatMessage) };
    });
    if (msgs.length === 0) throw new ConfigError(`${where}: the chat message list is empty`);
  } else
    throw new ConfigError(
      `${where}: a prompt is a string or a list of {role, content} messages, got ${JSON.stringify(prompt)?.slice(0, 80)}`,
    );
  if (system !== null && msgs[0].role !== 'system') msgs.unshift({ role: 'system', content: system });
  return msgs;
}
