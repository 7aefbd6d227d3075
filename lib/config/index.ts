/**
 * The run configuration: schema, loader, derived values, checks, redaction and docs.
 * See docs/config.md (generated) for every key.
 */
export {
  configSchema,
  schemaDefaults,
  type Config,
  type ConfigInput,
  ADV_ESTIMATORS,
  GROUP_ADV_ESTIMATORS,
  KL_PENALTIES,
  POLICY_LOSSES,
  LOSS_AGG_MODES,
  POLICY_DTYPES,
  VERSION_FILES,
  type VersionFiles,
  type PolicyDtype,
} from './schema.ts';
export { TRAJECTORY_FIELDS } from '../reward/types.ts';
export {
  loadConfig,
  loadPipelineSection,
  notApplicableLine,
  splitFileList,
  defaultConfig,
  parseOverride,
  unknownKeyMessage,
  configProblems,
  readDisableRewardModel,
  DISABLE_REWARD_MODEL_ENV,
  type LoadConfigOptions,
  type ParsedOverride,
} from './load.ts';
export {
  resolveDerived,
  checkConfig,
  resolveRunId,
  resolveRunDir,
  resolveCriticModel,
  usesRewardFunction,
  resumeConfigDiff,
  resumeConfigProblem,
  type CheckResult,
  type CriticModel,
  type ResumeConfigDiff,
} from './checks.ts';
export { redactSecrets, redactString, formatResolvedConfig, isSecretKey, REDACTED } from './redact.ts';
export { renderConfigDocs } from './docs.ts';
