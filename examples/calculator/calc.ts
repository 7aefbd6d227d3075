/**
 * The calculator example's tool (rollout.multi_turn.tool_executor.type = module): `calc` evaluates
 * an integer expression of + - * and parentheses, e.g. {"expression": "123*45"} → "5535". Anything
 * else throws, and the model is answered with the error.
 */
export function calc(args: { expression?: unknown }): string {
  const e = args.expression;
  if (typeof e !== 'string') throw new Error('calc needs {"expression": "<integers with + - * ( )>"}');
  const src = e.replace(/\s+/g, '');
  if (!/^[0-9+\-*()]+$/.test(src))
    throw new Error(`calc: only integers, + - * and ( ) are allowed, got ${JSON.stringify(e)}`);
  let at = 0;
  const peek = () => src[at];
  // expr := term (('+'|'-') term)*; term := factor ('*' factor)*; factor := '-' factor | int | '(' expr ')'
  const expr = (): bigint => {
    let v = term();
    while (peek() === '+' || peek() === '-') v = src[at++] === '+' ? v + term() : v - term();
    return v;
  };
  const term = (): bigint => {
    let v = factor();
    while (peek() === '*') {
      at++;
      v *= factor();
    }
    return v;
  };
  const factor = (): bigint => {
    if (peek() === '-') {
      at++;
      return -factor();
    }
    if (peek() === '(') {
      at++;
      const v = expr();
      if (src[at++] !== ')') throw new Error(`calc: unbalanced parentheses in ${JSON.stringify(e)}`);
      return v;
    }
    const m = /^[0-9]+/.exec(src.slice(at));
    if (!m) throw new Error(`calc: expected a number at position ${at} of ${JSON.stringify(e)}`);
    at += m[0].length;
    return BigInt(m[0]);
  };
  const v = expr();
  if (at !== src.length) throw new Error(`calc: unexpected ${JSON.stringify(src.slice(at))} in ${JSON.stringify(e)}`);
  return v.toString();
}
