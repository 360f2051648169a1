"""Kubernetes v1.37.2 pod parts as pydantic models. GENERATED: do not edit.

Written by `python -m hack.kubegen` from the upstream OpenAPI v3 document
(k8s.io/kubernetes v1.37.2, api/openapi-spec/v3/api__v1_openapi.json);
tests/unit/test_kubetypes.py fails when this file drifts from it. `Volume` keeps only the
sources Pod Security "restricted" allows; `ObjectMeta` only labels and annotations (an
ephemeral volume's template); PodAffinityTerm has no namespaces/namespaceSelector and
VolumeMount no subPathExpr.
Pure data: no I/O.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
from pydantic import Field

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# A resource quantity: `8`, `500m`, `4Gi`. The CRD types it as Kubernetes' int-or-string.
Quantity = Annotated[
    int | Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)],
    pydantic.WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


class KubeModel(pydantic.BaseModel):
    """Field names are the API's own; unknown fields are errors, as `kubectl --validate` does."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def to_api(self) -> dict[str, Any]:
        """The object as the API server takes it (unset fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class NodeSelectorRequirement(KubeModel):
    """A node selector requirement is a selector that contains values, a key, and an operator
    that relates the key and values. (io.k8s.api.core.v1.NodeSelectorRequirement)"""

    key: str
    operator: str
    values: list[str] | None = None


class NodeSelectorTerm(KubeModel):
    """A null or empty node selector term matches no objects.
    (io.k8s.api.core.v1.NodeSelectorTerm)"""

    matchExpressions: list[NodeSelectorRequirement] | None = None
    matchFields: list[NodeSelectorRequirement] | None = None


class PreferredSchedulingTerm(KubeModel):
    """An empty preferred scheduling term matches all objects with implicit weight 0 (i.e. it's
    a no-op). (io.k8s.api.core.v1.PreferredSchedulingTerm)"""

    preference: NodeSelectorTerm
    weight: int


class NodeSelector(KubeModel):
    """A node selector represents the union of the results of one or more label queries over a
    set of nodes; that is, it represents the OR of the selectors represented by the node
    selector terms. (io.k8s.api.core.v1.NodeSelector)"""

    nodeSelectorTerms: list[NodeSelectorTerm]


class NodeAffinity(KubeModel):
    """Node affinity is a group of node affinity scheduling rules.
    (io.k8s.api.core.v1.NodeAffinity)"""

    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredSchedulingTerm] | None = None
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None


class LabelSelectorRequirement(KubeModel):
    """A label selector requirement is a selector that contains values, a key, and an operator
    that relates the key and values.
    (io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement)"""

    key: str
    operator: str
    values: list[str] | None = None


class LabelSelector(KubeModel):
    """A label selector is a label query over a set of resources.
    (io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector)"""

    matchExpressions: list[LabelSelectorRequirement] | None = None
    matchLabels: dict[str, str] | None = None


class PodAffinityTerm(KubeModel):
    """Defines a set of pods (namely those matching the labelSelector relative to the given
    namespace(s)) that this pod should be co-located (affinity) or not co-located (anti-
    affinity) with, where co-located is defined as running on a node whose value of the label
    with key <topologyKey> matches that of any node on which a pod of the set of pods is running
    (io.k8s.api.core.v1.PodAffinityTerm)"""

    topologyKey: str
    labelSelector: LabelSelector | None = None
    matchLabelKeys: list[str] | None = None
    mismatchLabelKeys: list[str] | None = None


class WeightedPodAffinityTerm(KubeModel):
    """The weights of all of the matched WeightedPodAffinityTerm fields are added per-node to
    find the most preferred node(s) (io.k8s.api.core.v1.WeightedPodAffinityTerm)"""

    podAffinityTerm: PodAffinityTerm
    weight: int


class PodAffinity(KubeModel):
    """Pod affinity is a group of inter pod affinity scheduling rules.
    (io.k8s.api.core.v1.PodAffinity)"""

    preferredDuringSchedulingIgnoredDuringExecution: list[WeightedPodAffinityTerm] | None = None
    requiredDuringSchedulingIgnoredDuringExecution: list[PodAffinityTerm] | None = None


class PodAntiAffinity(KubeModel):
    """Pod anti affinity is a group of inter pod anti affinity scheduling rules.
    (io.k8s.api.core.v1.PodAntiAffinity)"""

    preferredDuringSchedulingIgnoredDuringExecution: list[WeightedPodAffinityTerm] | None = None
    requiredDuringSchedulingIgnoredDuringExecution: list[PodAffinityTerm] | None = None


class Affinity(KubeModel):
    """Affinity is a group of affinity scheduling rules. (io.k8s.api.core.v1.Affinity)"""

    nodeAffinity: NodeAffinity | None = None
    podAffinity: PodAffinity | None = None
    podAntiAffinity: PodAntiAffinity | None = None


class Toleration(KubeModel):
    """The pod this Toleration is attached to tolerates any taint that matches the triple
    <key,value,effect> using the matching operator <operator>.
    (io.k8s.api.core.v1.Toleration)"""

    effect: str | None = None
    key: str | None = None
    operator: str | None = None
    tolerationSeconds: int | None = None
    value: str | None = None


class ConfigMapKeySelector(KubeModel):
    """Selects a key from a ConfigMap. (io.k8s.api.core.v1.ConfigMapKeySelector)"""

    key: str
    name: str | None = None
    optional: bool | None = None


class ObjectFieldSelector(KubeModel):
    """ObjectFieldSelector selects an APIVersioned field of an object.
    (io.k8s.api.core.v1.ObjectFieldSelector)"""

    fieldPath: str
    apiVersion: str | None = None


class FileKeySelector(KubeModel):
    """FileKeySelector selects a key of the env file. (io.k8s.api.core.v1.FileKeySelector)"""

    key: str
    path: str
    volumeName: str
    optional: bool | None = None


class ResourceFieldSelector(KubeModel):
    """ResourceFieldSelector represents container resources (cpu, memory) and their output
    format (io.k8s.api.core.v1.ResourceFieldSelector)"""

    resource: str
    containerName: str | None = None
    divisor: Quantity | None = None


class SecretKeySelector(KubeModel):
    """SecretKeySelector selects a key of a Secret. (io.k8s.api.core.v1.SecretKeySelector)"""

    key: str
    name: str | None = None
    optional: bool | None = None


class EnvVarSource(KubeModel):
    """EnvVarSource represents a source for the value of an EnvVar.
    (io.k8s.api.core.v1.EnvVarSource)"""

    configMapKeyRef: ConfigMapKeySelector | None = None
    fieldRef: ObjectFieldSelector | None = None
    fileKeyRef: FileKeySelector | None = None
    resourceFieldRef: ResourceFieldSelector | None = None
    secretKeyRef: SecretKeySelector | None = None


class EnvVar(KubeModel):
    """EnvVar represents an environment variable present in a Container.
    (io.k8s.api.core.v1.EnvVar)"""

    name: str
    value: str | None = None
    valueFrom: EnvVarSource | None = None


class ConfigMapEnvSource(KubeModel):
    """ConfigMapEnvSource selects a ConfigMap to populate the environment variables with.
    (io.k8s.api.core.v1.ConfigMapEnvSource)"""

    name: str | None = None
    optional: bool | None = None


class SecretEnvSource(KubeModel):
    """SecretEnvSource selects a Secret to populate the environment variables with.
    (io.k8s.api.core.v1.SecretEnvSource)"""

    name: str | None = None
    optional: bool | None = None


class EnvFromSource(KubeModel):
    """EnvFromSource represents the source of a set of ConfigMaps or Secrets
    (io.k8s.api.core.v1.EnvFromSource)"""

    configMapRef: ConfigMapEnvSource | None = None
    prefix: str | None = None
    secretRef: SecretEnvSource | None = None


class ResourceClaim(KubeModel):
    """ResourceClaim references one entry in PodSpec.ResourceClaims.
    (io.k8s.api.core.v1.ResourceClaim)"""

    name: str
    request: str | None = None


class ResourceRequirements(KubeModel):
    """ResourceRequirements describes the compute resource requirements.
    (io.k8s.api.core.v1.ResourceRequirements)"""

    claims: list[ResourceClaim] | None = None
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class KeyToPath(KubeModel):
    """Maps a string key to a path within a volume. (io.k8s.api.core.v1.KeyToPath)"""

    key: str
    path: str
    mode: int | None = None
    user: int | None = None


class ConfigMapVolumeSource(KubeModel):
    """Adapts a ConfigMap into a volume. (io.k8s.api.core.v1.ConfigMapVolumeSource)"""

    defaultMode: int | None = None
    defaultUser: int | None = None
    items: list[KeyToPath] | None = None
    name: str | None = None
    optional: bool | None = None


class LocalObjectReference(KubeModel):
    """LocalObjectReference contains enough information to let you locate the referenced object
    inside the same namespace. (io.k8s.api.core.v1.LocalObjectReference)"""

    name: str | None = None


class CSIVolumeSource(KubeModel):
    """Represents a source location of a volume to mount, managed by an external CSI driver
    (io.k8s.api.core.v1.CSIVolumeSource)"""

    driver: str
    fsType: str | None = None
    nodePublishSecretRef: LocalObjectReference | None = None
    readOnly: bool | None = None
    volumeAttributes: dict[str, str] | None = None


class DownwardAPIVolumeFile(KubeModel):
    """DownwardAPIVolumeFile represents information to create the file containing the pod field
    (io.k8s.api.core.v1.DownwardAPIVolumeFile)"""

    path: str
    fieldRef: ObjectFieldSelector | None = None
    mode: int | None = None
    resourceFieldRef: ResourceFieldSelector | None = None
    user: int | None = None


class DownwardAPIVolumeSource(KubeModel):
    """DownwardAPIVolumeSource represents a volume containing downward API info.
    (io.k8s.api.core.v1.DownwardAPIVolumeSource)"""

    defaultMode: int | None = None
    defaultUser: int | None = None
    items: list[DownwardAPIVolumeFile] | None = None


class EmptyDirVolumeSource(KubeModel):
    """Represents an empty directory for a pod. (io.k8s.api.core.v1.EmptyDirVolumeSource)"""

    medium: str | None = None
    mode: int | None = None
    sizeLimit: Quantity | None = None


class ObjectMeta(KubeModel):
    """ObjectMeta is metadata that all persisted resources must have, which includes all objects
    users must create. (io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta)"""

    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class TypedLocalObjectReference(KubeModel):
    """TypedLocalObjectReference contains enough information to let you locate the typed
    referenced object inside the same namespace.
    (io.k8s.api.core.v1.TypedLocalObjectReference)"""

    kind: str
    name: str
    apiGroup: str | None = None


class TypedObjectReference(KubeModel):
    """TypedObjectReference contains enough information to let you locate the typed referenced
    object (io.k8s.api.core.v1.TypedObjectReference)"""

    kind: str
    name: str
    apiGroup: str | None = None
    namespace: str | None = None


class VolumeResourceRequirements(KubeModel):
    """VolumeResourceRequirements describes the storage resource requirements for a volume.
    (io.k8s.api.core.v1.VolumeResourceRequirements)"""

    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class PersistentVolumeClaimSpec(KubeModel):
    """PersistentVolumeClaimSpec describes the common attributes of storage devices and allows a
    Source for provider-specific attributes (io.k8s.api.core.v1.PersistentVolumeClaimSpec)"""

    accessModes: list[str] | None = None
    dataSource: TypedLocalObjectReference | None = None
    dataSourceRef: TypedObjectReference | None = None
    resources: VolumeResourceRequirements | None = None
    selector: LabelSelector | None = None
    storageClassName: str | None = None
    volumeAttributesClassName: str | None = None
    volumeMode: str | None = None
    volumeName: str | None = None


class PersistentVolumeClaimTemplate(KubeModel):
    """PersistentVolumeClaimTemplate is used to produce PersistentVolumeClaim objects as part of
    an EphemeralVolumeSource. (io.k8s.api.core.v1.PersistentVolumeClaimTemplate)"""

    spec: PersistentVolumeClaimSpec
    metadata: ObjectMeta | None = None


class EphemeralVolumeSource(KubeModel):
    """Represents an ephemeral volume that is handled by a normal storage driver.
    (io.k8s.api.core.v1.EphemeralVolumeSource)"""

    volumeClaimTemplate: PersistentVolumeClaimTemplate | None = None


class PersistentVolumeClaimVolumeSource(KubeModel):
    """PersistentVolumeClaimVolumeSource references the user's PVC in the same namespace.
    (io.k8s.api.core.v1.PersistentVolumeClaimVolumeSource)"""

    claimName: str
    readOnly: bool | None = None


class ClusterTrustBundleProjection(KubeModel):
    """ClusterTrustBundleProjection describes how to select a set of ClusterTrustBundle objects
    and project their contents into the pod filesystem.
    (io.k8s.api.core.v1.ClusterTrustBundleProjection)"""

    path: str
    labelSelector: LabelSelector | None = None
    name: str | None = None
    optional: bool | None = None
    signerName: str | None = None
    user: int | None = None


class ConfigMapProjection(KubeModel):
    """Adapts a ConfigMap into a projected volume. (io.k8s.api.core.v1.ConfigMapProjection)"""

    items: list[KeyToPath] | None = None
    name: str | None = None
    optional: bool | None = None


class DownwardAPIProjection(KubeModel):
    """Represents downward API info for projecting into a projected volume.
    (io.k8s.api.core.v1.DownwardAPIProjection)"""

    items: list[DownwardAPIVolumeFile] | None = None


class PodCertificateProjection(KubeModel):
    """PodCertificateProjection provides a private key and X.509 certificate in the pod
    filesystem. (io.k8s.api.core.v1.PodCertificateProjection)"""

    keyType: str
    signerName: str
    certificateChainPath: str | None = None
    credentialBundlePath: str | None = None
    keyPath: str | None = None
    maxExpirationSeconds: int | None = None
    user: int | None = None
    userAnnotations: dict[str, str] | None = None


class SecretProjection(KubeModel):
    """Adapts a secret into a projected volume. (io.k8s.api.core.v1.SecretProjection)"""

    items: list[KeyToPath] | None = None
    name: str | None = None
    optional: bool | None = None


class ServiceAccountTokenProjection(KubeModel):
    """ServiceAccountTokenProjection represents a projected service account token volume.
    (io.k8s.api.core.v1.ServiceAccountTokenProjection)"""

    path: str
    audience: str | None = None
    expirationSeconds: int | None = None
    user: int | None = None


class VolumeProjection(KubeModel):
    """Projection that may be projected along with other supported volume types.
    (io.k8s.api.core.v1.VolumeProjection)"""

    clusterTrustBundle: ClusterTrustBundleProjection | None = None
    configMap: ConfigMapProjection | None = None
    downwardAPI: DownwardAPIProjection | None = None
    podCertificate: PodCertificateProjection | None = None
    secret: SecretProjection | None = None
    serviceAccountToken: ServiceAccountTokenProjection | None = None


class ProjectedVolumeSource(KubeModel):
    """Represents a projected volume source (io.k8s.api.core.v1.ProjectedVolumeSource)"""

    defaultMode: int | None = None
    defaultUser: int | None = None
    sources: list[VolumeProjection] | None = None


class SecretVolumeSource(KubeModel):
    """Adapts a Secret into a volume. (io.k8s.api.core.v1.SecretVolumeSource)"""

    defaultMode: int | None = None
    defaultUser: int | None = None
    items: list[KeyToPath] | None = None
    optional: bool | None = None
    secretName: str | None = None


class Volume(KubeModel):
    """Volume represents a named volume in a pod that may be accessed by any container in the
    pod. (io.k8s.api.core.v1.Volume)"""

    name: str
    configMap: ConfigMapVolumeSource | None = None
    csi: CSIVolumeSource | None = None
    downwardAPI: DownwardAPIVolumeSource | None = None
    emptyDir: EmptyDirVolumeSource | None = None
    ephemeral: EphemeralVolumeSource | None = None
    persistentVolumeClaim: PersistentVolumeClaimVolumeSource | None = None
    projected: ProjectedVolumeSource | None = None
    secret: SecretVolumeSource | None = None


class VolumeMount(KubeModel):
    """VolumeMount describes a mounting of a Volume within a container.
    (io.k8s.api.core.v1.VolumeMount)"""

    mountPath: str
    name: str
    bindMountOptions: list[str] | None = None
    mountPropagation: str | None = None
    readOnly: bool | None = None
    recursiveReadOnly: str | None = None
    subPath: str | None = None


class TopologySpreadConstraint(KubeModel):
    """TopologySpreadConstraint specifies how to spread matching pods among the given topology.
    (io.k8s.api.core.v1.TopologySpreadConstraint)"""

    maxSkew: int
    topologyKey: str
    whenUnsatisfiable: str
    labelSelector: LabelSelector | None = None
    matchLabelKeys: list[str] | None = None
    minDomains: int | None = None
    nodeAffinityPolicy: str | None = None
    nodeTaintsPolicy: str | None = None


class PodResourceClaim(KubeModel):
    """PodResourceClaim references exactly one ResourceClaim, either directly or by naming a
    ResourceClaimTemplate which is then turned into a ResourceClaim for the pod.
    (io.k8s.api.core.v1.PodResourceClaim)"""

    name: str
    resourceClaimName: str | None = None
    resourceClaimTemplateName: str | None = None
