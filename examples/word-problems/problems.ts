/**
 * Grade-school word problems (GSM8K's shape, at toy scale): templated stories over +, − and ×
 * with small integers, each with a worked solution — one short line of arithmetic per step —
 * ending in `#### <answer>` (GSM8K's convention). Deterministic by seed.
 *
 * The held-out split differs from the training split in both its wording and its numbers, as
 * GSM8K's test problems do: its stories come from other templates, and its operand tuples
 * (operation, a, b[, c]) are never a training problem's — a tuple is held out when its hash says so
 * (one in five) — while each single arithmetic fact of a held-out solution (each line `x op y = z`)
 * also occurs in some training solution: new problems, not new arithmetic.
 */
import { Rng, fnv1a } from '../../lib/util/rng.ts';

export interface WordProblem {
  prompt: string;
  solution: string;
  answer: string;
}
export type Split = 'train' | 'heldout';
type Kind = 'add' | 'sub' | 'mul' | 'mul_sub' | 'add_sub';

interface Template {
  kind: Kind;
  text: string;
}

const TRAIN_TEMPLATES: Template[] = [
  { kind: 'add', text: '{name} has {a} {items}. {Pron} gets {b} more. How many {items} does {name} have now?' },
  {
    kind: 'add',
    text: '{name} picked {a} {items} in the morning and {b} {items} in the afternoon. How many {items} did {name} pick?',
  },
  { kind: 'add', text: '{name} found {a} {items} and then found {b} more. How many {items} did {name} find?' },
  {
    kind: 'sub',
    text: '{name} had {a} {items} and gave {b} of them to a friend. How many {items} does {name} have left?',
  },
  {
    kind: 'sub',
    text: 'There were {a} {items} on the table. {name} took {b}. How many {items} are still on the table?',
  },
  { kind: 'sub', text: '{name} had {a} {items} and lost {b} of them. How many {items} does {name} have now?' },
  { kind: 'mul', text: '{name} buys {a} bags with {b} {items} in each bag. How many {items} does {name} buy?' },
  { kind: 'mul', text: 'There are {a} rows of {b} {items} each. How many {items} are there in all?' },
  {
    kind: 'mul_sub',
    text: '{name} has {a} boxes of {b} {items} and gives away {c} {items}. How many {items} are left?',
  },
  {
    kind: 'mul_sub',
    text: 'There are {a} bags with {b} {items} in each bag. {name} takes {c} of them. How many {items} are left in the bags?',
  },
  {
    kind: 'add_sub',
    text: 'A shelf holds {a} {items}. {name} puts {b} more on it and then takes {c} off. How many {items} are on the shelf?',
  },
  {
    kind: 'add_sub',
    text: '{name} had {a} {items}, got {b} more and then lost {c}. How many {items} does {name} have?',
  },
];

/**
 * 24 more training phrasings (`prepare.ts --templates wide`: the training split draws from all 36).
 * None uses a word that only the held-out templates have (basket, jar, children, altogether, …): a
 * unit test checks it.
 */
