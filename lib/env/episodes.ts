/**
 * Runs multi-turn episodes concurrently (continuous batching across episodes): every episode is
 * its own async loop — sample an assistant turn, ask the environment, place its answer
 * token-exactly (lib/model/episode-tokens.ts) — and the generation requests of all episodes that
 * are waiting for the policy go into one batch, generated while other episodes wait on their
 * environment. A slow environment only delays its own episode.
 *
 * Determinism: each turn's randomness is keyed by `<episode id>/t<turn>` (lib/model/sample.ts),
 * so an episode's tokens do not depend on which other episodes shared its batches; with a
 * deterministic environment a re-run (after a crash) gives the same episode.
 *
 * An environment failure (EnvError: timeout, crash, bad reply, unreachable) ends the episode
 * with `failure` set; its reward is then no reward (the reward stage records the failure), never 0.
 */
import type { Episode, EpisodeTurn } from '../contracts/index.ts';
import type { EpisodeTokenizer } from '../model/episode-tokens.ts';
import type { ChatMessage } from '../model/chat-template.ts';
import { EnvError, type EnvEpisode, type EnvRow, type EnvStep, type Environment } from './port.ts';
import { crashPoint } from '../pipeline/crash-points.ts';

export interface TurnRequest {
  id: string;
  prompt: Int32Array;
  maxNewTokens: number;
}
export interface TurnGeneration {
  id: string;
  tokens: Int32Array;
  logprobs: Float32Array;
  finishReason: 'eos' | 'length';
}

export interface EpisodeSpec {
  /** The trajectory sample id (also the environment's episode id). */
  id: string;
  prompt: Int32Array;
  row: EnvRow;
  /** Groups requests that may share a generate call (the sampling settings). */
  samplingKey: string;
}

export interface EpisodeOptions {
  env: Environment;
  tokens: EpisodeTokenizer;
  decode(ids: ArrayLike<number>): string;
  /** Generates one turn for each request (the requests of a call share spec.samplingKey and maxNewTokens). */
  generate(key: string, reqs: TurnRequest[]): Promise<TurnGeneration[]>;
  /** The episode's token budget (all turns, policy and environment tokens). */
  maxResponseTokens: number;
  maxTokensPerTurn: number | null;
  maxAssistantTurns: number;
  maxUserTurns: number;
  gamma: number;
  maxInFlight: number;
  /** Requests per generate call at most. */
  maxBatch: number;
  now(): number;
}

export interface EpisodeResult {
  id: string;
  tokens: Int32Array;
  logprobs: Float32Array;
  /** 1 = sampled by the policy, 0 = environment tokens. */
  mask: Uint8Array;
  finishReason: 'eos' | 'length';
  episode: Episode;
}

/** Batches the turn requests of all episodes: one generate call at a time, over whatever is waiting. */
class TurnBatcher {
  private queue: Array<{
    key: string;
    req: TurnRequest;
    resolve(g: TurnGeneration): void;
    reject(e: unknown): void;
  }> = [];
  private running = false;
  constructor(private readonly o: Pick<EpisodeOptions, 'generate' | 'maxBatch'>) {}

  request(key: string, req: TurnRequest): Promise<TurnGeneration> {
    return new Promise((resolve, reject) => {
      this.queue.push({ key, req, resolve, reject });
      if (!this.running) void this.pump();
    });
  }

  private async pump(): Promise<void> {
    this.running = true;
    // let every episode that is ready this tick queue its request first
    await new Promise((r) => setImmediate(r));
    while (this.queue.length) {
      // one generate call samples every request with the same settings and the same token cap, so
      // a request only joins others with its key and its maxNewTokens (an episode's first turn is
      // not cut to the smaller cap of another episode's later turn)
      const { key, req } = this.queue[0];
      const take = this.queue
        .filter((q) => q.key === key && q.req.maxNewTokens === req.maxNewTokens)
        .slice(0, this.o.maxBatch);
      this.queue = this.queue.filter((q) => !take.includes(q));
      try {
        const out = await this.o.generate(
          key,
          take.map((t) => t.req),
        );
        take.forEach((t, i) => t.resolve(out[i]));
      } catch (e) {
        for (const t of take) t.reject(e);
      }
      await new Promise((r) => setImmediate(r));
    }
    this.running = false;
  }
}

