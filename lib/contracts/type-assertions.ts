/**
 * Compile-time proof that the hand-written types (types.ts) match the types generated from the
 * `.avsc` files (generated.ts): each pair must be mutually assignable, so a field added, removed,
 * renamed or retyped on either side fails `tsc` here, naming the pair. Types only; no runtime code.
 * Checked by `npm run typecheck` and by scripts/check-schema-types.ts.
 */
import type * as G from './generated.ts';
import type * as T from './types.ts';

/** true when A and B are assignable to each other. */
export type Mutual<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
/** Compiles only for `true`. */
export type Expect<X extends true> = X;

export type Checks = [
  Expect<Mutual<T.Kind, G.PromptsV2Kind>>,
  Expect<Mutual<T.Kind, G.TrajectoriesV4Kind>>,
  Expect<Mutual<T.SamplingParams, G.PromptsV2SamplingParams>>,
  Expect<Mutual<T.ImageRef, G.PromptsV2ImageRef>>,
  Expect<Mutual<T.PromptGroup, G.PromptsV2PromptGroup>>,
  Expect<Mutual<T.PromptBatch, G.PromptsV2PromptBatch>>,

  Expect<Mutual<T.FinishReason, G.TrajectoriesV4FinishReason>>,
  Expect<Mutual<T.EpisodeTurn, G.TrajectoriesV4EpisodeTurn>>,
  Expect<Mutual<T.Episode, G.TrajectoriesV4Episode>>,
  Expect<Mutual<T.GeneratedImage, G.TrajectoriesV4GeneratedImage>>,
  Expect<Mutual<T.TrajectorySample, G.TrajectoriesV4TrajectorySample>>,
  Expect<Mutual<T.TrajectoryGroup, G.TrajectoriesV4TrajectoryGroup>>,

  Expect<Mutual<T.ScoreFailure, G.ScoredV4ScoreFailure>>,
  Expect<Mutual<T.ScoredSample, G.ScoredV4ScoredSample>>,
  Expect<Mutual<T.ScoredGroup, G.ScoredV4ScoredGroup>>,

  Expect<Mutual<T.ScoreFailure, G.UpdatesV3ScoreFailure>>,
  Expect<Mutual<T.VppoTokens, G.UpdatesV3VppoTokens>>,
  Expect<Mutual<T.UpdateSample, G.UpdatesV3UpdateSample>>,
  Expect<Mutual<T.UpdateGroup, G.UpdatesV3UpdateGroup>>,

  Expect<Mutual<T.ConsumedOffset, G.PolicyV1ConsumedOffset>>,
  Expect<Mutual<T.PolicyVersion, G.PolicyV1PolicyVersion>>,

  Expect<Mutual<T.MetricsRecord, G.MetricsV1MetricsRecord>>,

  // control: the hand-written type is a discriminated union (one payload set per type), which
  // is narrower than the flat Avro record: every variant must be writable as the record, the
  // keys must be the same, and each payload must match exactly.
  Expect<Mutual<T.ControlType, G.ControlV1ControlType>>,
  Expect<T.ControlEvent extends G.ControlV1ControlEvent ? true : false>,
  Expect<Mutual<keyof T.ControlEvent, keyof G.ControlV1ControlEvent>>,
  Expect<Mutual<T.RunStarted, G.ControlV1RunStarted>>,
  Expect<Mutual<T.EpochStarted, G.ControlV1EpochStarted>>,
  Expect<Mutual<T.RefillRequest, G.ControlV1RefillRequest>>,
  Expect<Mutual<T.ValRoundDone, G.ControlV1ValRoundDone>>,
  Expect<Mutual<T.RunDone, G.ControlV1RunDone>>,
  Expect<Mutual<T.RunFailed, G.ControlV1RunFailed>>,

  Expect<Mutual<T.DeadLetter, G.DeadletterV1DeadLetter>>,

  // every family has a hand-written type, and the newest generated version is the one mapped
  Expect<Mutual<keyof T.SchemaValues, keyof G.GeneratedSchemaValues>>,
  Expect<PerFamily[keyof PerFamily]>,
];

type PerFamily = {
  [K in Exclude<keyof T.SchemaValues, 'control'>]: Mutual<
    T.SchemaValues[K],
    G.GeneratedSchemaValues[K & keyof G.GeneratedSchemaValues]
  >;
};
