/**
 * The tool port: OpenAI-style function schemas the chat template lists for the policy (its `tools`
 * argument), and an executor that runs a parsed call. Executors: a JS/TS module exporting one
 * function per tool (tool-module.ts) and HTTP endpoints (tool-http.ts); the tools environment
 * (tools-env.ts) parses the policy's calls, runs them and answers with `tool` messages.
 *
 * Schemas come inline (`rollout.multi_turn.tools`) or from verl's tool config file
 * (`rollout.multi_turn.tool_config_path`: YAML or JSON `tools: [{tool_schema: {type: function,
 * function: {…}}, class_name?, config?}]`; class_name and config name verl's Python classes and
 * are not used here: every tool runs through `rollout.multi_turn.tool_executor`).
 */
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { ConfigError } from '../errors.ts';

/** One tool as the chat template and the OpenAI API describe it. */
export const toolSchemaZod = z
  .object({
    type: z.literal('function'),
    function: z
      .object({
        name: z.string().regex(/^[A-Za-z_][A-Za-z0-9_.-]*$/, 'a tool name is letters, digits, _ . -'),
        description: z.string().optional(),
        parameters: z.record(z.string(), z.unknown()).optional(),
      })
      .passthrough(),
  })
  .passthrough();

export type ToolSchema = z.infer<typeof toolSchemaZod>;

/** What an executor call knows besides the arguments. */
export interface ToolContext {
  episode_id: string;
}

/** A failed call: its message goes back to the model as the tool's answer. */
export class ToolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ToolError';
  }
}

export interface ToolExecutor {
  /** Names the adapter and target in errors (module:<path>, http:<url>). */
  readonly name: string;
  /** The call's result (a string as is, anything else as JSON text); throws on failure. */
  call(tool: string, args: Record<string, unknown>, ctx: ToolContext): Promise<unknown>;
}

/** verl's tool config file: `tools: [{tool_schema, class_name?, config?}]`. */
const toolFileZod = z.object({
  tools: z.array(
    z.object({ tool_schema: toolSchemaZod, class_name: z.string().optional(), config: z.unknown().optional() }),
  ),
});

const issues = (e: z.ZodError) => e.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');

/** The run's tool schemas: the file's, then the inline ones; a name given twice is a ConfigError. */
export function loadToolSchemas(o: { tool_config_path: string | null; tools: readonly unknown[] }): ToolSchema[] {
  const out: ToolSchema[] = [];
  if (o.tool_config_path) {
    let raw: unknown;
    try {
      raw = parseYaml(readFileSync(o.tool_config_path, 'utf8'));
    } catch (e) {
      throw new ConfigError(
        `rollout.multi_turn.tool_config_path: cannot read ${o.tool_config_path} (${(e as Error).message})`,
      );
    }
    const r = toolFileZod.safeParse(raw);
    if (!r.success)
      throw new ConfigError(
        `rollout.multi_turn.tool_config_path: ${o.tool_config_path} is verl's tool config, tools: [{tool_schema: {type: function, function: {name, description, parameters}}}] (${issues(r.error)})`,
      );
    out.push(...r.data.tools.map((t) => t.tool_schema));
  }
  o.tools.forEach((t, i) => {
    const r = toolSchemaZod.safeParse(t);
    if (!r.success)
      throw new ConfigError(
        `rollout.multi_turn.tools[${i}]: a tool is {type: function, function: {name, description, parameters}} (${issues(r.error)})`,
      );
    out.push(r.data);
  });
  const seen = new Set<string>();
  for (const t of out) {
    if (seen.has(t.function.name))
      throw new ConfigError(`rollout.multi_turn: the tool "${t.function.name}" is defined twice; give each tool once`);
    seen.add(t.function.name);
  }
  return out;
}

/** A tool's result as the text of its `tool` message. */
export function toolResultText(v: unknown): string {
  if (typeof v === 'string') return v;
  return JSON.stringify(v) ?? 'null';
}
