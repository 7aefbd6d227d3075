/**
 * examples/number-game-vision-remote: a real `rlstream reward-server` running the vision scorer,
 * reached by the reward client with the example config's reward.remote (its request_template
 * sends the real prompt image). The scorer reads the digits from the PNG the pipeline made and
 * scores the response against them; vlm_score / ocr_confidence land in the details.
 */
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRemoteRewardClient } from '../../../lib/reward/http-client.ts';
import type { RemoteRewardOptions, RewardRequestItem } from '../../../lib/reward/types.ts';
import { loadConfig } from '../../../lib/config/index.ts';
import { loadRunData } from '../../../lib/pipeline/data.ts';
import { tokenizerFor } from '../../../lib/pipeline/policy.ts';
import { startRewardServers, type ServerGroup } from '../../../devkit/reward-procs.ts';
import { makePng } from '../../../devkit/reward-png.ts';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const SCORER = join(ROOT, 'examples/number-game-vision-remote/scorer.ts');
let dir = '';
let servers: ServerGroup | undefined;

before(async () => {
  mkdirSync('test/.tmp', { recursive: true });
  dir = mkdtempSync(join('test/.tmp', 'vision-scorer-'));
  servers = await startRewardServers({ count: 1, scorer: SCORER, logDir: dir });
});
after(async () => {
  await servers?.stop('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

test('the vision scorer reads the prompt image: right index → vlm_score 1, wrong → 0, the reward weighted as configured', async () => {
  const port = new URL(servers!.servers[0]!.url).port;
  const cfg = loadConfig({
    env: {},
    onWarning: () => undefined,
    file: join(ROOT, 'examples/number-game-vision-remote/config.yaml'),
    overrides: [
      'data.task_size.train=4',
      'data.task_size.val=1',
      `reward.remote.start_port=${port}`,
      'reward.remote.count=1',
    ],
  });
  const data = await loadRunData(cfg, tokenizerFor(cfg));
  const opts = cfg.reward.remote as unknown as RemoteRewardOptions;
  const client = createRemoteRewardClient(opts, { replicaIndex: 0 });
  try {
    const items: RewardRequestItem[] = data.train.flatMap((row, i) =>
      ['0', '1', '2'].map((response) => ({
        id: `p${i}-r${response}`,
        step: 1,
        prompt_text: row.prompt,
        response_text: response,
        ground_truth: row.answer,
        images: [row.images[0]!.png],
      })),
    );
    const out = await client.scoreBatch(items);
    assert.equal(out.length, items.length);
    for (const [k, o] of out.entries()) {
      const it = items[k]!;
      assert.ok(o.ok, JSON.stringify(o));
      if (!o.ok) continue;
      const right = it.response_text === it.ground_truth;
      assert.equal(o.details.vlm_score, right ? 1 : 0, `${it.id}: judged from the image`);
      assert.equal(o.details.ocr_confidence, 1);
      assert.equal(o.details.agrees_with_ground_truth, 1);
      assert.equal(o.details.format, 1);
      assert.equal(o.reward, (right ? 1 : 0) + 0.1);
    }
    // an image that is not a game image: nothing read, no credit whatever the response
    const [blank] = await client.scoreBatch([
      { id: 'blank', step: 1, prompt_text: 'q', response_text: '0', ground_truth: '0', images: [makePng(30, 20, 1)] },
    ]);
    assert.ok(blank!.ok);
    if (blank!.ok) {
      assert.equal(blank.details.vlm_score, 0);
      assert.ok((blank.details.ocr_confidence as number) < 1);
    }
  } finally {
    await client.close?.();
  }
});
