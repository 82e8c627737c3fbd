"""The Kubernetes pod fields a pool may set on its workers, as pydantic models.

`spec.worker.podTemplate` follows cert-manager's ACME `podTemplate`: labels, annotations and
the scheduling fields of a pod (nodeSelector, affinity, tolerations, topology spread,
priority class, pull secrets) plus volumes; the worker container takes extra `env`,
`envFrom` and `volumeMounts`. Each type here is the upstream type cut down to what keeps a
pod inside the *restricted* Pod Security profile: there is no securityContext, no host
namespace and no hostPath, and a volume is one of the sources the profile allows. Being
models, they reach the CRD as a schema the API server enforces, and the operator copies
them into the Deployment as they are, with their upstream field names.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints

from leasebox_operator.model_base import (
    CelRule,
    LabelValue,
    Model,
    QualifiedName,
    Quantity,
    ResourceName,
    Text,
    cel,
)

Names = Annotated[list[Text], Field(max_length=64)]


class LocalObjectReference(Model):
    """A reference to an object in the pod's namespace."""

    name: ResourceName
    """Name of the object."""


class Toleration(Model):
    """Lets the workers run on nodes with a matching taint."""

    key: QualifiedName | None = None
    """Taint key; empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal (the default)."""
    value: LabelValue | None = None
    """Taint value for operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all."""
    toleration_seconds: int | None = Field(None, ge=0)
    """How long a NoExecute taint is tolerated."""


class LabelSelectorRequirement(Model):
    """One expression of a label selector."""

    key: QualifiedName
    """Label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the key relates to the values."""
    values: Names | None = None
    """Values for In and NotIn."""


class LabelSelector(Model):
    """Selects objects by label."""

    match_labels: dict[str, str] | None = None
    """Labels that must all match."""
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=16)] | None = None
    """Expressions that must all hold."""


class NodeSelectorRequirement(Model):
    """One expression over node labels or fields."""

    key: QualifiedName
    """Label or field key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the key relates to the values."""
    values: Names | None = None
    """Values."""


class NodeSelectorTerm(Model):
    """Expressions that must all hold for a node."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=16)] | None = None
    """Over node labels."""
    match_fields: Annotated[list[NodeSelectorRequirement], Field(max_length=16)] | None = None
    """Over node fields."""


class NodeSelector(Model):
    """Terms of which one must hold."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=16)]
    """The terms."""


class PreferredSchedulingTerm(Model):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100)
    """Weight, 1 to 100."""
    preference: NodeSelectorTerm
    """The preferred nodes."""


class NodeAffinity(Model):
    """Node affinity of the workers."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes the workers must run on."""
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=16)] | None
    ) = None
    """Nodes the workers prefer."""


class PodAffinityTerm(Model):
    """Pods the workers should (or should not) run beside."""

    label_selector: LabelSelector | None = None
    """The pods."""
    namespace_selector: LabelSelector | None = None
    """Namespaces of the pods."""
    namespaces: Names | None = None
    """Namespaces of the pods, by name."""
    topology_key: QualifiedName
    """The domain, e.g. topology.kubernetes.io/zone."""
    match_label_keys: Names | None = None
    """Pod label keys whose values are added to the selector."""
    mismatch_label_keys: Names | None = None
    """Pod label keys whose values are excluded by the selector."""


class WeightedPodAffinityTerm(Model):
    """A weighted pod affinity preference."""

    weight: int = Field(ge=1, le=100)
    """Weight, 1 to 100."""
    pod_affinity_term: PodAffinityTerm
    """The term."""


class PodAffinity(Model):
    """Pod affinity or anti-affinity."""

    required_during_scheduling_ignored_during_execution: (
        Annotated[list[PodAffinityTerm], Field(max_length=16)] | None
    ) = None
    """Terms that must hold."""
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[WeightedPodAffinityTerm], Field(max_length=16)] | None
    ) = None
    """Terms that should hold."""


class Affinity(Model):
    """Scheduling constraints of the workers."""

    node_affinity: NodeAffinity | None = None
    """Node affinity."""
    pod_affinity: PodAffinity | None = None
    """Pod affinity."""
    pod_anti_affinity: PodAffinity | None = None
    """Pod anti-affinity, e.g. spread workers over nodes."""


