/**
 * The reward backend contract (test/support/reward-backend-contract.ts) against every adapter of
 * lib/reward/backends.ts, each built from a config as the reward stage builds it: a user function
 * module (in its worker thread), an HTTP reward server (rlstream's own, in process, on an
 * ephemeral port) and an ONNX sequence scorer.
 */
import { describe } from 'node:test';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../../../lib/config/index.ts';
import { silentLogger } from '../../../lib/log.ts';
import { createRewardBackend } from '../../../lib/reward/backends.ts';
import { functionScorer } from '../../../lib/reward/scorer.ts';
import { startRewardServer } from '../../../lib/reward/server.ts';
import type { RewardItem } from '../../../lib/reward/port.ts';
import { rewardItem, runRewardBackendContract } from '../../support/reward-backend-contract.ts';
import onnxProto from 'onnx-proto';
import { buildScorerModel, referenceMeanScore } from '../../support/reward-onnx-model.ts';

function backendFor(dir: string, overrides: string[]) {
  const cfg = loadConfig({
    env: {},
    onWarning: () => undefined,
    overrides: [`trainer.run_dir=${dir}`, 'data.task=number_game', ...overrides],
  });
  return createRewardBackend({ cfg, log: silentLogger(), replicaIndex: 0, env: {} });
}

/** The function module's reward and the HTTP scorer's fields, computed here as the reference. */
const fnReward = (it: RewardItem) =>
  (it.response_text.trim() === it.ground_truth ? 1 : 0) + it.response_text.length / 100;
const vlm = (it: RewardItem) => (it.response_text.length % 10) / 10;
const ocr = (it: RewardItem) => (it.response_text === it.ground_truth ? 1 : 0);

describe('reward backend: function (a user module in a worker thread)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-backend-fn-'));
  runRewardBackendContract('function', async () => {
    const mod = join(dir, 'reward.mjs');
    writeFileSync(
      mod,
      `export default function ({ response, ground_truth }) {
  if (response === 'boom') throw new Error('the reward function refuses boom');
  return { reward: (response.trim() === ground_truth ? 1 : 0) + response.length / 100, metrics: { length: response.length } };
}
`,
    );
    return {
      backend: await backendFor(dir, ['reward.type=function', `reward.reward_fn_path=${mod}`]),
      expected: fnReward,
      unscorable: (id) => rewardItem(id, 'p', 'boom', 'x'),
      teardown: async () => rmSync(dir, { recursive: true, force: true }),
    };
  });
});

describe('reward backend: remote (an HTTP reward server)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-backend-http-'));
  runRewardBackendContract('remote', async () => {
    const server = await startRewardServer({
      scorer: functionScorer('contract', (req) => {
        const it = { response_text: req.response ?? '', ground_truth: req.ground_truth ?? '' } as RewardItem;
        // out of reward.remote.response_mapping.range [0, 1]: the client must fail the sample
        if (req.response === 'boom') return { vlm_score: 7, ocr_confidence: 0 };
        return { vlm_score: vlm(it), ocr_confidence: ocr(it) };
      }),
      host: '127.0.0.1',
      port: 0,
      maxBodyBytes: 1 << 20,
      maxBatch: 16,
      log: silentLogger(),
    });
    return {
      backend: await backendFor(dir, [
        'reward.type=remote',
        'reward.reward_fn=exact_match',
        'reward.remote.enabled=true',
        'reward.remote.host=127.0.0.1',
        `reward.remote.start_port=${server.port}`,
        'reward.remote.count=1',
        'reward.remote.request_preset=text',
        'reward.remote.max_retries=0',
      ]),
      expected: (it) => 0.5 * vlm(it) + 0.5 * ocr(it),
      unscorable: (id) => rewardItem(id, 'p', 'boom', 'x'),
      teardown: async () => {
        await server.close(1000);
        rmSync(dir, { recursive: true, force: true });
      },
    };
  });
});

describe('reward backend: model (an ONNX sequence scorer)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-backend-onnx-'));
  runRewardBackendContract('model', async () => {
    // the test model embeds the 256 byte ids; it declares them and its pad id, as a model built for a tokenizer does
    const proto = onnxProto.onnx.ModelProto.decode(buildScorerModel('mean'));
    proto.metadataProps = [
      onnxProto.onnx.StringStringEntryProto.create({ key: 'vocab_size', value: '256' }),
      onnxProto.onnx.StringStringEntryProto.create({ key: 'pad_token_id', value: '0' }),
    ];
    const model = join(dir, 'mean.onnx');
    writeFileSync(model, onnxProto.onnx.ModelProto.encode(proto).finish());
    return {
      backend: await backendFor(dir, ['reward.type=model', `reward.model.path=${model}`]),
      expected: (it) => referenceMeanScore([...Array.from(it.prompt_ids), ...Array.from(it.response_ids)]),
      // no prompt and no response tokens: the model's mean is 0/0
      unscorable: (id) => ({ ...rewardItem(id, '', '', 'x'), prompt_ids: [], response_ids: [] }),
      teardown: async () => rmSync(dir, { recursive: true, force: true }),
    };
  });
});
