{{- /*
The app.kubernetes.io/name label: the chart's name unless nameOverride says otherwise.
*/ -}}
{{- define "fsdp-operator.name" -}}
{{ .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /*
The base of every object's name (the Deployment, ServiceAccount, Lease, roles, policies, and
"<fullname>-..."): the release name unless fullnameOverride says otherwise. Not Helm's usual
"<release>-<chart>": a release named fsdp-operator keeps the names it has always had.
*/ -}}
{{- define "fsdp-operator.fullname" -}}
{{ .Values.fullnameOverride | default .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /* The labels every object of the release carries (Kubernetes' recommended labels). */ -}}
{{- define "fsdp-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fsdp-operator.name" . }}
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

{{- /*
The Pod Security "restricted" rules but capabilities, as ValidatingAdmissionPolicy validations
(admission-policy.yaml, runtime-profiles.yaml). Arguments: guard (a CEL prefix that exempts a
request, e.g. "!variables.listed || ", or ""), who ("operator pods"), one ("an operator pod").
The policy defines variables.containers and variables.hasPodSecurity. Optional, for what a
runtime profile may grant (the runtime-profile pod policy then holds the pod to its own
profile): held (the variable naming the containers the privilege and identity rules judge;
default containers), hostNetwork (a CEL bool: the pod may use the host's network, its ports
then host ports equal to its container ports; default false), hostPath (a CEL bool of the
volume v: this hostPath volume is allowed; default false).
*/ -}}
{{- define "fsdp-operator.restrictedValidations" -}}
- expression: >-
    {{ .guard }}((!(has(object.spec.hostNetwork) && object.spec.hostNetwork) || {{ .hostNetwork | default "false" }}) &&
    !(has(object.spec.hostPID) && object.spec.hostPID) &&
    !(has(object.spec.hostIPC) && object.spec.hostIPC))
  message: >-
    {{ .who }} may not use the host's network, PID or IPC namespace (restricted{{ if .hostNetwork }};
    the network only under a runtime profile this chart binds that grants hostNetwork{{ end }})
- expression: >-
    {{ .guard }}(!has(object.spec.volumes) || object.spec.volumes.all(v,
      has(v.configMap) || has(v.csi) || has(v.downwardAPI) || has(v.emptyDir) ||
      has(v.ephemeral) || has(v.persistentVolumeClaim) || has(v.projected) || has(v.secret) ||
      {{ .hostPath | default "false" }}))
  message: >-
    {{ .who }} may only use configMap, csi, downwardAPI, emptyDir, ephemeral,
    persistentVolumeClaim, projected and secret volumes (restricted{{ if .hostPath }}; hostPath
    only as a runtime profile this chart binds gives it, by name and path{{ end }})
- expression: >-
    {{ .guard }}(variables.{{ .held | default "containers" }}.all(c, !has(c.securityContext) ||
      !has(c.securityContext.privileged) || !c.securityContext.privileged))
  message: {{ .who }} may not run privileged containers (restricted)
- expression: >-
    {{ .guard }}(variables.{{ .held | default "containers" }}.all(c, has(c.securityContext) &&
      has(c.securityContext.allowPrivilegeEscalation) &&
      !c.securityContext.allowPrivilegeEscalation))
  message: every container of {{ .one }} must set allowPrivilegeEscalation=false (restricted)
- expression: >-
    {{ .guard }}(((variables.hasPodSecurity && has(object.spec.securityContext.runAsNonRoot)) && object.spec.securityContext.runAsNonRoot)
      ? variables.{{ .held | default "containers" }}.all(c, !has(c.securityContext) ||
          !has(c.securityContext.runAsNonRoot) || c.securityContext.runAsNonRoot)
      : variables.{{ .held | default "containers" }}.all(c, has(c.securityContext) &&
          has(c.securityContext.runAsNonRoot) && c.securityContext.runAsNonRoot))
  message: {{ .who }} must run as non-root (runAsNonRoot=true) (restricted)
- expression: >-
    {{ .guard }}((!(variables.hasPodSecurity && has(object.spec.securityContext.runAsUser)) || object.spec.securityContext.runAsUser != 0) &&
    variables.{{ .held | default "containers" }}.all(c, !has(c.securityContext) ||
      !has(c.securityContext.runAsUser) || c.securityContext.runAsUser != 0))
  message: {{ .who }} may not run as uid 0 (restricted)
- expression: >-
    {{ .guard }}(((variables.hasPodSecurity && has(object.spec.securityContext.seccompProfile)) &&
      object.spec.securityContext.seccompProfile.type in ['RuntimeDefault', 'Localhost'])
      ? variables.containers.all(c, !has(c.securityContext) ||
          !has(c.securityContext.seccompProfile) ||
          c.securityContext.seccompProfile.type in ['RuntimeDefault', 'Localhost'])
      : variables.containers.all(c, has(c.securityContext) &&
          has(c.securityContext.seccompProfile) &&
          c.securityContext.seccompProfile.type in ['RuntimeDefault', 'Localhost']))
  message: {{ .who }} must use the RuntimeDefault or a Localhost seccomp profile (restricted)
- expression: >-
    {{ .guard }}(variables.containers.all(c, !has(c.ports) ||
      c.ports.all(p, !has(p.hostPort) || p.hostPort == 0 ||
        ({{ .hostNetwork | default "false" }} && p.hostPort == p.containerPort))))
  message: >-
    {{ .who }} may not use host ports (restricted{{ if .hostNetwork }}; on the host's network
    under a runtime profile granting it, each port's hostPort is its containerPort{{ end }})
- expression: >-
    {{ .guard }}(!(variables.hasPodSecurity && has(object.spec.securityContext.sysctls)) || size(object.spec.securityContext.sysctls) == 0)
  message: {{ .who }} may not set sysctls
- expression: >-
    {{ .guard }}((!(variables.hasPodSecurity && has(object.spec.securityContext.appArmorProfile)) ||
      object.spec.securityContext.appArmorProfile.type != 'Unconfined') &&
    variables.containers.all(c, !has(c.securityContext) ||
      !has(c.securityContext.appArmorProfile) ||
      c.securityContext.appArmorProfile.type != 'Unconfined') &&
    (!has(object.metadata.annotations) || object.metadata.annotations.all(k,
      !k.startsWith('container.apparmor.security.beta.kubernetes.io/') ||
      object.metadata.annotations[k] != 'unconfined')))
  message: {{ .who }} may not run unconfined by AppArmor (restricted)
- expression: >-
    {{ .guard }}((!(variables.hasPodSecurity && has(object.spec.securityContext.seLinuxOptions)) ||
      (!has(object.spec.securityContext.seLinuxOptions.user) &&
       !has(object.spec.securityContext.seLinuxOptions.role))) &&
    variables.containers.all(c, !has(c.securityContext) ||
      !has(c.securityContext.seLinuxOptions) ||
      (!has(c.securityContext.seLinuxOptions.user) &&
       !has(c.securityContext.seLinuxOptions.role))))
  message: {{ .who }} may not set an SELinux user or role (restricted)
- expression: >-
    {{ .guard }}(variables.containers.all(c, !has(c.securityContext) ||
      !has(c.securityContext.procMount) || c.securityContext.procMount == 'Default') &&
    (!(variables.hasPodSecurity && has(object.spec.securityContext.windowsOptions)) ||
      !has(object.spec.securityContext.windowsOptions.hostProcess) ||
      !object.spec.securityContext.windowsOptions.hostProcess))
  message: {{ .who }} may not unmask /proc or run as Windows host processes (restricted)
{{- end }}