class TopologySpreadConstraint(Model):
    """How the workers spread over a topology (zones, nodes)."""

    max_skew: int = Field(ge=1)
    """Largest allowed difference in workers between two domains."""
    topology_key: QualifiedName
    """The domain label, e.g. topology.kubernetes.io/zone."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    """What to do when the skew cannot be kept."""
    label_selector: LabelSelector | None = None
    """The pods counted; usually the pool's worker labels."""
    min_domains: int | None = Field(None, ge=1)
    """Fewest eligible domains."""
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    """Whether node affinity limits the domains."""
    node_taints_policy: Literal["Honor", "Ignore"] | None = None
    """Whether node taints limit the domains."""
    match_label_keys: Names | None = None
    """Pod label keys whose values are added to the selector."""


class KeySelector(Model):
    """One key of a ConfigMap or Secret."""

    name: ResourceName
    """Name of the ConfigMap or Secret."""
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    """The key."""
    optional: bool | None = None
    """Start even when it is missing."""


class ObjectFieldSelector(Model):
    """A field of the pod (downward API)."""

    field_path: Text
    """e.g. metadata.name or spec.nodeName."""
    api_version: Text | None = None
    """Version of the field path's schema."""


class ResourceFieldSelector(Model):
    """A resource request or limit of a container (downward API)."""

    resource: Text
    """e.g. limits.memory."""
    container_name: Text | None = None
    """The container; the worker when unset."""
    divisor: Quantity | None = None
    """Unit of the value."""


class EnvVarSource(Model):
    """Where an environment variable's value comes from."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef),"
            " has(self.resourceFieldRef)].exists_one(x, x)",
            "valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef and "
            "resourceFieldRef",
            lambda s: (
                sum(
                    v is not None
                    for v in (
                        s.secret_key_ref,
                        s.config_map_key_ref,
                        s.field_ref,
                        s.resource_field_ref,
                    )
                )
                == 1
            ),
        ),
    )
    model_config = cel(cel_rules)

    secret_key_ref: KeySelector | None = None
    """A key of a Secret."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""
    field_ref: ObjectFieldSelector | None = None
    """A field of the pod."""
    resource_field_ref: ResourceFieldSelector | None = None
    """A resource of the container."""


class EnvVar(Model):
    """An extra environment variable of the worker container."""

    name: Annotated[str, StringConstraints(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=253)]
    """Variable name."""
    value: Annotated[str, StringConstraints(max_length=32768)] | None = None
    """Literal value."""
    value_from: EnvVarSource | None = None
    """A value from a Secret, a ConfigMap or the pod."""


class ConfigMapEnvSource(Model):
    """Every key of a ConfigMap or Secret as a variable."""

    name: ResourceName
    """Name of the ConfigMap or Secret."""
    optional: bool | None = None
    """Start even when it is missing."""


class EnvFromSource(Model):
    """A ConfigMap or Secret whose keys become variables."""

    prefix: Annotated[str, StringConstraints(max_length=253)] | None = None
    """Prefix of every variable name."""
    config_map_ref: ConfigMapEnvSource | None = None
    """The ConfigMap."""
    secret_ref: ConfigMapEnvSource | None = None
    """The Secret."""


class VolumeMount(Model):
    """Where a volume of the pod template is mounted in the worker container."""

    name: ResourceName
    """Name of a volume in podTemplate.spec.volumes."""
    mount_path: Annotated[str, StringConstraints(pattern=r"^/", max_length=1024)]
    """Absolute path in the container."""
    sub_path: Text | None = None
    """Path inside the volume."""
    read_only: bool | None = None
    """Mount read-only (the worker writes nowhere but /tmp)."""


class KeyToPath(Model):
    """A key of a ConfigMap or Secret as a file."""

    key: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    """The key."""
    path: Text
    """Relative file path."""
    mode: int | None = Field(None, ge=0, le=0o777)
    """File mode bits."""


class ConfigMapVolumeSource(Model):
    """A ConfigMap as files."""

    name: ResourceName
    """Name of the ConfigMap."""
    items: Annotated[list[KeyToPath], Field(max_length=64)] | None = None
    """Only these keys, at these paths."""
    default_mode: int | None = Field(None, ge=0, le=0o777)
    """Mode bits of the files."""
    optional: bool | None = None
    """Start even when it is missing."""


class SecretVolumeSource(Model):
    """A Secret as files (CA certificates, client certificates)."""

    secret_name: ResourceName
    """Name of the Secret."""
    items: Annotated[list[KeyToPath], Field(max_length=64)] | None = None
    """Only these keys, at these paths."""
    default_mode: int | None = Field(None, ge=0, le=0o777)
    """Mode bits of the files."""
    optional: bool | None = None
    """Start even when it is missing."""


