{{- define "lockd.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lockd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lockd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "lockd.labels" -}}
{{ include "lockd.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* lockd.validate fails the render on a values combination lockd would refuse. */}}
{{- define "lockd.validate" -}}
{{- if not (has .Values.mode (list "embedded" "etcd" "pg")) -}}
{{- fail (printf "mode must be embedded, etcd or pg, not %q" .Values.mode) -}}
{{- end -}}
{{- if and (eq .Values.mode "etcd") (empty .Values.etcd.endpoints) -}}
{{- fail "mode etcd needs etcd.endpoints" -}}
{{- end -}}
{{- if and (eq .Values.mode "pg") (empty .Values.pg.dsnSecret.name) -}}
{{- fail "mode pg needs pg.dsnSecret.name (a Secret holding the DSN)" -}}
{{- end -}}
{{- if and .Values.http.console (not .Values.http.enabled) -}}
{{- fail "http.console needs http.enabled (the console is served on the HTTP/JSON API's port, C5 #ct5-console)" -}}
{{- end -}}
{{- if and (empty .Values.tls.secretName) (not .Values.insecureAllowRemote) -}}
{{- fail "lockd listens on the pod network: set tls.secretName, or insecureAllowRemote=true for plaintext (C5 #ct5-tls)" -}}
{{- end -}}
{{- if and .Values.tls.secretName (ne .Values.tls.clientAuth "require") (not .Values.insecureAllowRemote) -}}
{{- fail (printf "tls.clientAuth %s lets clients without a certificate in as anonymous, and the chart sets no access policy: every one of them would be an admin. Use tls.clientAuth=require, or insecureAllowRemote=true to accept that (C5 #ct5-unsafe)" .Values.tls.clientAuth) -}}
{{- end -}}
{{- end -}}

{{/* lockd.pod is the pod template shared by the StatefulSet and the Deployment. */}}
{{- define "lockd.pod" -}}
metadata:
  labels:
    {{- include "lockd.selectorLabels" . | nindent 4 }}
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "lockd.fullname" . }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  # lockd's graceful shutdown is bounded at 30s.
  terminationGracePeriodSeconds: 45
  containers:
    - name: lockd
      image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: [serve]
      env:
        - name: LOCKD_BACKEND
          value: {{ .Values.mode | quote }}
        - name: LOCKD_SESSION_TTL
          value: {{ .Values.session.ttl | quote }}
        - name: LOCKD_CLIENT_SAFETY_MARGIN
          value: {{ .Values.client.safetyMargin | quote }}
        - name: LOCKD_SERVER_LISTEN
          value: "0.0.0.0:{{ .Values.service.grpcPort }}"
        - name: LOCKD_SERVER_METRICS_LISTEN
          value: "0.0.0.0:{{ .Values.service.metricsPort }}"
        - name: LOCKD_SERVER_CLOSE_SESSIONS_ON_SHUTDOWN
          value: {{ .Values.server.closeSessionsOnShutdown | quote }}
        {{- if .Values.http.enabled }}
        - name: LOCKD_SERVER_HTTP_LISTEN
          value: "0.0.0.0:{{ .Values.service.httpPort }}"
        - name: LOCKD_SERVER_HTTP_CONSOLE
          value: {{ .Values.http.console | quote }}
        {{- end }}
        {{- if .Values.tls.secretName }}
        - name: LOCKD_SERVER_TLS_CERT_FILE
          value: /etc/lockd/tls/tls.crt
        - name: LOCKD_SERVER_TLS_KEY_FILE
          value: /etc/lockd/tls/tls.key
        {{- if ne .Values.tls.clientAuth "none" }}
        - name: LOCKD_SERVER_TLS_CLIENT_CA_FILE
          value: /etc/lockd/tls/ca.crt
        {{- end }}
        - name: LOCKD_SERVER_TLS_CLIENT_AUTH
          value: {{ .Values.tls.clientAuth | quote }}
        - name: LOCKD_SERVER_METRICS_TLS_CERT_FILE
          value: /etc/lockd/tls/tls.crt
        - name: LOCKD_SERVER_METRICS_TLS_KEY_FILE
          value: /etc/lockd/tls/tls.key
        {{- else }}
        # The image defaults to TLS files: blank them (an empty value is unset).
        - name: LOCKD_SERVER_TLS_CERT_FILE
          value: ""
        - name: LOCKD_SERVER_TLS_KEY_FILE
          value: ""
        - name: LOCKD_SERVER_TLS_CLIENT_CA_FILE
          value: ""
        - name: LOCKD_SERVER_METRICS_TLS_CERT_FILE
          value: ""
        - name: LOCKD_SERVER_METRICS_TLS_KEY_FILE
          value: ""
        - name: LOCKD_SERVER_INSECURE_ALLOW_REMOTE
          value: "true"
        {{- end }}
        {{- if eq .Values.mode "embedded" }}
        - name: LOCKD_EMBEDDED_DATA_DIR
          value: /var/lib/lockd
        {{- end }}
        {{- if eq .Values.mode "etcd" }}
        - name: LOCKD_ETCD_ENDPOINTS
          value: {{ join "," .Values.etcd.endpoints | quote }}
        - name: LOCKD_ETCD_PREFIX
          value: {{ .Values.etcd.prefix | quote }}
        {{- if .Values.etcd.tlsSecretName }}
        - name: LOCKD_ETCD_TLS_CA_FILE
          value: /etc/lockd/etcd-tls/ca.crt
        {{- if .Values.etcd.tlsClientCert }}
        - name: LOCKD_ETCD_TLS_CERT_FILE
          value: /etc/lockd/etcd-tls/tls.crt
        - name: LOCKD_ETCD_TLS_KEY_FILE
          value: /etc/lockd/etcd-tls/tls.key
        {{- end }}
        {{- end }}
        {{- if .Values.etcd.username }}
        - name: LOCKD_ETCD_USERNAME
          value: {{ .Values.etcd.username | quote }}
        - name: LOCKD_ETCD_PASSWORD_FILE
          value: /etc/lockd/etcd-password/{{ .Values.etcd.passwordSecret.key }}
        {{- end }}
        {{- end }}
        {{- if eq .Values.mode "pg" }}
        - name: LOCKD_PG_DSN_FILE
          value: /etc/lockd/pg/{{ .Values.pg.dsnSecret.key }}
        - name: LOCKD_PG_SCHEMA
          value: {{ .Values.pg.schema | quote }}
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: grpc
          containerPort: {{ .Values.service.grpcPort }}
          protocol: TCP
        - name: metrics
          containerPort: {{ .Values.service.metricsPort }}
          protocol: TCP
        {{- if .Values.http.enabled }}
        - name: http
          containerPort: {{ .Values.service.httpPort }}
          protocol: TCP
        {{- end }}
      # /healthz: 200 while serving, 503 once shutdown began. The kubelet's
      # HTTPS probes do not verify the certificate.
      startupProbe:
        httpGet:
          path: /healthz
          port: metrics
          scheme: {{ if .Values.tls.secretName }}HTTPS{{ else }}HTTP{{ end }}
        periodSeconds: 2
        failureThreshold: 30
      livenessProbe:
        httpGet:
          path: /healthz
          port: metrics
          scheme: {{ if .Values.tls.secretName }}HTTPS{{ else }}HTTP{{ end }}
        periodSeconds: 10
        timeoutSeconds: 5
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /healthz
          port: metrics
          scheme: {{ if .Values.tls.secretName }}HTTPS{{ else }}HTTP{{ end }}
        periodSeconds: 5
        timeoutSeconds: 5
        failureThreshold: 1
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if eq .Values.mode "embedded" }}
        - name: data
          mountPath: /var/lib/lockd
        {{- end }}
        {{- if .Values.tls.secretName }}
        - name: tls
          mountPath: /etc/lockd/tls
          readOnly: true
        {{- end }}
        {{- if and (eq .Values.mode "etcd") .Values.etcd.tlsSecretName }}
        - name: etcd-tls
          mountPath: /etc/lockd/etcd-tls
          readOnly: true
        {{- end }}
        {{- if and (eq .Values.mode "etcd") .Values.etcd.username }}
        - name: etcd-password
          mountPath: /etc/lockd/etcd-password
          readOnly: true
        {{- end }}
        {{- if eq .Values.mode "pg" }}
        - name: pg
          mountPath: /etc/lockd/pg
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- if .Values.tls.secretName }}
    - name: tls
      secret:
        secretName: {{ .Values.tls.secretName }}
        defaultMode: 0440
    {{- end }}
    {{- if and (eq .Values.mode "etcd") .Values.etcd.tlsSecretName }}
    - name: etcd-tls
      secret:
        secretName: {{ .Values.etcd.tlsSecretName }}
        defaultMode: 0440
    {{- end }}
    {{- if and (eq .Values.mode "etcd") .Values.etcd.username }}
    - name: etcd-password
      secret:
        secretName: {{ required "etcd.username needs etcd.passwordSecret.name" .Values.etcd.passwordSecret.name }}
        defaultMode: 0440
    {{- end }}
    {{- if eq .Values.mode "pg" }}
    - name: pg
      secret:
        secretName: {{ .Values.pg.dsnSecret.name }}
        defaultMode: 0440
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
