/**
 * Rollout stage: samples rollout.n responses per prompt group with the policy version the batch
 * names (loaded from its directory, reloaded only on change) and publishes trajectory groups
 * with behaviour log-probs and finish reasons. Stateless, so several replicas can share the
 * prompts topic in one consumer group.
 */
import { Sampler } from '../../lib/model/sample.ts';
import { stopTokenIds } from '../../lib/model/config.ts';
import { forStage } from '../../lib/log.ts';
import { runStage, type Pipeline, type StageRun } from '../../lib/pipeline/runtime.ts';
import { tokenizerFor, policyModelConfig, samplerOptions, PolicyCache, policyLora } from '../../lib/pipeline/policy.ts';
import { StageMetrics } from '../../lib/pipeline/metrics.ts';
import { crashPoint } from '../../lib/pipeline/crash-points.ts';
import { PolicyImages } from '../../lib/pipeline/images.ts';
import type { PromptBatch } from '../../lib/contracts/index.ts';
import { generationRequests, trajectoryGroups, requestSampling } from './logic.ts';

export function startRollout(p: Pipeline, opts: { replica?: string } = {}): StageRun {
  const tok = tokenizerFor(p.cfg);
  const model = policyModelConfig(p.cfg, tok);
  const sampler = new Sampler(model, samplerOptions(p.cfg));
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
      const weights = await policies.get(version, ctx.db);
      const tLoad = performance.now();
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
      for (const idx of bySetting.values()) {
        const s = requestSampling(groups[requests[idx[0]].groupIndex].batch, requests[idx[0]]);
        const out = await sampler.generate(
          weights,
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
      crashPoint('rollout:generated');
      const trajs = trajectoryGroups(groups, requests, results, (ids) => tok.decode(ids), stopTokenIds(model));
      let tokens = 0;
      for (const g of trajs) {
        ctx.emit('trajectories', g);
        for (const s of g.samples) tokens += s.response_ids.length;
        tokens += g.baseline?.response_ids.length ?? 0;
      }
      const steps = new Set(batches.filter((b) => b.kind === 'train').map((b) => b.step));
      for (const step of steps) {
        metrics.add(step, { 'perf/rollout_tokens': tokens }, { load: tLoad - t0, generate: tGen - tLoad });
      }
      log.debug({ version, groups: trajs.length, tokens, ms: Math.round(tGen - t0) }, 'generated');
    }
    await metrics.flush(ctx);
  });
}