class EmptyDirVolumeSource(Model):
    """A scratch directory that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = None
    """Memory for a tmpfs."""
    size_limit: Quantity | None = None
    """Largest size."""


class PersistentVolumeClaimVolumeSource(Model):
    """A persistent volume claim."""

    claim_name: ResourceName
    """Name of the claim."""
    read_only: bool | None = None
    """Mount read-only."""


class CSIVolumeSource(Model):
    """A volume from a CSI driver (e.g. a secrets-store driver)."""

    driver: Text
    """Driver name."""
    read_only: bool | None = None
    """Mount read-only."""
    fs_type: Text | None = None
    """Filesystem type."""
    volume_attributes: dict[str, str] | None = None
    """Driver-specific attributes."""
    node_publish_secret_ref: LocalObjectReference | None = None
    """Secret passed to the driver."""


class ServiceAccountTokenProjection(Model):
    """A service account token for an audience (e.g. a secrets vault)."""

    path: Text
    """Relative file path."""
    audience: Text | None = None
    """Intended audience of the token."""
    expiration_seconds: int | None = Field(None, ge=600)
    """Requested lifetime."""


class ProjectedSource(Model):
    """One source of a projected volume."""

    config_map: ConfigMapVolumeSource | None = None
    """A ConfigMap."""
    secret: ConfigMapVolumeSource | None = None
    """A Secret (by `name`)."""
    service_account_token: ServiceAccountTokenProjection | None = None
    """A service account token."""


class ProjectedVolumeSource(Model):
    """Several sources in one directory."""

    sources: Annotated[list[ProjectedSource], Field(max_length=16)]
    """The sources."""
    default_mode: int | None = Field(None, ge=0, le=0o777)
    """Mode bits of the files."""


_SOURCES = ("configMap", "secret", "emptyDir", "projected", "persistentVolumeClaim", "csi")


class Volume(Model):
    """A volume of the worker pods, of a source the restricted Pod Security profile allows."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "[" + ", ".join(f"has(self.{s})" for s in _SOURCES) + "].exists_one(x, x)",
            "a volume takes exactly one of " + ", ".join(_SOURCES),
            lambda v: sum(getattr(v, f) is not None for f in Volume.source_fields()) == 1,
        ),
    )
    model_config = cel(cel_rules)

    name: ResourceName
    """Volume name, referred to by volumeMounts."""
    config_map: ConfigMapVolumeSource | None = None
    """A ConfigMap."""
    secret: SecretVolumeSource | None = None
    """A Secret."""
    empty_dir: EmptyDirVolumeSource | None = None
    """A scratch directory."""
    projected: ProjectedVolumeSource | None = None
    """Several sources in one directory."""
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None
    """A persistent volume claim."""
    csi: CSIVolumeSource | None = None
    """A CSI volume."""

    @staticmethod
    def source_fields() -> tuple[str, ...]:
        return ("config_map", "secret", "empty_dir", "projected", "persistent_volume_claim", "csi")


class PodTemplateMetadata(Model):
    """Labels and annotations added to the worker pods."""

    labels: Annotated[dict[str, LabelValue], Field(max_length=64)] | None = None
    """Extra pod labels; the operator's own label keys are reserved."""
    annotations: dict[str, str] | None = None
    """Extra pod annotations, e.g. a service mesh's."""


class PodTemplateSpec(Model):
    """Scheduling and volumes of the worker pods."""

    node_selector: dict[str, LabelValue] | None = None
    """Node labels the workers must run on."""
    affinity: Affinity | None = None
    """Node and pod (anti-)affinity."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = None
    """Taints the workers tolerate."""
    topology_spread_constraints: (
        Annotated[list[TopologySpreadConstraint], Field(max_length=8)] | None
    ) = None
    """How the workers spread over zones or nodes."""
    priority_class_name: ResourceName | None = None
    """Priority class of the worker pods."""
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=16)] | None = None
    """Secrets holding credentials of a private registry."""
    volumes: Annotated[list[Volume], Field(max_length=32)] | None = None
    """Extra volumes, mounted with spec.worker.volumeMounts."""


class PodTemplate(Model):
    """What the worker pods get beyond what the operator sets (cert-manager's podTemplate)."""

    metadata: PodTemplateMetadata | None = None
    """Pod labels and annotations."""
    spec: PodTemplateSpec | None = None
    """Pod scheduling and volumes."""


def dump(model: Model | None) -> Any:
    """A model as the Kubernetes manifest fragment it stands for (unset fields left out)."""
    return None if model is None else model.model_dump(by_alias=True, exclude_none=True)
