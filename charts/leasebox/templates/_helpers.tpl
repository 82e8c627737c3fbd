{{/*
The chart name, overridable with nameOverride.
*/}}
{{- define "leasebox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified name used for resource names: <release>-<chart>, or the release
name alone when it already contains the chart name. Truncated to 63 characters.
*/}}
{{- define "leasebox.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The namespace the chart installs into.
*/}}
{{- define "leasebox.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "leasebox.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every resource.
*/}}
{{- define "leasebox.labels" -}}
helm.sh/chart: {{ include "leasebox.chart" . }}
{{ include "leasebox.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: leasebox
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels of the operator.
*/}}
{{- define "leasebox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leasebox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of operator resources (labels plus the component).
*/}}
{{- define "leasebox.operatorLabels" -}}
{{ include "leasebox.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Selector labels of the operator pods.
*/}}
{{- define "leasebox.operatorSelectorLabels" -}}
{{ include "leasebox.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
The ServiceAccount name.
*/}}
{{- define "leasebox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "leasebox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The container image reference: repository plus digest, or plus tag (default appVersion).
*/}}
{{- define "leasebox.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
True (non-empty) when the operator watches the whole cluster.
*/}}
{{- define "leasebox.clusterWide" -}}
{{- if not .Values.operator.watchNamespaces }}true{{- end }}
{{- end }}

{{/*
The namespace of an optional monitoring object: its own override or the chart namespace.
Call with (dict "ctx" $ "namespace" .Values.x.namespace).
*/}}
{{- define "leasebox.objectNamespace" -}}
{{- default (include "leasebox.namespace" .ctx) .namespace }}
{{- end }}

{{/*
True (non-empty) when the operator runs with kopf peering: asked for, or more than one replica.
*/}}
{{- define "leasebox.peering" -}}
{{- if or .Values.operator.peering.enabled (gt (int .Values.operator.replicas) 1) }}true{{- end }}
{{- end }}

{{/*
Rules the operator needs in every namespace it watches (namespaced mode) or cluster-wide:
only the verbs it uses. kopf watches and patches pools (finalizer, annotations) and their
status; children are read, created and server-side applied (patch), and the worker
Deployments are listed and watched (polls read them from that watch); replicas change through
the Deployment's scale subresource; Events are created, never updated.
*/}}
{{- define "leasebox.namespacedRules" -}}
- apiGroups: ["leasebox.dev"]
  resources: ["outboxworkerpools"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["leasebox.dev"]
  resources: ["outboxworkerpools/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  {{- with .Values.rbac.secretNames }}
  resourceNames:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors", "prometheusrules"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}

{{/*
Labels of the `leasebox web` resources (labels plus the component).
*/}}
{{- define "leasebox.webLabels" -}}
{{ include "leasebox.labels" . }}
app.kubernetes.io/component: web
{{- end }}

{{/*
Selector labels of the `leasebox web` pods.
*/}}
{{- define "leasebox.webSelectorLabels" -}}
{{ include "leasebox.selectorLabels" . }}
app.kubernetes.io/component: web
{{- end }}
