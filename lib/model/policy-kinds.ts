/**
 * The kinds of policy a run trains (`actor.model.kind`): `language` (a causal LM sampling token
 * sequences) or `image` (a flow-matching DiT drawing images, lib/image/). The kind decides what
 * the rollout samples with and what the update trains; every other list of kinds derives from
 * POLICY_KINDS. With actor.model.kind unset, the model directory decides: a config.json with
 * model_type rlstream_dit is an image policy, anything else (or no directory) a language policy.
 */
import { isDitDir } from '../image/checkpoint.ts';

export const POLICY_KINDS = ['language', 'image'] as const;
export type PolicyKind = (typeof POLICY_KINDS)[number];

/** The kind of policy actor.model describes (its `kind`, else what its `path` holds). */
export function policyKindOf(model: { kind?: PolicyKind | null; path: string | null }): PolicyKind {
  if (model.kind) return model.kind;
  return model.path !== null && isDitDir(model.path) ? 'image' : 'language';
}
