{{/* Chart name, truncated to 63 characters (DNS label). */}}
{{- define "nodecache.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name: the release name when it already names the chart, else <release>-<chart>. */}}
{{- define "nodecache.fullname" -}}
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

{{/* The component label: node (agent and cleanup share the DaemonSet and its selector) or shared. */}}
{{- define "nodecache.component" -}}
{{- if eq .Values.mode "shared" -}}shared{{- else -}}node{{- end -}}
{{- end -}}

{{- define "nodecache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodecache.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ include "nodecache.component" . }}
{{- end -}}

{{- define "nodecache.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "nodecache.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "nodecache.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Whether the cluster serves the Prometheus Operator kind given as "Kind". */}}
{{- define "nodecache.hasMonitoring" -}}
{{- if .Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) -}}true{{- end -}}
{{- end -}}

{{/* "monitor", "annotations" or "" for the current mode and cluster. */}}
{{- define "nodecache.discovery" -}}
{{- $kind := ternary "ServiceMonitor" "PodMonitor" (eq .Values.mode "shared") -}}
{{- if or (eq .Values.mode "cleanup") (not .Values.metrics.enabled) (eq .Values.metrics.discovery "none") -}}
{{- else if eq .Values.metrics.discovery "monitor" -}}monitor
{{- else if eq .Values.metrics.discovery "annotations" -}}annotations
{{- else if include "nodecache.hasMonitoring" (dict "Capabilities" .Capabilities "kind" $kind) -}}monitor
{{- else -}}annotations
{{- end -}}
{{- end -}}

{{- define "nodecache.scrapeAnnotations" -}}
{{- if eq (include "nodecache.discovery" .) "annotations" }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* The flags agent and serve share (each has its own --max-size). */}}
{{- define "nodecache.commonArgs" -}}
{{- range .Values.upstreams }}
- {{ printf "--upstream=%s" . | quote }}
{{- end }}
{{- if include "nodecache.upstreamAuth" . }}
{{- range .Values.upstreamAuth.upstreams }}
- {{ printf "--upstream-auth=%s=/etc/nodecache/upstream-auth/.dockerconfigjson" . | quote }}
{{- end }}
{{- end }}
{{- range .Values.pullAllow }}
- {{ printf "--pull-allow=%s" . | quote }}
{{- end }}
{{- range .Values.allow }}
- {{ printf "--allow=%s" . | quote }}
{{- end }}
{{- with .Values.chain }}
- {{ printf "--chain=%s" . | quote }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* "true" when upstream credentials are configured; refuses half a configuration. */}}
{{- define "nodecache.upstreamAuth" -}}
{{- $a := .Values.upstreamAuth -}}
{{- if and $a.secretName (not $a.upstreams) -}}
{{- fail "upstreamAuth.secretName is set but upstreamAuth.upstreams is empty: name the upstreams (e.g. [docker.io]) that get these credentials" -}}
{{- else if and $a.upstreams (not $a.secretName) -}}
{{- fail "upstreamAuth.upstreams is set but upstreamAuth.secretName is empty: name a kubernetes.io/dockerconfigjson Secret" -}}
{{- else if $a.secretName -}}true
{{- end -}}
{{- end -}}

{{- define "nodecache.upstreamAuthMount" -}}
{{- if include "nodecache.upstreamAuth" . }}
- name: upstream-auth
  mountPath: /etc/nodecache/upstream-auth
  readOnly: true
{{- end }}
{{- end -}}

{{- define "nodecache.upstreamAuthVolume" -}}
{{- if include "nodecache.upstreamAuth" . }}
- name: upstream-auth
  secret:
    secretName: {{ .Values.upstreamAuth.secretName }}
{{- end }}
{{- end -}}

{{/* "true" when peers are enabled in a mode that serves; refuses peers without the key's Secret. */}}
{{- define "nodecache.peers" -}}
{{- $p := .Values.peers -}}
{{- if and $p.enabled (ne .Values.mode "cleanup") -}}
{{- if not $p.keySecret -}}
{{- fail "peers.enabled needs peers.keySecret: the name of a Secret in the release namespace holding the cluster key under the key `key`, e.g. kubectl -n <namespace> create secret generic nodecache-peer-key --from-literal=key=$(openssl rand -hex 32), then --set peers.keySecret=nodecache-peer-key. Every peer request is signed with it; without it the peer port would be refused (--peer-listen needs --peer-key-file)" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* The headless Service that lists the Ready pods for --peers. */}}
{{- define "nodecache.peersService" -}}
{{- printf "%s-peers" (include "nodecache.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* --peers, --peer-listen (on the address in $(addrVar)), --peer-key-file, --peers-refresh, --peer-dial-timeout. */}}
{{- define "nodecache.peerArgs" -}}
{{- $p := .ctx.Values.peers -}}
- {{ printf "--peers=dns:%s.%s.svc.%s:%d" (include "nodecache.peersService" .ctx) .ctx.Release.Namespace $p.clusterDomain (int $p.port) | quote }}
- {{ printf "--peer-listen=[$(%s)]:%d" .addrVar (int $p.port) | quote }}
- --peer-key-file=/etc/nodecache/peer/key
- {{ printf "--peers-refresh=%s" $p.refresh | quote }}
- {{ printf "--peer-dial-timeout=%s" $p.dialTimeout | quote }}
{{- end -}}

{{- define "nodecache.peerPort" -}}
- name: peer
  containerPort: {{ .Values.peers.port }}
{{- end -}}

{{- define "nodecache.peerKeyMount" -}}
- name: peer-key
  mountPath: /etc/nodecache/peer
  readOnly: true
{{- end -}}

{{- define "nodecache.peerKeyVolume" -}}
- name: peer-key
  secret:
    secretName: {{ .Values.peers.keySecret }}
    items:
      - key: key
        path: key
{{- end -}}

{{/* The headless Service over the workload's pods: its records are the Ready pods' addresses. */}}
{{- define "nodecache.peersServiceObject" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "nodecache.peersService" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- /* component peers: the shared mode's ServiceMonitor selects component shared, not this. */}}
    {{- include "nodecache.labels" . | fromYaml | merge (dict "app.kubernetes.io/component" "peers") | toYaml | nindent 4 }}
spec:
  clusterIP: None
  # Only Ready pods are members: a pod that cannot serve is not asked.
  publishNotReadyAddresses: false
  selector:
    {{- include "nodecache.selectorLabels" . | nindent 4 }}
  ports:
    - name: peer
      port: {{ .Values.peers.port }}
      targetPort: peer
{{- end -}}
