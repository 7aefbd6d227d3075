/**
 * The guess-number environment as a JS module (rollout.multi_turn.interaction.type = module).
 * The secret is a number in 1..16 (the row's extra_info.secret, else its ground_truth); each
 * assistant message is a guess, answered with one message: `>` (the secret is higher), `<`
 * (lower) or `=` (correct; the episode ends with reward 1). A message that is not a number in
 * 1..16 is answered with `?` and counts as a guess. The same game over HTTP: env_server.py.
 */
interface Row {
  ground_truth: string | null;
  extra_info: Record<string, unknown>;
}
interface State {
  secret: number;
  guesses: number;
}

export function start(row: Row): State {
  const secret = Number(row.extra_info.secret ?? row.ground_truth);
  if (!Number.isInteger(secret) || secret < 1 || secret > 16)
    throw new Error(`guess-number: the row's secret must be an integer in 1..16, got ${JSON.stringify(secret)}`);
  return { secret, guesses: 0 };
}

export function step(state: State, message: { content: string }) {
  state.guesses++;
  const text = message.content.trim();
  const guess = /^[0-9]{1,2}$/.test(text) ? Number(text) : NaN;
  if (!(guess >= 1 && guess <= 16))
    return { messages: [{ role: 'user', content: '?' }], reward: 0, done: false, metrics: { invalid: 1 } };
  if (guess === state.secret)
    return { messages: [], reward: 1, done: true, metrics: { solved: 1, guesses: state.guesses } };
  return { messages: [{ role: 'user', content: guess < state.secret ? '>' : '<' }], reward: 0, done: false };
}
