/**
 * Multi-turn episode benchmark (lib/env/episodes.ts): the same episodes of guess-the-number, a
 * random-weight policy over the task alphabet (d64, 2 layers, ORT, 1 thread) against an
 * environment that answers every turn after 50 ms (RLSTREAM_BENCH_ENV_MS), run
 *  - concurrently: 64 episodes in flight (max_episodes_in_flight), their turns batched across
 *    episodes while the others wait on the environment;
 *  - one after another (max_episodes_in_flight = 1).
 * Rows: episodes/s and policy tokens/s (tokens the policy sampled) of each, and the ratio
 * concurrent ÷ sequential (goal ≥ 8: the environment's latency hidden). Sampling is keyed by
 * episode and turn, so both runs produce the same episodes (checked, token for token).
 *
 * Run: `node --import tsx bench/agents.ts` or `npm run bench -- agents`.
 */
import { modelConfig } from '../lib/model/config.ts';
import { initWeights } from '../lib/model/init.ts';
import { Sampler } from '../lib/model/sample.ts';
import { createTokenizer } from '../lib/model/index.ts';
import { EpisodeTokenizer } from '../lib/model/episode-tokens.ts';
import { runEpisodes, type EpisodeResult, type EpisodeSpec } from '../lib/env/episodes.ts';
import type { Environment, EnvStep } from '../lib/env/index.ts';
import { guessNumber } from '../lib/tasks/index.ts';

export interface Row {
  name: string;
  value: number;
  unit: string;
  goal?: number;
}

const EPISODES = Number(process.env.RLSTREAM_BENCH_EPISODES ?? 64);
const ENV_MS = Number(process.env.RLSTREAM_BENCH_ENV_MS ?? 50);
const IN_FLIGHT = 64;

/** Guess-the-number with a fixed answer delay. */
function slowGame(delayMs: number): Environment {
  return {
    name: 'bench:guess',
    async start(row) {
      const secret = Number(row.ground_truth);
      return {
        async step(m): Promise<EnvStep> {
          await new Promise((r) => setTimeout(r, delayMs));
          const g = Number(m.content.trim());
          if (g === secret) return { messages: [], reward: 1, done: true, metrics: {} };
          const answer = !(g >= 1 && g <= 16) ? '?' : g < secret ? '>' : '<';
          return { messages: [{ role: 'user', content: answer }], reward: 0, done: false, metrics: {} };
        },
        async close() {},
      };
    },
    async close() {},
  };
}

export async function run(): Promise<Row[]> {
  const tok = createTokenizer({ type: 'alphabet', alphabet: guessNumber.alphabet });
  const model = modelConfig({
    hiddenSize: 64,
    intermediateSize: 128,
    numHiddenLayers: 2,
    numAttentionHeads: 4,
    numKeyValueHeads: 4,
    vocabSize: tok.vocabSize,
    maxPositionEmbeddings: 32,
    bosTokenId: tok.bos,
    eosTokenId: tok.eos,
    padTokenId: tok.pad,
  });
  const weights = initWeights(model, 1);
  const sampler = new Sampler(model, { threads: 1 });
  const rows = guessNumber.generate(EPISODES, 7);
  const specs: EpisodeSpec[] = rows.map((r, i) => ({
    id: `bench/e${i}`,
    prompt: tok.encode(r.prompt, { addSpecialTokens: true }),
    samplingKey: 'k',
    row: {
      episode_id: `bench/e${i}`,
      sample_index: 0,
      prompt_text: r.prompt,
      ground_truth: r.answer,
      data_source: null,
      extra_info: {},
      kwargs: {},
    },
  }));
  const once = async (inFlight: number) => {
    const t0 = performance.now();
    const out = await runEpisodes(specs, {
      env: slowGame(ENV_MS),
      tokens: new EpisodeTokenizer(tok, {}),
      decode: (ids) => tok.decode(ids),
      generate: (_k, reqs) =>
        sampler.generate(
          weights,
          reqs.map((r) => ({ id: r.id, prompt: r.prompt })),
          { temperature: 1, maxNewTokens: reqs[0].maxNewTokens, seed: 3, eosTokenIds: [tok.eos] },
        ),
      maxResponseTokens: 24,
      maxTokensPerTurn: 3,
      maxAssistantTurns: 6,
      maxUserTurns: 6,
      gamma: 1,
      maxInFlight: inFlight,
      maxBatch: IN_FLIGHT,
      now: () => performance.now(),
    });
    return { out, s: (performance.now() - t0) / 1000 };
  };
  const policyTokens = (rs: EpisodeResult[]) => rs.reduce((a, r) => a + r.mask.reduce((x, m) => x + m, 0), 0);
  await once(IN_FLIGHT); // warm-up: the decode graph is built once
  const conc = await once(IN_FLIGHT);
  const seq = await once(1);
  for (let i = 0; i < EPISODES; i++)
    if (Buffer.compare(Buffer.from(conc.out[i].tokens.buffer), Buffer.from(seq.out[i].tokens.buffer)) !== 0)
      throw new Error(`episode ${i} differs between the concurrent and the sequential run`);
  const turns = conc.out.reduce((a, r) => a + r.episode.assistant_turns, 0);
  const tokens = policyTokens(conc.out);
  const label = `${EPISODES} episodes, ${turns} turns, env ${ENV_MS} ms/turn`;
  return [
    { name: `episodes/s, ${IN_FLIGHT} in flight (${label})`, value: round(EPISODES / conc.s), unit: 'episodes/s' },
    { name: `episodes/s, one after another (${label})`, value: round(EPISODES / seq.s), unit: 'episodes/s' },
    { name: `policy tokens/s, ${IN_FLIGHT} in flight`, value: Math.round(tokens / conc.s), unit: 'tokens/s' },
    { name: 'policy tokens/s, one after another', value: Math.round(tokens / seq.s), unit: 'tokens/s' },
    { name: `speed-up, ${IN_FLIGHT} in flight ÷ one after another`, value: round(seq.s / conc.s), unit: '×', goal: 8 },
  ];
}

const round = (x: number) => Math.round(x * 100) / 100;

if (import.meta.url === `file://${process.argv[1]}`) {
  for (const r of await run()) console.log(`${r.name}: ${r.value} ${r.unit}${r.goal ? ` (goal ≥ ${r.goal})` : ''}`);
}
