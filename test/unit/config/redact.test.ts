import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parse } from 'yaml';
import { formatResolvedConfig, redactSecrets, redactString, isSecretKey } from '../../../lib/config/index.ts';
import { load, problemsOf } from './helpers.ts';

const PASSWORD = 'Sup3r-S3cret_pw';

test('the database password never appears in the printed config', () => {
  const cfg = load({
    overrides: [
      'pipeline.store=postgres',
      `pipeline.database_url=postgres://trainer:${PASSWORD}@db.internal:5432/rl?sslmode=require`,
    ],
  });
  assert.equal(
    cfg.pipeline.database_url,
    `postgres://trainer:${PASSWORD}@db.internal:5432/rl?sslmode=require`,
    'the loaded config keeps the real URL',
  );
  const text = formatResolvedConfig(cfg);
  assert.ok(!text.includes(PASSWORD), 'password printed');
  assert.ok(text.includes('postgres://trainer:***@db.internal:5432/rl?sslmode=require'), text);
  // the printed text is the resolved config as YAML
  const back = parse(text) as typeof cfg;
  assert.equal(back.rollout.n, cfg.rollout.n);
  assert.equal(back.pipeline.run_id, cfg.pipeline.run_id);
});

test('passwords in query parameters, other URLs and secret-named kwargs are redacted', () => {
  const cfg = load({
    overrides: [
      'pipeline.store=postgres',
      `pipeline.database_url="postgresql://db/rl?user=u&password=${PASSWORD}"`,
      'reward.type=remote',
      `reward.remote.urls=["https://rm:${PASSWORD}@scorer:8443/score"]`,
      `reward.reward_fn_kwargs={api_token: ${PASSWORD}, judge_password: ${PASSWORD}, endpoint: "http://x/?token=${PASSWORD}", model: small}`,
    ],
  });
  const text = formatResolvedConfig(cfg);
  assert.ok(!text.includes(PASSWORD), text);
  assert.ok(text.includes('password=***'));
  assert.ok(text.includes('https://rm:***@scorer:8443/score'));
  assert.ok(text.includes('model: small'), 'non-secret kwargs are kept');
  assert.equal(cfg.reward.reward_fn_kwargs.api_token, PASSWORD, 'redaction does not modify the config');
});

test('auth_token_env is a variable name and is printed; the token itself is never in the config', () => {
  const cfg = load({
    overrides: ['reward.type=remote', 'reward.remote.host=h', 'reward.remote.auth_token_env=RM_TOKEN'],
    env: { RM_TOKEN: PASSWORD },
  });
  const text = formatResolvedConfig(cfg);
  assert.ok(text.includes('auth_token_env: RM_TOKEN'));
  assert.ok(!text.includes(PASSWORD));
  assert.equal(isSecretKey('auth_token_env'), false);
  assert.equal(isSecretKey('api_token'), true);
  assert.equal(isSecretKey('password'), true);
  assert.equal(isSecretKey('max_tokens'), false);
});

test('redactString handles passwords with "@" and libpq key=value strings', () => {
  assert.equal(redactString('postgres://u:p@ss@h/db'), 'postgres://u:***@h/db');
  assert.equal(redactString('host=h password=abc user=u'), 'host=h password=*** user=u');
  assert.equal(redactString('http://h:8080/x'), 'http://h:8080/x');
  assert.equal(redactString('postgres://u@h/db'), 'postgres://u@h/db');
});

test('redactSecrets copies deeply', () => {
  const input = { a: { password: 'x', list: ['mysql://a:b@c'] }, n: 1 };
  const out = redactSecrets(input);
  assert.deepEqual(out, { a: { password: '***', list: ['mysql://a:***@c'] }, n: 1 });
  assert.equal(input.a.password, 'x');
});

test('a secret in a bad override is not echoed in the error', () => {
  const problems = problemsOf(() =>
    load({ overrides: [`pipeline.database_url=postgres://u:${PASSWORD}@h/db`, `pipeline.kafka.password=${PASSWORD}`] }),
  );
  assert.ok(!problems.join('\n').includes(PASSWORD), problems.join('\n'));
  assert.ok(
    problems.some((p) => p.includes('override "pipeline.kafka.password=***": unknown key "pipeline.kafka.password"')),
    problems.join('\n'),
  );
});
