/**
 * Built-in tasks for the examples: a data generator (seeded, so the same seed gives the same
 * rows) and the small task alphabet its prompts and answers use, so that a randomly initialised
 * policy over that alphabet has a fair chance (a byte-level vocabulary would put most of the
 * initial probability mass on bytes that never appear in a correct answer).
 */
import { Rng } from '../util/rng.ts';
import { Registry } from '../util/registry.ts';
import { generateVisionGame, type RgbImage } from './number-game-vision.ts';

export interface TaskRow {
  prompt: string;
  answer: string;
  /** The prompt's image as raw RGB (a vision task); the pipeline encodes and resizes it like a dataset image. */
  image?: RgbImage;
  /** Passed to the reward function as extra_info (e.g. what the image shows). */
  extraInfo?: Record<string, unknown>;
}

export interface Task {
  name: string;
  description: string;
  /** Characters the task's prompts and answers are written in (the alphabet tokenizer's vocabulary). */
  alphabet: string;
  /** Whether every row carries an image (a vision task). */
  images?: boolean;
  generate(count: number, seed: number): TaskRow[];
}

/**
 * The number game (EasyR1's example task): three numbers in the prompt, the answer is the index 0/1/2
 * of the largest. Numbers are distinct digits so the answer is unique. Prompt `"3 5 8:"` → answer `"2"`.
 */
export const numberGame: Task = {
  name: 'number_game',
  description: 'three distinct numbers 0–9; answer the index (0, 1 or 2) of the largest',
  alphabet: '0123456789 :',
  generate(count, seed) {
    const rng = Rng.fromSeed(`number_game:${seed}`);
    const rows: TaskRow[] = [];
    for (let i = 0; i < count; i++) {
      const nums: number[] = [];
      while (nums.length < 3) {
        const v = rng.int(10);
        if (!nums.includes(v)) nums.push(v);
      }
      const best = nums.indexOf(Math.max(...nums));
      rows.push({ prompt: `${nums.join(' ')}:`, answer: String(best) });
    }
    return rows;
  },
};

/** Arithmetic: short integer expressions `a+b`, `a-b` with exact-match reward (the GSM8K pattern). */
export const arithmetic: Task = {
  name: 'arithmetic',
  description: 'a+b or a-b with a, b in 0–20; answer the integer result',
  alphabet: '0123456789+-=',
  generate(count, seed) {
    const rng = Rng.fromSeed(`arithmetic:${seed}`);
    const rows: TaskRow[] = [];
    for (let i = 0; i < count; i++) {
      const a = rng.int(21),
        b = rng.int(21);
      const op = rng.int(2) === 0 ? '+' : '-';
      rows.push({ prompt: `${a}${op}${b}=`, answer: String(op === '+' ? a + b : a - b) });
    }
    return rows;
  },
};

/** The vision game's question: the digits are only in the image. */
export const VISION_GAME_PROMPT = 'which is largest? 0, 1 or 2:';

/**
 * The number game with pictures (lib/tasks/number-game-vision.ts): the image shows three distinct
 * digits, the text asks for the index (0/1/2, from the left) of the largest. extra_info records
 * the digits, so a reward server can check what the image shows.
 */
export const numberGameVision: Task = {
  name: 'number_game_vision',
  description: 'an image of three distinct digits; answer the index (0, 1 or 2, from the left) of the largest',
  alphabet: [...new Set(`${VISION_GAME_PROMPT}0123456789`)].join(''),
  images: true,
  generate(count, seed) {
    return generateVisionGame(count, seed).map((s) => ({
      prompt: VISION_GAME_PROMPT,
      answer: String(s.answer),
      image: s.image,
      extraInfo: { numbers: s.numbers },
    }));
  },
};

/**
 * Guess the number (a multi-turn game, examples/guess-number): a secret in 1..16 (extra_info.secret
 * and the answer); the prompt is ":" and the environment answers each guess with > (higher),
 * < (lower) or ends the episode when it is right. The alphabet holds the digits and the answers.
 */
export const guessNumber: Task = {
  name: 'guess_number',
  description: 'multi-turn: find a secret in 1..16 from higher (>) / lower (<) answers',
  alphabet: '0123456789:<>?',
  generate(count, seed) {
    const rng = Rng.fromSeed(`guess_number:${seed}`);
    return Array.from({ length: count }, () => {
      const secret = 1 + rng.int(16);
      return { prompt: ':', answer: String(secret), extraInfo: { secret } };
    });
  },
};

export const tasks = new Registry<Task>('data.task', {
  number_game: numberGame,
  guess_number: guessNumber,
  number_game_vision: numberGameVision,
  arithmetic,
});
