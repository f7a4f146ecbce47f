{{/* Name of the chart, or nameOverride. */}}
{{- define "kafka-quota-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the release's objects: <release>-<chart>, or the release name when it already
holds the chart's name, or fullnameOverride. */}}
{{- define "kafka-quota-proxy.fullname" -}}
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

{{- define "kafka-quota-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka-quota-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kafka-quota-proxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kafka-quota-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The ports, as integers (values files give numbers as floats), checked. */}}
{{- define "kafka-quota-proxy.ports" -}}
{{- $bootstrap := int .Values.listeners.bootstrapPort -}}
{{- $metrics := int .Values.metrics.port -}}
{{- $first := int .Values.listeners.brokerPorts.first -}}
{{- $count := int .Values.listeners.brokerPorts.count -}}
{{- $last := sub (add $first $count) 1 | int -}}
{{- if lt $count 1 -}}
{{- fail (printf "listeners.brokerPorts.count must be at least 1 (got %d)" $count) -}}
{{- end -}}
{{- range $name, $port := dict "listeners.bootstrapPort" $bootstrap "metrics.port" $metrics "listeners.brokerPorts.first" $first "the last broker port (first + count - 1)" $last -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "%s must be a port, 1..65535 (got %d)" $name $port) -}}
{{- end -}}
{{- end -}}
{{- if and (ge $bootstrap $first) (le $bootstrap $last) -}}
{{- fail (printf "listeners.bootstrapPort %d lies in the broker ports %d-%d" $bootstrap $first $last) -}}
{{- end -}}
{{- if and (ge $metrics $first) (le $metrics $last) -}}
{{- fail (printf "metrics.port %d lies in the broker ports %d-%d" $metrics $first $last) -}}
{{- end -}}
{{- if eq $metrics $bootstrap -}}
{{- fail (printf "metrics.port and listeners.bootstrapPort are both %d" $metrics) -}}
{{- end -}}
{{- toJson (dict "bootstrap" $bootstrap "metrics" $metrics "first" $first "last" $last) -}}
{{- end -}}

{{/* The broker ports, one per line: first..last. */}}
{{- define "kafka-quota-proxy.brokerPorts" -}}
{{- $p := include "kafka-quota-proxy.ports" . | fromJson -}}
{{- range untilStep (int $p.first) (int (add $p.last 1)) 1 }}
{{ . }}
{{- end -}}
{{- end -}}

{{/* config.yaml: the chart's defaults, under .Values.config, under the keys derived from
the values (which .Values.config may not set). */}}
{{- define "kafka-quota-proxy.config" -}}
{{- $p := include "kafka-quota-proxy.ports" . | fromJson -}}
{{- $user := deepCopy (.Values.config | default dict) -}}
{{- $listeners := get $user "listeners" | default dict -}}
{{- range $key := list "bootstrap" "advertised_host" "broker_ports" "broker_listen_host" -}}
{{- if hasKey $listeners $key -}}
{{- fail (printf "config.listeners.%s is derived from the chart's values (advertisedHost, listeners.bootstrapPort, listeners.brokerPorts): set those instead" $key) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $listeners "extra" -}}
{{- fail "config.listeners.extra is not supported by this chart: each listener kind needs its own ports in the Deployment and the Service" -}}
{{- end -}}
{{- if hasKey (get $user "upstream" | default dict) "bootstrap_servers" -}}
{{- fail "config.upstream.bootstrap_servers: set upstream.bootstrapServers instead" -}}
{{- end -}}
{{- if hasKey (get $user "metrics" | default dict) "listen" -}}
{{- fail "config.metrics.listen: set metrics.port instead" -}}
{{- end -}}
{{- if not .Values.advertisedHost -}}
{{- fail "advertisedHost is required: the name clients resolve to this release's Service" -}}
{{- end -}}
{{- if not .Values.upstream.bootstrapServers -}}
{{- fail "upstream.bootstrapServers is required: the Kafka brokers, as seen from the pod" -}}
{{- end -}}
{{- $defaults := dict
      "logging" (dict "format" "json" "level" "info")
      "network" (dict "shutdown_timeout_seconds" 30) -}}
{{- $derived := dict
      "listeners" (dict
        "bootstrap" (printf "0.0.0.0:%d" (int $p.bootstrap))
        "advertised_host" .Values.advertisedHost
        "broker_ports" (printf "%d-%d" (int $p.first) (int $p.last))
        "broker_listen_host" "0.0.0.0")
      "upstream" (dict "bootstrap_servers" .Values.upstream.bootstrapServers)
      "metrics" (dict "listen" (printf "0.0.0.0:%d" (int $p.metrics))) -}}
{{- $config := mustMergeOverwrite $defaults $user $derived -}}
{{- $shutdown := $config.network.shutdown_timeout_seconds | default 0 | float64 -}}
{{- $needed := addf $shutdown (.Values.preStopSleepSeconds | float64) -}}
{{- if le (.Values.terminationGracePeriodSeconds | float64) $needed -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed preStopSleepSeconds + network.shutdown_timeout_seconds (%v)" .Values.terminationGracePeriodSeconds $needed) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
