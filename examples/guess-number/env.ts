/**
 * The guess-number environment as a JS module (rollout.multi_turn.interaction.type = module).
 * The secret is a number in 1..16 (the row's extra_info.secret, else its ground_truth); each
 * assistant message is a guess, answered with one message: `>` (the secret is higher), `<`
 * (lower) or `=` (correct; the episode ends with reward 1). A message that is not a number in
 * 1..16 is answered with `?` and counts as a guess. The same game over HTTP: env_server.py.
 *
 * Shaping (interaction.kwargs.shaping = c > 0): every guess also earns c · (bits it removed) / 4,
 * the bits being log2 of how much the answer shrinks the range of secrets still possible, so a
 * finished search has earned c in total and a bisecting guess earns it soonest (with the turn
 * discount, multi_turn.gamma, that is the better episode). Metric `accuracy`: 1 for a solved
 * episode, else 0. interaction.kwargs.feedback = false answers every wrong guess with `?` (no
 * higher/lower, no shaping): the control that shows what the answers are worth.
 * interaction.kwargs.letters = true: a guess is one letter, A = 1 … P = 16 (with the alphabet
 * tokenizer, one token per number: actor.model.alphabet ':<>?ABCDEFGHIJKLMNOP').
 */
interface Row {
  ground_truth: string | null;
  extra_info: Record<string, unknown>;
  kwargs?: Record<string, unknown>;
}
interface State {
  secret: number;
  guesses: number;
  /** The secrets still possible after the answers so far: lo..hi. */
  lo: number;
  hi: number;
  shaping: number;
  feedback: boolean;
  letters: boolean;
}

export function start(row: Row): State {
  const secret = Number(row.extra_info.secret ?? row.ground_truth);
  if (!Number.isInteger(secret) || secret < 1 || secret > 16)
    throw new Error(`guess-number: the row's secret must be an integer in 1..16, got ${JSON.stringify(secret)}`);
  const shaping = Number(row.kwargs?.shaping ?? 0);
  if (!(shaping >= 0))
    throw new Error(`guess-number: kwargs.shaping must be a number ≥ 0, got ${String(row.kwargs?.shaping)}`);
  // kwargs.feedback = false: a wrong guess is answered `?` (the no-feedback control)
  return {
    secret,
    guesses: 0,
    lo: 1,
    hi: 16,
    shaping,
    feedback: row.kwargs?.feedback !== false,
    letters: row.kwargs?.letters === true,
  };
}

/** The number a message guesses (NaN when it is not one): digits, or with `letters` one letter A = 1 … P = 16. */
function parseGuess(text: string, letters: boolean): number {
  if (letters) return /^[A-P]$/.test(text) ? text.charCodeAt(0) - 64 : NaN;
  return /^[0-9]{1,2}$/.test(text) ? Number(text) : NaN;
}

export function step(state: State, message: { content: string }) {
  state.guesses++;
  const text = message.content.trim();
  const guess = parseGuess(text, state.letters);
  if (!(guess >= 1 && guess <= 16))
    return {
      messages: [{ role: 'user', content: '?' }],
      reward: 0,
      done: false,
      metrics: { invalid: 1, accuracy: 0 },
    };
  const before = state.hi - state.lo + 1;
  if (guess === state.secret) {
    const bits = state.feedback ? state.shaping * (Math.log2(before) / 4) : 0;
    return { messages: [], reward: 1 + bits, done: true, metrics: { solved: 1, guesses: state.guesses, accuracy: 1 } };
  }
  if (guess < state.secret) state.lo = Math.max(state.lo, guess + 1);
  else state.hi = Math.min(state.hi, guess - 1);
  const bits = state.shaping * ((Math.log2(before) - Math.log2(state.hi - state.lo + 1)) / 4);
  return {
    messages: [{ role: 'user', content: !state.feedback ? '?' : guess < state.secret ? '>' : '<' }],
    reward: state.feedback ? bits : 0,
    done: false,
    metrics: { accuracy: 0 },
  };
}
