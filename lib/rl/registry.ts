/**
 * Config-string registries for the RL algorithms. `get(name)` throws a ConfigError that lists the
 * valid names, e.g. `unknown adv_estimator "grp" — valid: gae, gpg, grpo, ...` (verl's core_algos
 * registries behave the same way). The implementation is the project-wide one in lib/util.
 */
export { Registry } from '../util/registry.ts';