const WIDE_EXTRA_TEMPLATES: Template[] = [
  { kind: 'add', text: '{name} saw {a} {items} at school and {b} {items} at home. How many {items} did {name} see?' },
  {
    kind: 'add',
    text: 'There are {a} {items} in a box. {name} adds {b} {items}. How many {items} are in the box now?',
  },
  {
    kind: 'add',
    text: '{name} made {a} {items} on one day and {b} {items} the next day. How many {items} did {name} make in total?',
  },
  { kind: 'add', text: '{name} won {a} {items}. Later {Pron} won {b} more. How many {items} did {name} win?' },
  { kind: 'add', text: 'A bag holds {a} red {items} and {b} blue {items}. How many {items} are in the bag?' },
  { kind: 'sub', text: '{name} bought {a} {items} and used {b} of them. How many {items} are left?' },
  { kind: 'sub', text: 'A box had {a} {items}. {b} {items} were sold. How many {items} are in the box now?' },
  { kind: 'sub', text: '{name} needs {a} {items} and already has {b}. How many more {items} does {name} need?' },
  { kind: 'sub', text: '{name} had {a} {items}. {Pron} ate {b} of them. How many {items} remain?' },
  { kind: 'sub', text: 'There were {a} {items} on a shelf and {b} fell off. How many {items} are on the shelf now?' },
  { kind: 'mul', text: '{name} has {a} boxes. Each box holds {b} {items}. How many {items} does {name} have?' },
  { kind: 'mul', text: '{name} gets {b} {items} every day for {a} days. How many {items} does {name} get?' },
  { kind: 'mul', text: 'A shop packs {b} {items} in each of {a} cups. How many {items} does it pack?' },
  { kind: 'mul', text: '{name} stacks {a} piles with {b} {items} in each pile. How many {items} are stacked?' },
  { kind: 'mul', text: 'There are {a} plates and {b} {items} on each plate. How many {items} are there?' },
  { kind: 'mul_sub', text: '{name} buys {a} packs of {b} {items} and uses {c} of them. How many {items} are left?' },
  {
    kind: 'mul_sub',
    text: 'There are {a} rows with {b} {items} in each row. {c} {items} are taken. How many {items} remain?',
  },
  {
    kind: 'mul_sub',
    text: '{name} puts {b} {items} on each of {a} plates, then eats {c}. How many {items} are still on the plates?',
  },
  {
    kind: 'mul_sub',
    text: '{name} collects {b} {items} a day for {a} days and loses {c}. How many {items} does {name} have?',
  },
  {
    kind: 'add_sub',
    text: 'There were {a} {items} in a box. {name} added {b} and then removed {c}. How many {items} are in the box?',
  },
  {
    kind: 'add_sub',
    text: '{name} found {a} {items}, then found {b} more, then sold {c}. How many {items} does {name} have now?',
  },
  { kind: 'add_sub', text: '{name} has {a} {items} and buys {b} more. {Pron} uses {c}. How many {items} are left?' },
  {
    kind: 'add_sub',
    text: 'A bag had {a} {items}. {b} were added and {c} were taken. How many {items} are in the bag?',
  },
  {
    kind: 'add_sub',
    text: '{name} scored {a} {items} and then {b} more, but lost {c}. How many {items} does {name} have?',
  },
];

/** The training templates of each template set: the 12 base ones, or those and 24 more (wide). */
const TRAINING_TEMPLATES = { base: TRAIN_TEMPLATES, wide: [...TRAIN_TEMPLATES, ...WIDE_EXTRA_TEMPLATES] };
export type TemplateSet = keyof typeof TRAINING_TEMPLATES;
export const TEMPLATE_SETS = Object.keys(TRAINING_TEMPLATES) as TemplateSet[];

const HELDOUT_TEMPLATES: Template[] = [
  { kind: 'add', text: 'A basket has {a} {items} and {name} puts in {b} more. How many {items} are in the basket?' },
  { kind: 'sub', text: 'A jar had {a} {items}. {name} took {b} out of the jar. How many {items} are left in the jar?' },
  { kind: 'mul', text: 'Each of {a} children brings {b} {items}. How many {items} do the children bring altogether?' },
  {
    kind: 'mul_sub',
    text: '{name} fills {a} boxes with {b} {items} each and gives away {c} of them. How many {items} are left?',
  },
  {
    kind: 'add_sub',
    text: '{name} gets {a} {items} on Monday and {b} more on Tuesday, then gives {c} to a friend. How many {items} does {name} have now?',
  },
];

const NAMES: Array<[string, string]> = [
  ['Ana', 'She'],
  ['Ben', 'He'],
  ['Chen', 'He'],
  ['Dara', 'She'],
  ['Eli', 'He'],
  ['Fatima', 'She'],
  ['Goran', 'He'],
  ['Hana', 'She'],
];
const ITEMS = ['apples', 'marbles', 'stickers', 'pencils', 'cookies', 'shells', 'stamps', 'coins'];

const KINDS: readonly Kind[] = ['add', 'sub', 'mul', 'mul_sub', 'add_sub'];

/** Which split an operand tuple's hash puts it in (one in five is held out); see splitOf. */
function hashSplit(kind: Kind, nums: readonly number[]): Split {
  return fnv1a(`${kind}:${nums.join(',')}`) % 5 === 0 ? 'heldout' : 'train';
}

/**
 * Each operand's inclusive range, given the operands before it: operands() draws uniformly in
 * each in turn, allTuples() lists every tuple.
 */
const OPERAND_RANGES: Record<Kind, Array<(prev: readonly number[]) => [number, number]>> = {
  add: [() => [1, 9], () => [1, 9]],
  sub: [() => [2, 18], ([a]) => [1, Math.min(9, a - 1)]],
  mul: [() => [2, 5], () => [2, 5]],
  mul_sub: [() => [2, 5], () => [2, 5], ([a, b]) => [1, Math.min(9, a * b - 1)]],
  add_sub: [() => [1, 9], () => [1, 9], ([a, b]) => [1, Math.min(9, a + b - 1)]],
};

