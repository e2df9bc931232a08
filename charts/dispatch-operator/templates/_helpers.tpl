{{/*
The chart name, truncated to 63 characters (a DNS label).
*/}}
{{- define "dispatch-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name prefix of every object: the release name when it already contains the chart
name, else "<release>-<chart>".
*/}}
{{- define "dispatch-operator.fullname" -}}
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

{{- define "dispatch-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The recommended labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
*/}}
{{- define "dispatch-operator.labels" -}}
helm.sh/chart: {{ include "dispatch-operator.chart" . }}
{{ include "dispatch-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: dispatch
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The labels that select the operator's Pods (immutable in a Deployment: never add to them).
*/}}
{{- define "dispatch-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dispatch-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dispatch-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dispatch-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
"true" when the operator runs leader election: asked for, or more than one replica.
*/}}
{{- define "dispatch-operator.leaderElect" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) }}true{{ end }}
{{- end }}

{{- define "dispatch-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Where the Slurm token Secret is mounted, and the config file.
*/}}
{{- define "dispatch-operator.slurmTokenDir" -}}/var/run/secrets/dispatch.dev/slurm{{- end }}
{{- define "dispatch-operator.slurmTenantTokenDir" -}}/var/run/secrets/dispatch.dev/slurm-tenants{{- end }}
{{- define "dispatch-operator.slurmConfigDir" -}}/etc/dispatch{{- end }}
{{- define "dispatch-operator.slurmCADir" -}}/etc/dispatch-slurm-ca{{- end }}

{{- /*
What the operator does to the objects of the jobs it supervises. Cluster-wide when
watchNamespaces is empty, else the same rules in a Role in each watched namespace.
No wildcards: every group, resource and verb is named.
*/}}
{{- define "dispatch-operator.jobRules" -}}
# DispatchJobs: read and watch them; patch for the deletion finalizer
# (dispatch.dev/finalizer: the webhook adds it on CREATE, the loop removes it) and the operator's own
# metadata; delete a settled one once its time to live has passed (spec.ttlSecondsAfterSettled or
# settledTTLSeconds), with a resourceVersion precondition. Never create or update them.
- apiGroups: ["dispatch.dev"]
  resources: ["dispatchjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# The record lives in .status: written with a resourceVersion precondition (PUT = update, or a
# merge patch carrying metadata.resourceVersion), which is what makes double authorization
# impossible.
- apiGroups: ["dispatch.dev"]
  resources: ["dispatchjobs/status"]
  verbs: ["get", "update", "patch"]
# Creating a backend's object whose ownerReference to its DispatchJob sets blockOwnerDeletion needs
# update on the owner's finalizers subresource (OwnerReferencesPermissionEnforcement).
- apiGroups: ["dispatch.dev"]
  resources: ["dispatchjobs/finalizers"]
  verbs: ["update"]
# Events about DispatchJobs (the operator's own, and kopf's handler logs posted as events).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# What each enabled backend needs (.Values.backends), generated from the backend registry.
{{- include "dispatch-operator.backendRules" . }}
{{- end }}

{{/*
The admission webhooks: the Service the API server calls, the Secret with its certificate, and
where that Secret is mounted (given to the operator as DISPATCH_WEBHOOK_CERT_DIR).
*/}}
{{- define "dispatch-operator.webhookService" -}}
{{- printf "%s-webhook" (include "dispatch-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "dispatch-operator.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "dispatch-operator.fullname" .)) .Values.webhook.certSecret }}
{{- end }}
{{- define "dispatch-operator.webhookCertDir" -}}/var/run/secrets/dispatch.dev/webhook{{- end }}
