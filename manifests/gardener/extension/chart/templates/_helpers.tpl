{{- define "dwd-lease.name" -}}
dwd-lease-aggregator
{{- end -}}

{{- /* Cluster-wide objects are named after the release (gardenlet: the ControllerRegistration). */ -}}
{{- define "dwd-lease.clusterName" -}}
gardener-extension-{{ .Release.Name }}
{{- end -}}

{{- define "dwd-lease.selector" -}}
app.kubernetes.io/name: {{ include "dwd-lease.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dwd-lease.labels" -}}
{{ include "dwd-lease.selector" . }}
app.kubernetes.io/part-of: dwd-lease
{{- end -}}

{{- /*
An image as Gardener's image vector resolves it (pkg/utils/imagevector: the overwrite merged over
the vector, then FindImage): "ref", the chart's reference for image "name", with each entry of
that name in .Values.imageVectorOverwrite merged over it in turn. Called with a dict of root,
name and ref.
*/ -}}
{{- define "dwd-lease.image" -}}
{{- $name := .name -}}
{{- $ref := .ref -}}
{{- $repository := "" -}}
{{- $tag := "" -}}
{{- $vector := fromYaml (.root.Values.imageVectorOverwrite | default "") -}}
{{- if hasKey $vector "Error" -}}
{{- fail (printf "imageVectorOverwrite: %s" $vector.Error) -}}
{{- end -}}
{{- range $i, $entry := $vector.images | default list -}}
{{- if eq (toString $entry.name) $name -}}
{{- $where := printf "imageVectorOverwrite: images[%d] (%s)" $i $name -}}
{{- range $key := list "targetVersion" "runtimeVersion" "architectures" -}}
{{- if hasKey $entry $key -}}
{{- fail (printf "%s: %s is not supported: one image serves every seed" $where $key) -}}
{{- end -}}
{{- end -}}
{{- if and (not $entry.ref) (not $entry.repository) -}}
{{- fail (printf "%s: either ref or repository is required" $where) -}}
{{- end -}}
{{- if and $entry.ref (or $entry.repository $entry.tag) -}}
{{- fail (printf "%s: repository and tag may not be given with ref" $where) -}}
{{- end -}}
{{- /* Gardener's mergeImageSources: what the entry gives replaces, a ref drops repository and tag. */ -}}
{{- if $entry.repository -}}{{- $repository = toString $entry.repository -}}{{- end -}}
{{- if $entry.tag -}}{{- $tag = toString $entry.tag -}}{{- end -}}
{{- $ref = toString ($entry.ref | default "") -}}
{{- if $ref -}}{{- $repository = "" -}}{{- $tag = "" -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if $ref -}}
{{- $ref -}}
{{- else if not $tag -}}
{{- $repository -}}
{{- else if hasPrefix "sha256:" $tag -}}
{{- printf "%s@%s" $repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "dwd-lease.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "dwd-lease.name" . }}
{{- end -}}
