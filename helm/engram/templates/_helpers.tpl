{{/* The name of every object of a release. */}}
{{- define "engram.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "engram.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "engram.labels" -}}
{{ include "engram.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "engram.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "engram.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "engram.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Whether the database is external (Postgres) rather than embedded. */}}
{{- define "engram.externalDatabase" -}}
{{- if or .Values.database.url .Values.database.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "engram.databaseSecret" -}}
{{- default (printf "%s-database" (include "engram.fullname" .)) .Values.database.existingSecret -}}
{{- end -}}

{{- define "engram.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "engram.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "engram.bootstrapSecret" -}}
{{- printf "%s-bootstrap-token" (include "engram.fullname" .) -}}
{{- end -}}

{{/*
The bootstrap token: kept from the Secret of an earlier install (so
upgrades do not change it), else made now.
*/}}
{{- define "engram.bootstrapToken" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "engram.bootstrapSecret" .) -}}
{{- if and $existing $existing.data (hasKey $existing.data "token") -}}
{{- index $existing.data "token" | b64dec -}}
{{- else -}}
{{- printf "eg_%s" (randAlphaNum 43) -}}
{{- end -}}
{{- end -}}

{{/* The container's environment: settings, then secrets. */}}
{{- define "engram.env" -}}
- name: ENGRAM_DATABASE_URL
{{- if include "engram.externalDatabase" . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "engram.databaseSecret" . }}
      key: {{ .Values.database.key }}
{{- else }}
  value: sqlite:///data/engram.db
{{- end }}
{{- include "engram.databaseCAEnv" . }}
{{- end -}}

{{/* Where the database's CA certificate is mounted, when one is given. */}}
{{- define "engram.databaseCAEnv" -}}
{{- if .Values.database.caSecret }}
- name: PGSSLROOTCERT
  value: /etc/engram/database-ca/{{ .Values.database.caKey }}
{{- end }}
{{- end -}}

{{/* The database CA's volume mount and volume, for the pods and the Job. */}}
{{- define "engram.databaseCAMount" -}}
{{- if .Values.database.caSecret }}
- name: database-ca
  mountPath: /etc/engram/database-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "engram.databaseCAVolume" -}}
{{- if .Values.database.caSecret }}
- name: database-ca
  secret:
    secretName: {{ .Values.database.caSecret }}
{{- end }}
{{- end -}}

{{- define "engram.migrationSecret" -}}
{{- with .Values.database.migration -}}
{{- if .existingSecret -}}{{ .existingSecret }}{{- else if .url -}}{{ printf "%s-migration" (include "engram.fullname" $) }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* The migration Job's database URL: its own when configured. */}}
{{- define "engram.migrationEnv" -}}
{{- $secret := include "engram.migrationSecret" . -}}
{{- if $secret }}
- name: ENGRAM_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.database.migration.key }}
{{- include "engram.databaseCAEnv" . }}
{{- else }}
{{- include "engram.env" . }}
{{- end }}
{{- end -}}

{{/* The embedded store's claim: the one given, or the chart's own. */}}
{{- define "engram.dataClaim" -}}
{{- default (printf "%s-data" (include "engram.fullname" .)) .Values.persistence.existingClaim -}}
{{- end -}}