/** Every operand tuple a kind can draw. */
function allTuples(kind: Kind): number[][] {
  let out: number[][] = [[]];
  for (const range of OPERAND_RANGES[kind]) {
    out = out.flatMap((prev) => {
      const [lo, hi] = range(prev);
      return Array.from({ length: hi - lo + 1 }, (_, i) => [...prev, lo + i]);
    });
  }
  return out;
}

/** The single arithmetic facts of a problem's solution: its lines without the answer ("3 * 4 = 12"). */
export function stepFacts(solution: string): string[] {
  return solution.split('\n').filter((l) => !l.startsWith('####'));
}

/** The facts of the training split's tuples (every tuple a training problem can have). */
const TRAIN_FACTS = new Set(
  KINDS.flatMap((k) =>
    allTuples(k)
      .filter((n) => hashSplit(k, n) === 'train')
      .flatMap((n) => solve(k, n).steps),
  ),
);

/**
 * Which split an operand tuple belongs to: held out when its hash says so (one in five) and every
 * step of its solution is also a step of some training tuple's solution; `null` for a tuple its hash
 * holds out whose arithmetic the training split lacks (no split draws it).
 */
export function splitOf(kind: Kind, nums: readonly number[]): Split | null {
  if (hashSplit(kind, nums) === 'train') return 'train';
  return solve(kind, [...nums]).steps.every((s) => TRAIN_FACTS.has(s)) ? 'heldout' : null;
}

function operands(kind: Kind, rng: Rng): number[] {
  const out: number[] = [];
  for (const range of OPERAND_RANGES[kind]) {
    const [lo, hi] = range(out);
    out.push(lo + rng.int(hi - lo + 1));
  }
  return out;
}

/** The worked solution: one line per step, then `#### answer`. */
function solve(kind: Kind, [a, b, c]: number[]): { steps: string[]; answer: number } {
  switch (kind) {
    case 'add':
      return { steps: [`${a} + ${b} = ${a + b}`], answer: a + b };
    case 'sub':
      return { steps: [`${a} - ${b} = ${a - b}`], answer: a - b };
    case 'mul':
      return { steps: [`${a} * ${b} = ${a * b}`], answer: a * b };
    case 'mul_sub':
      return { steps: [`${a} * ${b} = ${a * b}`, `${a * b} - ${c} = ${a * b - c}`], answer: a * b - c };
    case 'add_sub':
      return { steps: [`${a} + ${b} = ${a + b}`, `${a + b} - ${c} = ${a + b - c}`], answer: a + b - c };
  }
}

/** `count` problems of a split, seeded by (seed, split); the training split from `templateSet`'s templates. */
export function generateProblems(
  split: Split,
  count: number,
  seed: number,
  templateSet: TemplateSet = 'base',
): WordProblem[] {
  const rng = Rng.fromSeed(`word-problems:${split}:${seed}`);
  const templates = split === 'heldout' ? HELDOUT_TEMPLATES : TRAINING_TEMPLATES[templateSet];
  const out: WordProblem[] = [];
  while (out.length < count) {
    const t = templates[rng.int(templates.length)];
    const nums = operands(t.kind, rng);
    if (splitOf(t.kind, nums) !== split) continue;
    const [name, pron] = NAMES[rng.int(NAMES.length)];
    const items = ITEMS[rng.int(ITEMS.length)];
    const [a, b, c] = nums;
    const prompt = t.text
      .replaceAll('{name}', name)
      .replaceAll('{Pron}', pron)
      .replaceAll('{items}', items)
      .replaceAll('{a}', String(a))
      .replaceAll('{b}', String(b))
      .replaceAll('{c}', String(c));
    const { steps, answer } = solve(t.kind, nums);
    out.push({ prompt, solution: `${steps.join('\n')}\n#### ${answer}`, answer: String(answer) });
  }
  return out;
}

export const TEMPLATE_TEXTS = {
  train: TRAIN_TEMPLATES.map((t) => t.text),
  wideExtra: WIDE_EXTRA_TEMPLATES.map((t) => t.text),
  heldout: HELDOUT_TEMPLATES.map((t) => t.text),
};

/**
 * The chat template prepare.ts writes into the model directory (the tokenizer package has none), in
 * the Llama-2 chat format: `<s>[INST] user [/INST]reply</s>`. The reply follows `[/INST]` with no
 * space, so the text before it is exactly the generation prompt `rlstream train` feeds the policy
 * (the tokenizer's normaliser puts its own ▁ before the reply's first word).
 */
export const CHAT_TEMPLATE =
  "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]" +
  "{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}\n";
