{{/* The chart name, truncated to 63 characters (a DNS label). */}}
{{- define "spotray.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name: `<release>-<chart>`, or the release name when it already contains the chart name. */}}
{{- define "spotray.fullname" -}}
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

{{- define "spotray.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "spotray.labels" -}}
helm.sh/chart: {{ include "spotray.chart" . }}
{{ include "spotray.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spotray
{{- end }}

{{/* Selector labels: stable across upgrades, so no chart or app version here. */}}
{{- define "spotray.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spotray.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels and selector labels of one component (controller, minio, ...): pass (list . "component"). */}}
{{- define "spotray.componentLabels" -}}
{{ include "spotray.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}
{{- define "spotray.componentSelectorLabels" -}}
{{ include "spotray.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "spotray.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "spotray.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "spotray.image" -}}
{{- if not .Values.image.repository }}
{{- fail (printf "image.repository is not set, and no spotray image is published yet: build one from the repository's Dockerfile (docker build -t REGISTRY/spotray:%s .), push it where your nodes pull from, and install with --set image.repository=REGISTRY/spotray (docs/deploy.md)" .Chart.AppVersion) }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The controller's image: controller.image when given (the Dockerfile's controller target), else image. */}}
{{- define "spotray.controllerImage" -}}
{{- with .Values.controller.image.repository }}
{{- printf "%s:%s" . (default (default $.Chart.AppVersion $.Values.image.tag) $.Values.controller.image.tag) }}
{{- else }}
{{- include "spotray.image" . }}
{{- end }}
{{- end }}

{{- define "spotray.rayImage" -}}
{{- default (include "spotray.image" .) .Values.ray.image }}
{{- end }}

{{- define "spotray.peeringName" -}}
{{- default (include "spotray.fullname" .) .Values.controller.peering.name }}
{{- end }}

{{- define "spotray.minioName" -}}
{{- printf "%s-minio" (include "spotray.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The S3 endpoint pods and the controller use: the in-cluster MinIO's full DNS name (runs live in other namespaces), or s3.endpoint. */}}
{{- define "spotray.s3Endpoint" -}}
{{- if and .Values.minio.enabled (not .Values.s3.endpoint) }}
{{- printf "http://%s.%s.svc.cluster.local:9000" (include "spotray.minioName" .) .Release.Namespace }}
{{- else }}
{{- .Values.s3.endpoint }}
{{- end }}
{{- end }}

{{/* The shared volume's PVC name, or "" when shared storage is off. */}}
{{- define "spotray.sharedClaim" -}}
{{- if .Values.sharedStorage.enabled }}
{{- default (printf "%s-shared" (include "spotray.fullname" .)) .Values.sharedStorage.existingClaim }}
{{- end }}
{{- end }}

{{- define "spotray.rayClusterName" -}}
{{- default (printf "%s-ray" (include "spotray.fullname" .)) .Values.rayCluster.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Security context of every container the chart runs as the image's user (uid/gid 1000). */}}
{{- define "spotray.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container fields shared by the long-lived RayCluster's head and workers: image, S3, shared volume. */}}
{{/*
The Ray container's readiness probe, called with (list . <timeoutSeconds>): Ray's health endpoint
from the container's start, every ray.readinessPeriodSeconds, out of service after 50 s of failures
as with KubeRay's own probe (controller/rayjob.py readiness_probe says why). Empty: KubeRay's probe.
*/}}
{{- define "spotray.rayReadinessProbe" -}}
{{- $root := index . 0 -}}
{{- $period := int $root.Values.ray.readinessPeriodSeconds -}}
{{- if and (gt $period 0) (semverCompare ">=2.53.0-0" $root.Values.ray.version) }}
readinessProbe:
  httpGet:
    path: /api/healthz
    port: 52365
  periodSeconds: {{ $period }}
  timeoutSeconds: {{ index . 1 }}
  successThreshold: 1
  failureThreshold: {{ max 1 (div (add 50 $period -1) $period) }}
{{- end }}
{{- end }}

{{- define "spotray.rayContainerCommon" -}}
image: {{ include "spotray.rayImage" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
# Pod Security "restricted", as the controller's RayJob pods (controller/rayjob.py); KubeRay copies
# it into the init container it injects. The root filesystem stays writable: Ray writes /tmp/ray.
securityContext:
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]
{{- with (include "spotray.s3Endpoint" .) }}
env:
  - name: AWS_ENDPOINT_URL
    value: {{ . | quote }}
  - name: S3_ENDPOINT_URL
    value: {{ . | quote }}
{{- end }}
{{- with .Values.s3.existingSecret }}
envFrom:
  - secretRef:
      name: {{ . }}
{{- end }}
{{- if .Values.sharedStorage.enabled }}
volumeMounts:
  - name: shared
    mountPath: {{ .Values.sharedStorage.mountPath }}
{{- end }}
{{- end }}

{{/*
Pod fields shared by the long-lived RayCluster's head and workers, called with (list . "head") or
(list . "worker"). No pod mounts a Kubernetes API token: the jobs need none (the controller's
RayJob pods neither, controller/rayjob.py). With rayCluster.autoscaling, KubeRay's autoscaler in
the head pod scales the RayCluster through the API: the head then holds the token its
ServiceAccount would have mounted as a volume, which only the autoscaler mounts
(spotray.autoscalerTokenMount in raycluster.yaml), never the Ray container that runs jobs.
*/}}
{{- define "spotray.rayPodCommon" -}}
{{- $root := index . 0 -}}
{{- $autoscalerToken := and (eq (index . 1) "head") $root.Values.rayCluster.autoscaling -}}
automountServiceAccountToken: false
securityContext:
  fsGroup: {{ $root.Values.ray.fsGroup }}
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 1000
  seccompProfile:
    type: RuntimeDefault
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if or $root.Values.sharedStorage.enabled $autoscalerToken }}
volumes:
  {{- if $root.Values.sharedStorage.enabled }}
  - name: shared
    persistentVolumeClaim:
      claimName: {{ include "spotray.sharedClaim" $root }}
  {{- end }}
  {{- if $autoscalerToken }}
  # What the kubelet's automount would project: a token that expires and is renewed, the API
  # server's CA, the namespace.
  - name: {{ include "spotray.autoscalerTokenVolume" $root }}
    projected:
      sources:
        - serviceAccountToken:
            path: token
            expirationSeconds: 3607
        - configMap:
            name: kube-root-ca.crt
            items:
              - key: ca.crt
                path: ca.crt
        - downwardAPI:
            items:
              - path: namespace
                fieldRef:
                  fieldPath: metadata.namespace
  {{- end }}
{{- end }}
{{- end }}

{{/* The head pod's API token volume for KubeRay's autoscaler (spotray.rayPodCommon). */}}
{{- define "spotray.autoscalerTokenVolume" -}}
autoscaler-api-token
{{- end }}

{{/* Where the autoscaler (Ray's KubeRay node provider) reads the token and CA: the automount path. */}}
{{- define "spotray.autoscalerTokenMount" -}}
- name: {{ include "spotray.autoscalerTokenVolume" . }}
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- end }}

{{/*
"true" when the controller may get Nodes (rbac.readNodes; unset: a cluster-wide install may, a
namespaced one, which makes nothing cluster-wide, may not).
*/}}
{{- define "spotray.readNodes" -}}
{{- if kindIs "invalid" .Values.rbac.readNodes -}}
{{- empty .Values.controller.watchNamespaces -}}
{{- else -}}
{{- .Values.rbac.readNodes -}}
{{- end -}}
{{- end -}}

{{/* The egress rules each run's pods get besides their own pods and DNS, as JSON: networkPolicy.runEgress,
the chart's MinIO's S3 port when it runs MinIO, and its RayCluster's dashboard when it runs one (the
submitters of runs that use it post their jobs there). */}}
{{- define "spotray.runEgress" -}}
{{- $rules := .Values.networkPolicy.runEgress | default list }}
{{- $namespace := dict "kubernetes.io/metadata.name" .Release.Namespace }}
{{- if .Values.minio.enabled }}
{{- $minioPods := include "spotray.componentSelectorLabels" (list . "minio") | fromYaml }}
{{- $peer := dict "namespaceSelector" (dict "matchLabels" $namespace) "podSelector" (dict "matchLabels" $minioPods) }}
{{- $rules = append $rules (dict "to" (list $peer) "ports" (list (dict "port" 9000 "protocol" "TCP"))) }}
{{- end }}
{{- if .Values.rayCluster.enabled }}
{{- $rayPods := merge (include "spotray.selectorLabels" . | fromYaml) (dict "ray.io/is-ray-node" "yes") }}
{{- $peer := dict "namespaceSelector" (dict "matchLabels" $namespace) "podSelector" (dict "matchLabels" $rayPods) }}
{{- $rules = append $rules (dict "to" (list $peer) "ports" (list (dict "port" 8265 "protocol" "TCP"))) }}
{{- end }}
{{- $rules | toJson }}
{{- end }}

{{- /* The capacity presets (capacity.preset): the labels and taints each provider gives its on-demand
  and spot nodes. docs/deploy.md says per cloud what else must be installed for a spot notice to reach
  the pods. GKE does not taint Spot VMs itself: taint spot node pools cloud.google.com/gke-spot=true:
  NoSchedule (GKE's advice) so that heads stay off them; AKS taints spot pools itself. */}}
{{- define "spotray.capacityPresets" -}}
spotray:
  onDemand:
    nodeSelector: {spotray.dev/capacity: on-demand}
  spot:
    nodeSelector: {spotray.dev/capacity: spot}
    tolerations: [{key: spotray.dev/spot, operator: Exists, effect: NoSchedule}]
karpenter:
  onDemand:
    nodeSelector: {karpenter.sh/capacity-type: on-demand}
  spot:
    nodeSelector: {karpenter.sh/capacity-type: spot}
gke:
  onDemand: {}
  spot:
    nodeSelector: {cloud.google.com/gke-spot: "true"}
    tolerations: [{key: cloud.google.com/gke-spot, operator: Equal, value: "true", effect: NoSchedule}]
eks:
  onDemand:
    nodeSelector: {eks.amazonaws.com/capacityType: ON_DEMAND}
  spot:
    nodeSelector: {eks.amazonaws.com/capacityType: SPOT}
aks:
  onDemand: {}
  spot:
    nodeSelector: {kubernetes.azure.com/scalesetpriority: spot}
    tolerations: [{key: kubernetes.azure.com/scalesetpriority, operator: Equal, value: spot, effect: NoSchedule}]
custom: {}
{{- end -}}

{{- /* Where a component's pods go: the preset's placement for a pool ("onDemand" or "spot") with the
  component's own nodeSelector (its keys win) and tolerations (added) over it, as JSON:
  {"nodeSelector": {...}, "tolerations": [...]}. Called with (list . POOL .Values.COMPONENT). */}}
{{- define "spotray.placement" -}}
{{- $root := index . 0 -}}
{{- $presets := include "spotray.capacityPresets" $root | fromYaml -}}
{{- $preset := index $presets $root.Values.capacity.preset | default dict -}}
{{- $pool := index $preset (index . 1) | default dict -}}
{{- $own := index . 2 -}}
{{- $selector := merge (deepCopy ($own.nodeSelector | default dict)) (deepCopy ($pool.nodeSelector | default dict)) -}}
{{- $tolerations := concat ($pool.tolerations | default list) ($own.tolerations | default list) -}}
{{- dict "nodeSelector" $selector "tolerations" ($tolerations | default list) | toJson -}}
{{- end -}}
