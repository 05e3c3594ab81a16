{{/* The release's name for every object, at most 63 characters (a DNS label). */}}
{{- define "tailtrap.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tailtrap.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the pods: never change them in an upgrade (a selector is immutable). */}}
{{- define "tailtrap.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tailtrap.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tailtrap.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tailtrap.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tailtrap.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tailtrap.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Where pwru's binary appears in the container. */}}
{{- define "tailtrap.pwruPath" -}}/usr/local/bin/pwru{{- end -}}

{{/*
The daemon's TOML: values.config read as TOML, then the keys the chart must own (they
have to match its mounts and ports) set over it. Numbers keep their TOML types because
the text is parsed as TOML, not as YAML values.
*/}}
{{- define "tailtrap.config" -}}
{{- $user := dict -}}
{{- if .Values.config -}}
{{- $user = fromToml .Values.config -}}
{{- if hasKey $user "Error" -}}
{{- fail (printf "values.config is not valid TOML: %s" (get $user "Error")) -}}
{{- end -}}
{{- end -}}
{{- $pwru := dict "enabled" false -}}
{{- if .Values.pwru.hostPath -}}
{{- $pwru = dict "enabled" true "binary" (include "tailtrap.pwruPath" .) "runtime_dir" "/run/tailtrap" -}}
{{- end -}}
{{- $owned := dict
    "daemon" (dict "db" "/var/lib/tailtrap/db")
    "api" (dict "socket" "/run/tailtrap/api.sock")
    "metrics" (dict "enabled" .Values.metrics.enabled "listen" (printf "%s:%d" .Values.metrics.listenAddress (int .Values.metrics.port)))
    "pwru" $pwru -}}
{{- toToml (mergeOverwrite $user $owned) -}}
{{- end -}}
