{{- define "kmodkit.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kmodkit.namespace" -}}
{{- .Values.namespace.name -}}
{{- end -}}

{{- define "kmodkit.serviceAccount" -}}
{{- .Values.serviceAccount.name | default (include "kmodkit.fullname" .) -}}
{{- end -}}

{{- define "kmodkit.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kmodkit.labels" -}}
{{ include "kmodkit.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* An image reference from {repository, tag, digest}; the tag defaults to appVersion. */}}
{{- define "kmodkit.image" -}}
{{- $ref := printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- if .image.digest -}}{{- $ref = printf "%s@%s" $ref .image.digest -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* Enabled backends as KMODKIT_BACKENDS wants them. With none enabled, a name no
backend has: only the built-in Module engine runs (empty would enable all). */}}
{{- define "kmodkit.backends" -}}
{{- $on := list -}}
{{- range $name, $b := .Values.backends -}}
{{- if $b.enabled -}}{{- $on = append $on $name -}}{{- end -}}
{{- end -}}
{{- if $on -}}{{- join "," $on -}}{{- else -}}none{{- end -}}
{{- end -}}

{{/* The Tenstorrent builder image: upstream's driver.image fields win where set. */}}
{{- define "kmodkit.ttBuilderImage" -}}
{{- $image := deepCopy .Values.tenstorrent.builderImage -}}
{{- range $field, $value := .Values.driver.image -}}
{{- if $value -}}{{- $_ := set $image $field $value -}}{{- end -}}
{{- end -}}
{{- include "kmodkit.image" (dict "image" $image "root" .) -}}
{{- end -}}

{{/* controller.extraEnv as name/value pairs, from a map or from a list of env entries. */}}
{{- define "kmodkit.extraEnv" -}}
{{- $env := dict -}}
{{- if kindIs "slice" .Values.controller.extraEnv -}}
{{- range .Values.controller.extraEnv -}}
{{- if hasKey $env .name -}}{{- fail (printf "controller.extraEnv lists %s twice; keep one entry" .name) -}}{{- end -}}
{{- $_ := set $env .name .value -}}
{{- end -}}
{{- else -}}
{{- $env = .Values.controller.extraEnv -}}
{{- end -}}
{{- toYaml $env -}}
{{- end -}}
