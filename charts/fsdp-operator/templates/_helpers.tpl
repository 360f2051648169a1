{{- /* The labels every object of the release carries (Kubernetes' recommended labels). */ -}}
{{- define "fsdp-operator.selectorLabels" -}}
app.kubernetes.io/name: fsdp-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fsdp-operator.labels" -}}
{{ include "fsdp-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: fsdp-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- /* The operator image: the chart's appVersion unless image.tag says otherwise. */ -}}
{{- define "fsdp-operator.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
