{{/* The Linkpack image, for the extender and the node agent. */}}
{{- define "linkpack.image" -}}
image: {{ .Values.image.repository }}:{{ .Values.image.tag }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end }}

{{/* Resource names and share units, the same for the extender and the node agents. */}}
{{- define "linkpack.resourceEnv" -}}
- name: LINKPACK_RESOURCE_GPU
  value: {{ .Values.resourceNames.gpu }}
- name: LINKPACK_RESOURCE_SHARED
  value: {{ .Values.resourceNames.shared }}
- name: LINKPACK_RESOURCE_MEMORY
  value: {{ .Values.resourceNames.memory }}
- name: LINKPACK_RESOURCE_MIG_PREFIX
  value: {{ .Values.resourceNames.migPrefix }}
- name: LINKPACK_UNITS_PER_GPU
  value: {{ .Values.unitsPerGpu | quote }}
{{- end }}

{{/* The KubeSchedulerConfiguration; `host` adds the kubeconfig of a host-run scheduler. */}}
{{- define "linkpack.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
{{- if .host }}
clientConnection:
  kubeconfig: {{ .Values.hostSchedulerConfig.kubeconfig }}
{{- end }}
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: linkpack-scheduler   # own Lease: never compete with the default scheduler's
profiles:
  - schedulerName: {{ .Values.schedulerName }}
    # 100: the extender sees every feasible node, which cluster-wide packing and fragmentation
    # scoring need; the default (adaptive, ~46% at 500 nodes) would hide most of them.
    # The cost in scheduler time is measured and explained in docs/operator-guide.md.
    percentageOfNodesToScore: 100
extenders:
  - urlPrefix: https://linkpack-extender.{{ .Release.Namespace }}.svc:8888
    filterVerb: filter
    prioritizeVerb: prioritize
    # Extender scores (0..10) count score*weight*10 against at most ~1200 from in-tree plugins.
    weight: 10
    bindVerb: bind
    nodeCacheCapable: true
    # Mutual TLS: the extender accepts only a client certificate issued by the Linkpack CA for
    # the scheduler (Secret {{ .Values.scheduler.clientTlsSecret }}, mounted by scheduler-deployment.yaml), and
    # the scheduler checks the extender's serving certificate against the same CA.
    enableHTTPS: true
    tlsConfig:
      certFile: /etc/linkpack/client/tls.crt
      keyFile: /etc/linkpack/client/tls.key
      caFile: /etc/linkpack/client/ca.crt
      serverName: linkpack-extender.{{ .Release.Namespace }}.svc
    httpTimeout: 5s
    # Not ignorable: a pod asking for GPUs must never be placed without the extender.
    ignorable: false
    # The scheduler calls the extender only for pods that request one of these names (exact
    # names: add the MIG profiles of your GPUs).
    managedResources:
      # Advertised by the Linkpack device plugin (whole GPUs, share units, MIG instances): the
      # in-tree fit check counts them per node as well, a safe upper bound.
      - name: {{ .Values.resourceNames.gpu }}
        ignoredByScheduler: false
      - name: {{ .Values.resourceNames.shared }}
        ignoredByScheduler: false
      {{- range $gpus, $profiles := .Values.scheduler.migProfiles }}
      # MIG: {{ $gpus }}
      {{- range $profiles }}
      - name: {{ $.Values.resourceNames.migPrefix }}{{ . }}
        ignoredByScheduler: false
      {{- end }}
      {{- end }}
      # GPU memory (MiB) is accounted by the extender only; no node advertises it.
      - name: {{ .Values.resourceNames.memory }}
        ignoredByScheduler: true
{{- end }}

{{/* The pods' imagePullSecrets, from the chart value imagePullSecrets (Secret names; an entry
{name: ...} is taken as well). Nothing when the list is empty. */}}
{{- define "linkpack.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "map" . }}{{ .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Where a pod may run: nodeSelector, affinity and tolerations of one workload's values
(extender, scheduler, nodeAgent), each left out when empty. */}}
{{- define "linkpack.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The kube-scheduler image: scheduler.image.repository with scheduler.image.tag, or with the
cluster's own Kubernetes version when the tag is empty (within the version-skew policy of the
API server whatever its version). A string scheduler.image is the whole image. */}}
{{- define "linkpack.schedulerImage" -}}
{{- $image := .Values.scheduler.image -}}
{{- if kindIs "string" $image -}}
{{ $image }}
{{- else -}}
{{ $image.repository }}:{{ $image.tag | default (include "linkpack.kubeVersionTag" .Capabilities.KubeVersion) }}
{{- end -}}
{{- end }}

{{/* vMAJOR.MINOR.PATCH of a KubeVersion (fields Version, Major, Minor): Version cut at its first
"-" or "+" (a provider's v1.33.2-eks-4f2a1c gives v1.33.2, v1.34.1+k3s1 gives v1.34.1). Should
that be no plain version, vMAJOR.MINOR.0 from the digits of Major and Minor (some providers
report the minor as "33+"). */}}
{{- define "linkpack.kubeVersionTag" -}}
{{- $cut := regexReplaceAll "[-+].*$" (toString .Version) "" | trimPrefix "v" -}}
{{- if regexMatch "^[0-9]+\\.[0-9]+\\.[0-9]+$" $cut -}}
v{{ $cut }}
{{- else -}}
{{- $major := regexReplaceAll "[^0-9]" (toString .Major) "" -}}
{{- $minor := regexReplaceAll "[^0-9]" (toString .Minor) "" -}}
{{- if not (and $major $minor) -}}
{{- fail (printf "cannot tell the cluster's Kubernetes version from %q: set scheduler.image.tag" (toString .Version)) -}}
{{- end -}}
v{{ $major }}.{{ $minor }}.0
{{- end -}}
{{- end }}