function concat(a: Int32Array, b: readonly number[]): Int32Array {
  const out = new Int32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

async function runOne(spec: EpisodeSpec, o: EpisodeOptions, batcher: TurnBatcher): Promise<EpisodeResult> {
  const ids: number[] = [];
  const lps: number[] = [];
  const mask: number[] = [];
  const turns: EpisodeTurn[] = [];
  const metrics: Record<string, number> = {};
  // the prompt's messages stand in as one user message: an environment segment's rendering
  // depends on the messages' roles and order after it, not on the prompt's text
  const history: ChatMessage[] = [{ role: 'user', content: spec.row.prompt_text }];
  let reward = 0;
  let done = false;
  let failure: string | null = null;
  let timedOut = false;
  let finish: 'eos' | 'length' = 'eos';
  let assistantTurns = 0;
  let userTurns = 0;
  let toolCalls = 0;
  let toolErrors = 0;
  const fail = (e: unknown) => {
    if (!(e instanceof EnvError)) throw e;
    failure = `${e.kind}: ${e.message}`;
    timedOut = e.kind === 'timeout';
  };
  let ep: EnvEpisode | null = null;
  const t0 = o.now();
  try {
    ep = await o.env.start(spec.row);
  } catch (e) {
    fail(e);
    turns.push(envTurn('system', ids.length, ids.length, '', o.now() - t0, failure));
  }
  try {
    while (ep && assistantTurns < o.maxAssistantTurns) {
      const left = o.maxResponseTokens - ids.length;
      if (left <= 0) {
        finish = 'length';
        break;
      }
      const tg = o.now();
      const gen = await batcher.request(spec.samplingKey, {
        id: `${spec.id}/t${assistantTurns}`,
        prompt: concat(spec.prompt, ids),
        maxNewTokens: Math.min(o.maxTokensPerTurn ?? left, left),
      });
      const start = ids.length;
      for (let t = 0; t < gen.tokens.length; t++) {
        ids.push(gen.tokens[t]);
        lps.push(gen.logprobs[t]);
        mask.push(1);
      }
      const stopId = gen.finishReason === 'eos' ? gen.tokens[gen.tokens.length - 1] : null;
      const text = o.decode(stopId === null ? gen.tokens : gen.tokens.subarray(0, gen.tokens.length - 1));
      turns.push({ ...envTurn('assistant', start, ids.length, text, o.now() - tg, null) });
      const turnIndex = assistantTurns++;
      if (gen.finishReason === 'length' && ids.length >= o.maxResponseTokens) {
        finish = 'length'; // the episode's budget is spent
        break;
      }
      // a turn cut by max_tokens_per_turn goes to the environment as it is (no stop token: the
      // template's whole closing of the turn is then environment tokens)
      history.push({ role: 'assistant', content: text });
      const ts = o.now();
      let r;
      try {
        r = await ep.step({ role: 'assistant', content: text });
      } catch (e) {
        fail(e);
        turns.push(envTurn('system', ids.length, ids.length, '', o.now() - ts, failure));
        break;
      }
      const latency = o.now() - ts;
      crashPoint('rollout:env-answered', `${spec.id} turn ${turnIndex}`);
      toolCalls += r.tools?.length ?? 0;
      toolErrors += r.tools?.filter((t) => t.error !== null).length ?? 0;
      reward += o.gamma ** turnIndex * r.reward;
      for (const [k, v] of Object.entries(r.metrics)) metrics[k] = (metrics[k] ?? 0) + v;
      const last = r.done || assistantTurns >= o.maxAssistantTurns || userTurns >= o.maxUserTurns;
      if (last || r.messages.length === 0) {
        // nothing follows: the answer is recorded (its reward, its tool calls) but adds no tokens
        turns.push(...answerTurns(r, ids.length, ids.length, latency));
        if (r.done) done = true;
        if (last) break;
        continue;
      }
      userTurns++;
      const seg = o.tokens.envSegment({ history, messages: r.messages, stopId });
      if (ids.length + seg.length >= o.maxResponseTokens) {
        turns.push(
          ...answerTurns(r, ids.length, ids.length, latency),
          envTurn('system', ids.length, ids.length, '', 0, BUDGET_SPENT),
        );
        finish = 'length';
        break;
      }
      const segStart = ids.length;
      for (const id of seg) {
        ids.push(id);
        lps.push(0);
        mask.push(0);
      }
      turns.push(...answerTurns(r, segStart, ids.length, latency));
      history.push(...r.messages);
    }
  } finally {
    await ep?.close();
  }
  return {
    id: spec.id,
    tokens: Int32Array.from(ids),
    logprobs: Float32Array.from(lps),
    mask: Uint8Array.from(mask),
    finishReason: finish,
    episode: {
      turns,
      assistant_turns: assistantTurns,
      reward,
      done,
      failure,
      timed_out: timedOut,
      tool_calls: toolCalls,
      tool_errors: toolErrors,
      metrics,
    },
  };
}

const BUDGET_SPENT = 'the answer does not fit the episode token budget (data.max_response_length)';

/**
 * The turns of an environment answer: one per message, each tool message with its call's tool
 * name, arguments, error and latency (tools-env.ts). The messages share the answer's token span
 * [start, end): the first holds it (and the answer's reward), the rest are empty spans at its end.
 */
function answerTurns(r: EnvStep, start: number, end: number, latency: number): EpisodeTurn[] {
  if (r.messages.length === 0) return [envTurn('user', start, end, '', latency, null, r.reward)];
  return r.messages.map((m, i) => {
    const call = r.tools?.find((t) => t.message === i);
    const turn = envTurn(m.role, i === 0 ? start : end, end, m.content, latency, null, i === 0 ? r.reward : 0);
    turn.tool_name = call?.name ?? m.name ?? null;
    if (call) Object.assign(turn, { arguments: call.arguments, error: call.error, latency_ms: call.latency_ms });
    return turn;
  });
}

function envTurn(
  role: string,
  start: number,
  end: number,
  text: string,
  latency: number,
  error: string | null,
  reward = 0,
): EpisodeTurn {
  return { role, start, end, text, tool_name: null, arguments: null, latency_ms: latency, error, reward };
}

/** Runs every episode (at most maxInFlight at once); results in spec order. */
export async function runEpisodes(specs: readonly EpisodeSpec[], o: EpisodeOptions): Promise<EpisodeResult[]> {
  const batcher = new TurnBatcher(o);
  const out = new Array<EpisodeResult>(specs.length);
  let next = 0;
  const worker = async () => {
    while (next < specs.length) {
      const i = next++;
      out[i] = await runOne(specs[i], o, batcher);
    }
  };
  await Promise.all(Array.from({ length: Math.min(o.maxInFlight, specs.length) }, worker));
  return out;
}

/** The env/* metrics of a step's episodes. */
export function episodeMetrics(rs: readonly EpisodeResult[]): Record<string, number> {
  if (rs.length === 0) return {};
  const n = rs.length;
  const lat = rs
    .flatMap((r) => r.episode.turns.filter((t) => t.role !== 'assistant').map((t) => t.latency_ms))
    .sort((a, b) => a - b);
  const q = (p: number) => (lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : 0);
  const calls = rs.reduce((a, r) => a + r.episode.tool_calls, 0);
  return {
    'env/turns_mean': rs.reduce((a, r) => a + r.episode.assistant_turns, 0) / n,
    'env/tool_calls_mean': calls / n,
    'env/tool_error_rate': calls ? rs.reduce((a, r) => a + r.episode.tool_errors, 0) / calls : 0,
    'env/timeouts': rs.filter((r) => r.episode.timed_out).length,
    'env/failures': rs.filter((r) => r.episode.failure !== null).length,
    'env/done_fraction': rs.filter((r) => r.episode.done).length / n,
    'env/latency_p50_ms': q(0.5),
    'env/latency_p99_ms': q(0.99),
    'env/episode_tokens_mean': rs.reduce((a, r) => a + r.tokens.length, 0) / n,
  };
}
