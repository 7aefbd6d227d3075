/**
 * An example reward module (reward.reward_fn_path): 1 when the response's last number equals the
 * ground truth, else 0 — the shape verl's GSM8K scorer has. rlstream calls the default export with
 * { prompt, response, ground_truth, data_source, extra_info, kwargs } in a worker thread.
 */
export default function reward({ response, ground_truth }: { response: string; ground_truth: string | null }): number {
  const numbers = response.replace(/,/g, '').match(/-?\d+(?:\.\d+)?/g);
  if (!numbers || ground_truth === null) return 0;
  return Number(numbers[numbers.length - 1]) === Number(ground_truth) ? 1 : 0;
}
