/**
 * The calculator example's environment (rollout.multi_turn.interaction, wrapped by the tools
 * environment): it sees the assistant's messages that are not tool calls, i.e. the final answer,
 * and ends the episode with reward 1 when it is the row's answer (the integer, surrounding
 * whitespace ignored), else 0.
 */
interface Row {
  ground_truth: string | null;
}

export function start(row: Row): { answer: string } {
  if (row.ground_truth === null) throw new Error('calculator: the row has no answer (data.answer_key)');
  return { answer: row.ground_truth.trim() };
}

export function step(state: { answer: string }, message: { content: string }) {
  const correct = message.content.trim() === state.answer ? 1 : 0;
  return { messages: [], reward: correct, done: true, metrics: { correct } };
}
