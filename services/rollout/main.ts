/**
 * Rollout stage: samples rollout.n responses per prompt group with the policy version the batch names (read
 * once per version; in one process taken from the update stage's hand-off and let go after each batch) and
 * publishes trajectory groups with behaviour log-probs and finish reasons. Stateless: replicas share the prompts topic.
 */
import { Sampler } from '../../lib/model/sample.ts';
import { stopTokenIds } from '../../lib/model/config.ts';
import { forStage } from '../../lib/log.ts';
import { runStage, type Pipeline, type StageRun } from '../../lib/pipeline/runtime.ts';
import { tokenizerFor, policyModelConfig, samplerOptions, PolicyCache, policyLora } from '../../lib/pipeline/policy.ts';
import { StageMetrics } from '../../lib/pipeline/metrics.ts';
import { crashPoint } from '../../lib/pipeline/crash-points.ts';
import { memMark } from '../../lib/pipeline/mem-trace.ts';
import { PolicyImages } from '../../lib/pipeline/images.ts';
import type { PromptBatch } from '../../lib/contracts/index.ts';
import { generationRequests, trajectoryGroups, requestSampling } from './logic.ts';
import { createMultiTurnEnvironment } from '../../lib/env/index.ts';
import { runEpisodes, episodeMetrics } from '../../lib/env/episodes.ts';
import { EpisodeTokenizer } from '../../lib/model/episode-tokens.ts';
import { parseExtraInfo } from '../../lib/reward-fns/index.ts';
import { createEngine, enginePolicyOf } from '../../lib/inference/engines.ts';
import { chatTemplateKwargs } from '../../lib/pipeline/data.ts';
import { ImageSampler, isImagePolicy } from '../../lib/pipeline/image-policy.ts';

export function startRollout(p: Pipeline, opts: { replica?: string } = {}): StageRun {
  if (isImagePolicy(p.cfg)) return startImageRollout(p, opts);
  const tok = tokenizerFor(p.cfg);
  const model = policyModelConfig(p.cfg, tok);
  const sampler = new Sampler(model, samplerOptions(p.cfg));
  const engine = createEngine(p.cfg, sampler); // rollout.engine: this sampler, or inference servers
  const policies = new PolicyCache(
    p.policies,
    model,
    (v) => p.telemetry?.policyVersion('rollout', v),
    policyLora(p.cfg),
  );
  const metrics = new StageMetrics(p, 'rollout', opts.replica ?? '');
  const images = new PolicyImages(model); // a vision policy sees each prompt's images
  const log = forStage(p.log, 'rollout');
  // remax: each training group also gets one greedy response, whose reward is its baseline
  const greedyBaseline = p.cfg.algorithm.adv_estimator === 'remax';
  // multi-turn episodes: an environment answers each assistant turn
  const mt = p.cfg.rollout.multi_turn;
  const multiTurn = mt.enable;
  const environment = multiTurn ? createMultiTurnEnvironment(mt) : null;
  environment?.catch(() => undefined); // reported when first awaited
  const episodeTokens = new EpisodeTokenizer(tok, chatTemplateKwargs(p.cfg));
  return runStage(p, 'rollout', ['prompts'], async (records, ctx) => {
    metrics.beginBatch(ctx.waitedMs);
    const byVersion = new Map<number, PromptBatch[]>();
    for (const r of records) {
      const b = r.value as PromptBatch;
      const list = byVersion.get(b.policy_version) ?? [];
      list.push(b);
      byVersion.set(b.policy_version, list);
    }
    for (const [version, batches] of [...byVersion].sort((a, b) => a[0] - b[0])) {
      crashPoint('rollout:start');
      const t0 = performance.now();
      // an inference server loads the version's directory itself: no weights in this process
      const weights = engine.name === 'onnx' ? await policies.get(version, ctx.db) : null;
      const policy = enginePolicyOf(version, async () => weights!, p.policies, ctx.db);
      const tLoad = performance.now();
      memMark('rollout:loaded', { version });
      const { requests, groups } = generationRequests(batches, { greedyBaseline });
      const pixels = await images.byGroup(groups.map((g) => g.group));
      // one generate call per sampling setting (train vs val batches differ; remax baselines are greedy)
      const results = new Array(requests.length);
      const bySetting = new Map<string, number[]>();
      requests.forEach((req, i) => {
        const s = requestSampling(groups[req.groupIndex].batch, req);
        const key = `${s.temperature}|${s.top_p}|${s.top_k}|${s.max_new_tokens}`;
        const l = bySetting.get(key) ?? [];
        l.push(i);
        bySetting.set(key, l);
      });
      if (multiTurn) {
        // multi-turn: each request is an episode; its turns are generated in batches across episodes
        const settingOf = new Map<string, PromptBatch['sampling']>();
        const specs = requests.map((req, i) => {
          const s = requestSampling(groups[req.groupIndex].batch, req);
          const key = `${s.temperature}|${s.top_p}|${s.top_k}`;
          settingOf.set(key, s);
          const g = groups[req.groupIndex].group;
          return {
            id: req.id,
            prompt: req.prompt,
            samplingKey: key,
            row: {
              episode_id: req.id,
              sample_index: requests[i].sampleIndex,
              prompt_text: g.prompt_text,
              ground_truth: g.ground_truth,
              data_source: g.data_source,
              extra_info: parseExtraInfo(g.extra_info),
              kwargs: mt.interaction.kwargs as Record<string, unknown>,
            },
          };
        });
        const episodes = await runEpisodes(specs, {
          env: await environment!,
          tokens: episodeTokens,
          decode: (ids) => tok.decode(ids),
          maxResponseTokens: p.cfg.data.max_response_length,
          maxTokensPerTurn: mt.max_tokens_per_turn,
          maxAssistantTurns: mt.max_assistant_turns,
          maxUserTurns: mt.max_user_turns ?? mt.max_assistant_turns,
          gamma: mt.gamma,
          maxInFlight: mt.max_episodes_in_flight,
          maxBatch: p.cfg.rollout.batch_size ?? 64,
          now: () => performance.now(),
          generate: (key, reqs) => {
            const s = settingOf.get(key)!;
            return engine.generate(
              policy,
              reqs.map((r) => ({ id: r.id, prompt: r.prompt })),
              {
                temperature: s.temperature,
                topP: s.top_p,
                topK: s.top_k > 0 ? s.top_k : 0,
                maxNewTokens: reqs[0].maxNewTokens,
                seed: p.cfg.data.seed,
                eosTokenIds: stopTokenIds(model),
              },
            );
          },
        });
        episodes.forEach((e, i) => (results[i] = e));
        const trainSteps = new Set(batches.filter((b) => b.kind === 'train').map((b) => b.step));
        for (const step of trainSteps)
          metrics.add(
            step,
            episodeMetrics(episodes.filter((_, i) => groups[requests[i].groupIndex].batch.kind === 'train')),
          );
      }
      for (const idx of multiTurn ? [] : bySetting.values()) {
        const s = requestSampling(groups[requests[idx[0]].groupIndex].batch, requests[idx[0]]);
        const out = await engine.generate(
          policy,
          idx.map((i) => ({
            id: requests[i].id,
            prompt: requests[i].prompt,
            images: pixels.get(groups[requests[i].groupIndex].group),
          })),
          {
            temperature: s.temperature,
            topP: s.top_p,
            topK: s.top_k > 0 ? s.top_k : 0,
            maxNewTokens: s.max_new_tokens,
            seed: p.cfg.data.seed,
            eosTokenIds: stopTokenIds(model), // every eos id of config.json and generation_config.json stops a response
          },
        );
        idx.forEach((i, k) => {
          results[i] = out[k];
        });
      }
      const tGen = performance.now();
      memMark('rollout:generated', { version });
      crashPoint('rollout:generated');
      const trajs = trajectoryGroups(groups, requests, results, (ids) => tok.decode(ids), stopTokenIds(model));
      // multi-turn: every episode and its turns in SQL (episodes, episode_turns), with this batch
      const episodes = trajs.flatMap((g) =>
        g.samples
          .filter((x) => x.episode !== null)
          .map((x) => ({
            runId: g.run_id,
            trajectoryId: x.id,
            step: g.step,
            kind: g.kind,
            policyVersion: g.policy_version,
            responseTokens: x.response_ids.length,
            episode: x.episode!,
          })),
      );
      if (episodes.length) await p.store.insertEpisodes(episodes, { tx: ctx.tx });
      let tokens = 0;
      for (const g of trajs) {
        ctx.emit('trajectories', g);
        for (const s of g.samples) tokens += s.response_ids.length;
        tokens += g.baseline?.response_ids.length ?? 0;
      }
      const steps = new Set(batches.filter((b) => b.kind === 'train').map((b) => b.step));
      for (const step of steps)
        metrics.add(step, { 'perf/rollout_tokens': tokens }, { load: tLoad - t0, generate: tGen - tLoad });
      log.debug({ version, groups: trajs.length, tokens, ms: Math.round(tGen - t0) }, 'generated');
    }
    policies.release(); // held, a version the update stage has let go would stay in memory
    await metrics.flush(ctx);
  });
}

