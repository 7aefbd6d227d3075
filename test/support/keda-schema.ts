/**
 * KEDA's ScaledObject (keda.sh/v1alpha1), a CRD the Kubernetes OpenAPI schemas do not cover, as a
 * strict zod schema written from KEDA's documented fields (keda.sh/docs/2.x/reference/
 * scaledobject-spec and the apache-kafka scaler page): every object is strict, so an unknown or
 * misplaced field is an error, as the CRD's structural schema makes it on a cluster. What it does
 * not check: the HPA `behavior` policies in depth (only its two documented keys and their
 * stabilization window), and the metadata of trigger types other than `kafka` (a string map).
 */
import { z } from 'zod';

const intString = z.string().regex(/^\d+$/, { message: 'must be a whole number written as a string' });
const boolString = z.enum(['true', 'false']);

/** The `kafka` scaler's documented metadata keys (all strings). */
const kafkaMetadata = z
  .strictObject({
    bootstrapServers: z.string().min(1),
    bootstrapServersFromEnv: z.string().min(1),
    consumerGroup: z.string().min(1),
    consumerGroupFromEnv: z.string().min(1),
    topic: z.string().min(1),
    topicFromEnv: z.string().min(1),
    lagThreshold: intString,
    activationLagThreshold: intString,
    offsetResetPolicy: z.enum(['earliest', 'latest']),
    allowIdleConsumers: boolString,
    scaleToZeroOnInvalidOffset: boolString,
    excludePersistentLag: boolString,
    limitToPartitionsWithLag: boolString,
    ensureEvenDistributionOfPartitions: boolString,
    version: z.string(),
    partitionLimitation: z.string(),
    sasl: z.enum(['plaintext', 'scram_sha256', 'scram_sha512', 'gssapi', 'oauthbearer', 'none']),
    tls: z.enum(['enable', 'disable']),
    unsafeSsl: boolString,
  })
  .partial()
  .refine((m) => (m.bootstrapServers ?? m.bootstrapServersFromEnv) !== undefined, {
    message: 'kafka trigger needs bootstrapServers (or bootstrapServersFromEnv)',
  })
  .refine((m) => (m.consumerGroup ?? m.consumerGroupFromEnv) !== undefined, {
    message: 'kafka trigger needs consumerGroup (or consumerGroupFromEnv)',
  });

const trigger = z
  .strictObject({
    type: z.string().min(1),
    name: z.string().min(1).optional(),
    metadata: z.record(z.string(), z.string()),
    authenticationRef: z
      .strictObject({
        name: z.string().min(1),
        kind: z.enum(['TriggerAuthentication', 'ClusterTriggerAuthentication']).optional(),
      })
      .optional(),
    metricType: z.enum(['AverageValue', 'Value', 'Utilization']).optional(),
    useCachedMetrics: z.boolean().optional(),
  })
  .superRefine((t, ctx) => {
    if (t.type !== 'kafka') return;
    const r = kafkaMetadata.safeParse(t.metadata);
    if (!r.success)
      for (const i of r.error.issues)
        ctx.addIssue({ code: 'custom', path: ['metadata', ...i.path], message: i.message });
  });

const scalingRules = z.strictObject({
  stabilizationWindowSeconds: z.int().gte(0).lte(3600).optional(),
  selectPolicy: z.enum(['Max', 'Min', 'Disabled']).optional(),
  policies: z
    .array(
      z.strictObject({
        type: z.enum(['Pods', 'Percent']),
        value: z.int().gt(0),
        periodSeconds: z.int().gt(0).lte(1800),
      }),
    )
    .optional(),
});

export const scaledObjectSchema = z.strictObject({
  apiVersion: z.literal('keda.sh/v1alpha1'),
  kind: z.literal('ScaledObject'),
  metadata: z.strictObject({
    name: z.string().regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/),
    namespace: z.string().optional(),
    labels: z.record(z.string(), z.string()).optional(),
    annotations: z.record(z.string(), z.string()).optional(),
  }),
  spec: z
    .strictObject({
      scaleTargetRef: z.strictObject({
        apiVersion: z.string().optional(),
        kind: z.string().optional(),
        name: z.string().min(1),
        envSourceContainerName: z.string().optional(),
      }),
      pollingInterval: z.int().gt(0).optional(),
      cooldownPeriod: z.int().gte(0).optional(),
      initialCooldownPeriod: z.int().gte(0).optional(),
      idleReplicaCount: z.int().gte(0).optional(),
      minReplicaCount: z.int().gte(0).optional(),
      maxReplicaCount: z.int().gt(0).optional(),
      fallback: z
        .strictObject({
          failureThreshold: z.int().gt(0),
          replicas: z.int().gte(0),
          behavior: z
            .enum(['static', 'currentReplicas', 'currentReplicasIfHigher', 'currentReplicasIfLower'])
            .optional(),
        })
        .optional(),
      advanced: z
        .strictObject({
          restoreToOriginalReplicaCount: z.boolean().optional(),
          horizontalPodAutoscalerConfig: z
            .strictObject({
              name: z.string().optional(),
              behavior: z
                .strictObject({ scaleUp: scalingRules.optional(), scaleDown: scalingRules.optional() })
                .optional(),
            })
            .optional(),
          scalingModifiers: z
            .strictObject({
              formula: z.string(),
              target: z.string(),
              activationTarget: z.string().optional(),
              metricType: z.enum(['AverageValue', 'Value']).optional(),
            })
            .optional(),
        })
        .optional(),
      triggers: z.array(trigger).min(1),
    })
    .refine(
      (s) =>
        s.minReplicaCount === undefined || s.maxReplicaCount === undefined || s.minReplicaCount <= s.maxReplicaCount,
      { message: 'minReplicaCount must not exceed maxReplicaCount' },
    ),
});
