/**
 * Tool-call parsing in the chat template's format, by name (`rollout.multi_turn.format`, verl's
 * `multi_turn.format`; one list, TOOL_CALL_FORMATS; an unknown name lists the valid ones):
 *
 * - `hermes` (Qwen2.5, Qwen3, Hermes 2 Pro templates): every `<tool_call>{json}</tool_call>` block in
 *   the assistant's text, the JSON `{"name": …, "arguments": {…}}`.
 * - `llama3_json` (Llama 3.1/3.2 templates with custom tools): the whole message is a JSON object
 *   `{"name": …, "parameters": {…}}` (optionally after `<|python_tag|>`; several objects may be
 *   separated by `;`). A message that does not start with `{` is a plain answer.
 *
 * A block that is there but not a valid call (bad JSON, no name, arguments not an object, an
 * unclosed tag) is a `malformed` entry with the reason: the tools environment answers it to the
 * model as an error and counts it, it never ends the episode.
 */
import { ConfigError } from '../errors.ts';

export interface ToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

export interface ParsedToolCalls {
  /** Well-formed calls, in order. */
  calls: ToolCall[];
  /** Call attempts that could not be parsed: the offending text and what is wrong with it. */
  malformed: Array<{ text: string; reason: string }>;
}

/** `{name, <argsKey>}` as a call, or the reason it is not one. */
function callFrom(raw: string, argsKeys: readonly string[]): ToolCall | string {
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch (e) {
    return `not JSON (${(e as Error).message})`;
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return 'not a JSON object {"name": …, …}';
  const o = v as Record<string, unknown>;
  if (typeof o.name !== 'string' || o.name.length === 0) return 'no "name" string';
  const key = argsKeys.find((k) => k in o);
  let args: unknown = key === undefined ? {} : o[key];
  // some models write the arguments as a JSON string (OpenAI's wire format does)
  if (typeof args === 'string') {
    try {
      args = JSON.parse(args);
    } catch {
      return `"${key}" is a string that is not JSON`;
    }
  }
  if (args === null || typeof args !== 'object' || Array.isArray(args)) return `"${key}" is not a JSON object`;
  return { name: o.name, arguments: args as Record<string, unknown> };
}

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';

function parseHermes(text: string): ParsedToolCalls {
  const out: ParsedToolCalls = { calls: [], malformed: [] };
  let at = 0;
  for (;;) {
    const i = text.indexOf(OPEN, at);
    if (i < 0) break;
    const j = text.indexOf(CLOSE, i + OPEN.length);
    if (j < 0) {
      out.malformed.push({ text: text.slice(i), reason: `${OPEN} without ${CLOSE}` });
      break;
    }
    const body = text.slice(i + OPEN.length, j).trim();
    const c = callFrom(body, ['arguments', 'parameters']);
    if (typeof c === 'string') out.malformed.push({ text: body, reason: c });
    else out.calls.push(c);
    at = j + CLOSE.length;
  }
  return out;
}

const PYTHON_TAG = '<|python_tag|>';

function parseLlama3Json(text: string): ParsedToolCalls {
  const out: ParsedToolCalls = { calls: [], malformed: [] };
  let t = text.trim();
  if (t.startsWith(PYTHON_TAG)) t = t.slice(PYTHON_TAG.length).trim();
  if (!t.startsWith('{')) return out;
  // objects separated by ';' (a ';' inside a JSON string is kept: split only where the text before parses)
  let start = 0;
  for (let k = 0; k <= t.length; k++) {
    if (k < t.length && t[k] !== ';') continue;
    const piece = t.slice(start, k).trim();
    if (k < t.length) {
      try {
        JSON.parse(piece);
      } catch {
        continue;
      }
    }
    if (piece.length > 0) {
      const c = callFrom(piece, ['parameters', 'arguments']);
      if (typeof c === 'string') out.malformed.push({ text: piece, reason: c });
      else out.calls.push(c);
    }
    start = k + 1;
  }
  return out;
}

const FORMATS: Record<string, { parse(text: string): ParsedToolCalls; write(call: ToolCall): string }> = {
  hermes: {
    parse: parseHermes,
    // '</' written as '<\/' (the same JSON string) so an argument cannot close the block
    write: (c) =>
      `${OPEN}\n${JSON.stringify({ name: c.name, arguments: c.arguments }).replaceAll('</', '<\\/')}\n${CLOSE}`,
  },
  llama3_json: {
    parse: parseLlama3Json,
    write: (c) => JSON.stringify({ name: c.name, parameters: c.arguments }),
  },
};

/** The tool-call formats by name. */
export const TOOL_CALL_FORMATS = Object.keys(FORMATS) as readonly string[];

function format(name: string) {
  const f = FORMATS[name];
  if (!f)
    throw new ConfigError(
      `unknown rollout.multi_turn.format "${name}" (valid tool-call formats: ${TOOL_CALL_FORMATS.join(', ')})`,
    );
  return f;
}

/** The parser of a format; an unknown name lists the valid ones. */
export function toolCallParser(name: string): (text: string) => ParsedToolCalls {
  return format(name).parse;
}

/** A call as the policy writes it in a format (demonstrations for SFT; parsing it gives the call back). */
export function formatToolCall(name: string, call: ToolCall): string {
  return format(name).write(call);
}