/**
 * An image policy's rollout (lib/pipeline/image-policy.ts): each request's image sampled with the
 * batch's version, from its own noise stream; training samples record their SDE steps.
 */
function startImageRollout(p: Pipeline, opts: { replica?: string }): StageRun {
  const sampler = new ImageSampler(p.cfg, p.policies, (v) => p.telemetry?.policyVersion('rollout', v));
  const metrics = new StageMetrics(p, 'rollout', opts.replica ?? '');
  const log = forStage(p.log, 'rollout');
  return runStage(p, 'rollout', ['prompts'], async (records, ctx) => {
    metrics.beginBatch(ctx.waitedMs);
    const all = records.map((r) => r.value as PromptBatch).sort((a, b) => a.policy_version - b.policy_version);
    for (const version of new Set(all.map((b) => b.policy_version))) {
      crashPoint('rollout:start');
      const t0 = performance.now();
      const batches = all.filter((b) => b.policy_version === version);
      const { requests, groups } = generationRequests(batches);
      const results = await sampler.generate(
        version,
        ctx.db,
        requests.map((r) => {
          const g = groups[r.groupIndex];
          return { id: r.id, prompt: g.group.prompt_text, val: g.batch.kind === 'val' };
        }),
      );
      const tGen = performance.now();
      crashPoint('rollout:generated');
      const trajs = trajectoryGroups(groups, requests, results, () => '', []);
      for (const g of trajs) ctx.emit('trajectories', g);
      for (const step of new Set(batches.filter((b) => b.kind === 'train').map((b) => b.step)))
        metrics.add(step, { 'perf/rollout_images': results.length }, { generate: tGen - t0 });
      log.debug({ version, groups: trajs.length, ms: Math.round(tGen - t0) }, 'generated');
    }
    await metrics.flush(ctx);
  });
}
