/**
 * The OpenAI-compatible request bodies `serve-policy` accepts (zod; unknown fields are ignored, as
 * OpenAI and vLLM do), with vLLM's RL extensions (`prompt` as token ids, `return_token_ids`,
 * `top_k`, `stop_token_ids`, `ignore_eos`, `request_id`) and rlstream's `rlstream_seed` (the run-level seed the
 * rollout stage keys its sampling randomness with, so a response is the very one `engine: onnx` draws).
 */
import { z } from 'zod';
import { MAX_TOP_LOGPROBS } from '../model/decode-graph.ts';

const tokenIds = z.array(z.int().gte(0, 'token ids are ≥ 0')).min(1, 'a token-id prompt must not be empty');

const common = {
  model: z.string({ error: 'is required (a model name from GET /v1/models)' }),
  n: z.int().gte(1).lte(128).default(1),
  temperature: z.number().gte(0).lte(100).nullish(),
  top_p: z.number().gt(0).lte(1).nullish(),
  top_k: z.int().gte(-1).nullish(),
  max_tokens: z.int().gte(1).nullish(),
  stop: z.union([z.string(), z.array(z.string()).max(16)]).nullish(),
  stop_token_ids: z.array(z.int().gte(0)).nullish(),
  ignore_eos: z.boolean().nullish(),
  seed: z.int().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.looseObject({ include_usage: z.boolean().nullish() }).nullish(),
  return_token_ids: z.boolean().nullish(),
  request_id: z.string().min(1).max(256).nullish(),
  rlstream_seed: z.union([z.int(), z.string()]).nullish(),
  presence_penalty: z.literal(0, 'is not supported (only 0)').nullish(),
  frequency_penalty: z.literal(0, 'is not supported (only 0)').nullish(),
};

export const completionRequestSchema = z.looseObject({
  ...common,
  prompt: z.union([z.string(), z.array(z.string()).min(1), tokenIds, z.array(tokenIds).min(1)], {
    error: 'must be a string, a list of strings, a list of token ids or a list of token-id lists',
  }),
  logprobs: z
    .int()
    .gte(0)
    .lte(MAX_TOP_LOGPROBS, `at most ${MAX_TOP_LOGPROBS} most likely tokens per position`)
    .nullish(),
  echo: z.literal(false, 'echo is not supported').nullish(),
  suffix: z.null('suffix is not supported').optional(),
});
export type CompletionRequest = z.infer<typeof completionRequestSchema>;

const textPart = z.looseObject({ type: z.literal('text'), text: z.string() });
const messageSchema = z.looseObject({
  role: z.enum(['system', 'user', 'assistant', 'tool', 'developer']),
  content: z.union([z.string(), z.array(textPart), z.null()]).optional(),
});

export const chatRequestSchema = z.looseObject({
  ...common,
  messages: z.array(messageSchema).min(1, 'must hold at least one message'),
  max_completion_tokens: z.int().gte(1).nullish(),
  logprobs: z.boolean().nullish(),
  top_logprobs: z
    .int()
    .gte(0)
    .lte(MAX_TOP_LOGPROBS, `at most ${MAX_TOP_LOGPROBS} most likely tokens per position`)
    .nullish(),
  tools: z.array(z.looseObject({ type: z.string() })).nullish(),
  tool_choice: z.unknown().optional(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  add_generation_prompt: z.boolean().nullish(),
});
export type ChatRequest = z.infer<typeof chatRequestSchema>;

/** SGLang's `POST /update_weights_from_disk` body. */
export const updateWeightsSchema = z.looseObject({
  model_path: z.string().min(1, 'must name the policy directory to load'),
  load_format: z.string().nullish(),
  weight_version: z.union([z.string(), z.int()]).nullish(),
  abort_all_requests: z.boolean().nullish(),
});

export function zodMessage(err: z.ZodError): { message: string; param: string | null } {
  const first = err.issues[0];
  return {
    message: err.issues
      .slice(0, 3)
      .map((i) => `${i.path.map(String).join('.') || 'body'}: ${i.message}`)
      .join('; '),
    param: first ? first.path.map(String).join('.') || null : null,
  };
}
