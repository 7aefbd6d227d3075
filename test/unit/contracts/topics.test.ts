import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LOGICAL_TOPICS, TOPICS, TOPIC_FAMILY, parseTopicName, topicName } from '../../../lib/contracts/topics.ts';
import { schemaCatalogue } from '../../../lib/contracts/schemas.ts';
import { hashId } from '../../../lib/contracts/ids.ts';
import { ConfigError } from '../../../lib/errors.ts';
import { Gen } from './fixtures.ts';

test('topic names are per run: <prefix>.<run>.<topic>', () => {
  assert.equal(topicName('rlstream', 'exp-1', 'trajectories'), 'rlstream.exp-1.trajectories');
  assert.equal(parseTopicName('rlstream', 'exp-1', 'rlstream.exp-1.scored'), 'scored');
  assert.equal(parseTopicName('rlstream', 'exp-1', 'rlstream.exp-2.scored'), null);
  assert.equal(parseTopicName('rlstream', 'exp-1', 'rlstream.exp-1.nope'), null);
  assert.throws(
    () => topicName('bad prefix', 'r', 'prompts'),
    (e: unknown) =>
      e instanceof ConfigError && /pipeline\.topic_prefix "bad prefix" may contain only letters/.test(e.message),
  );
  assert.throws(() => topicName('p', 'r', 'nope' as 'prompts'), /unknown topic "nope"; topics: prompts, trajectories/);
  assert.throws(
    () => topicName('p'.repeat(200), 'r'.repeat(100), 'trajectories'),
    /over Kafka's 249; shorten pipeline\.topic_prefix or the run id/,
  );
  assert.throws(() => topicName('p', 'r/x', 'prompts'), /invalid run id/);
});

test('every topic has a schema, a key and partitions; group topics key by group_uid', () => {
  const cat = schemaCatalogue();
  for (const t of LOGICAL_TOPICS) {
    assert.equal(TOPICS[t].name, t);
    assert.equal(TOPICS[t].family, TOPIC_FAMILY[t]);
    assert.ok(cat.latest(TOPICS[t].family));
    assert.ok(Number.isInteger(TOPICS[t].partitions) && TOPICS[t].partitions >= 1);
  }
  const gen = new Gen(41);
  const tg = gen.trajectoryGroup(2);
  assert.equal(TOPICS.trajectories.key(tg), tg.group_uid);
  assert.equal(TOPICS.trajectories.key(tg), hashId(tg.id));
  const sg = gen.scoredGroup(2);
  assert.equal(TOPICS.scored.key(sg), sg.group_uid);
  assert.equal(TOPICS.validation.key(sg), sg.group_uid);
  const ug = gen.updateGroup(2);
  assert.equal(TOPICS.updates.key(ug), ug.group_uid);
  const pb = gen.promptBatch(2);
  pb.groups = pb.groups.slice(0, 1);
  pb.id = pb.groups[0].id;
  assert.equal(TOPICS.prompts.key(pb), pb.groups[0].group_uid, 'a one-group batch is keyed like its group');
  const pv = gen.policyVersion(2);
  assert.equal(TOPICS.policy.key(pv), pv.id);
  assert.equal(TOPICS.deadletter.key(gen.deadLetter()), gen.deadLetter().id);
});
