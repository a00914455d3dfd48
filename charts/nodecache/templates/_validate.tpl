{{- /*
Value checks, in sentences. values.schema.json checks types and closed sets only: Helm prints a
schema's pattern as a raw regular expression and never its description. The values that reach a
nodecache flag are checked here with the rules of the binary and its words (the flag it feeds,
the value, what is wrong, what is accepted), so that the chart refuses nothing nodecache accepts
and what it refuses fails `helm install` at once instead of crash-looping the pods. The rest
(image references, Secret names, quantities, durations for the Prometheus Operator) follow what
Kubernetes and the operator accept. deploy/test TestChartValueGrammar compares each with the
binary or the library that decides.
*/ -}}

{{- /* The checked values' problems, one line each; fails when there is any. */ -}}
{{- define "nodecache.validate" -}}
{{- $v := .Values -}}
{{- $errs := list -}}
{{- /* --upstream: repeated or comma-separated NAME[=URL] (pkg/name ParseUpstreams). */ -}}
{{- $names := list -}}
{{- $seen := dict -}}
{{- $parts := list -}}
{{- range $v.upstreams }}{{ range splitList "," . }}{{ if trim . }}{{ $parts = append $parts (trim .) }}{{ end }}{{ end }}{{ end -}}
{{- if and $v.upstreams (not $parts) -}}
{{- $errs = append $errs "upstreams: --upstream is empty (an empty --upstream or NODECACHE_UPSTREAM= gives none): want NAME[=URL], repeatable or comma-separated, e.g. docker.io or ghcr.io=https://ghcr.io; leave it unset for the default set" -}}
{{- end -}}
{{- range $parts -}}
{{- $u := include "nodecache.parseUpstream" . | fromJson -}}
{{- if $u.err -}}
{{- $errs = append $errs (printf "upstreams: %s" $u.err) -}}
{{- else -}}
{{- $c := include "nodecache.canonical" $u.name -}}
{{- if hasKey $seen $c -}}
{{- if eq (get $seen $c) $u.name -}}
{{- $errs = append $errs (printf "upstreams: --upstream: %q is configured twice" $u.name) -}}
{{- else -}}
{{- $errs = append $errs (printf "upstreams: --upstream: %q is configured twice (as %q: the same registry)" $u.name (get $seen $c)) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $seen $c $u.name -}}
{{- $names = append $names $u.name -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $parts -}}
{{- $names = list "docker.io" "ghcr.io" "registry.k8s.io" "quay.io" "gcr.io" -}}
{{- end -}}
{{- /* --upstream-auth NAME=FILE: NAME a configured upstream (pkg/mirror upstreamFileSpec). */ -}}
{{- range $v.upstreamAuth.upstreams -}}
{{- $spec := printf "%s=/etc/nodecache/upstream-auth/.dockerconfigjson" . -}}
{{- $n := . -}}
{{- if contains "=" . }}{{ $n = "" }}{{ end -}}
{{- if not $n -}}
{{- $errs = append $errs (printf "upstreamAuth.upstreams: %q is no upstream NAME (the URL is upstreams' part: NAME=URL there, NAME here), e.g. docker.io" .) -}}
{{- else -}}
{{- $r := include "nodecache.parseRegistry" $n | fromJson -}}
{{- if $r.err -}}
{{- $errs = append $errs (printf "upstreamAuth.upstreams: --upstream-auth %q: %s" $spec $r.err) -}}
{{- else -}}
{{- $found := false -}}
{{- range $names }}{{ if or (eq . $r.name) (and (eq (include "nodecache.canonical" .) "docker.io") (eq (include "nodecache.canonical" $r.name) "docker.io")) }}{{ $found = true }}{{ end }}{{ end -}}
{{- if not $found -}}
{{- $errs = append $errs (printf "upstreamAuth.upstreams: --upstream-auth %q: %s is not among the --upstream names %s" $spec $r.name (join ", " $names)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* --pull-allow: repeated or comma-separated CIDRs (netip.ParsePrefix). */ -}}
{{- range $v.pullAllow }}{{ range splitList "," . }}{{ if trim . -}}
{{- if not (include "nodecache.cidr" (trim .)) -}}
{{- $errs = append $errs (printf "pullAllow: --pull-allow %q: want a CIDR such as 10.0.0.0/8 or fd00::/8" (trim .)) -}}
{{- end -}}
{{- end }}{{ end }}{{ end -}}
{{- /* --allow: repeated or comma-separated CIDRs, as --pull-allow. */ -}}
{{- range $v.allow }}{{ range splitList "," . }}{{ if trim . -}}
{{- if not (include "nodecache.cidr" (trim .)) -}}
{{- $errs = append $errs (printf "allow: --allow %q: want a CIDR such as 10.0.0.0/8 or fd00::/8" (trim .)) -}}
{{- end -}}
{{- end }}{{ end }}{{ end -}}
{{- /* --max-size (pkg/mirror ParseMaxSize). */ -}}
{{- with include "nodecache.maxSize" $v.maxSize }}{{ $errs = append $errs (printf "maxSize: %s" .) }}{{ end -}}
{{- if and (eq $v.mode "agent") $v.maxSize -}}
{{- $errs = append $errs (printf "maxSize %q is the shared cache's cap (mode=shared); the agent's is agent.maxSize (default 20%%, a share of the node's disk): --set agent.maxSize=%s, and leave maxSize empty" $v.maxSize $v.maxSize) -}}
{{- end -}}
{{- with include "nodecache.maxSize" $v.agent.maxSize }}{{ $errs = append $errs (printf "agent.maxSize: %s" .) }}{{ end -}}
{{- /* --chain (pkg/name ParseURL). */ -}}
{{- if $v.chain -}}
{{- $u := include "nodecache.parseURL" (dict "field" "--chain" "s" $v.chain) | fromJson -}}
{{- if $u.err }}{{ $errs = append $errs (printf "chain: %s" $u.err) }}{{ end -}}
{{- end -}}
{{- /* Durations of nodecache's flags (Go's time.ParseDuration), positive. */ -}}
{{- $durationsOK := true -}}
{{- range $d := list (list "agent.interval" "--interval" $v.agent.interval) (list "agent.dialTimeout" "--dial-timeout" $v.agent.dialTimeout) (list "peers.refresh" "--peers-refresh" $v.peers.refresh) (list "peers.dialTimeout" "--peer-dial-timeout" $v.peers.dialTimeout) -}}
{{- if not (include "nodecache.duration" (index $d 2 | toString)) -}}
{{- $durationsOK = false -}}
{{- $errs = append $errs (printf "%s: %s %q: want a duration such as 500ms, 30s, 5m or 1h30m" (index $d 0) (index $d 1) (index $d 2 | toString)) -}}
{{- end -}}
{{- end -}}
{{- if $durationsOK -}}
{{- if eq (include "nodecache.duration" $v.agent.interval) "nonpositive" -}}
{{- $errs = append $errs (printf "agent.interval: --interval %s: want a positive duration such as 30s or 1m (default 1m0s)" $v.agent.interval) -}}
{{- end -}}
{{- if eq (include "nodecache.duration" $v.agent.dialTimeout) "nonpositive" -}}
{{- $errs = append $errs (printf "agent.dialTimeout: --dial-timeout %s: want a positive duration such as 2s, 500ms or 1m (default 2s): how long containerd waits for a connection to a [host] before it tries the next" $v.agent.dialTimeout) -}}
{{- end -}}
{{- if or (eq (include "nodecache.duration" $v.peers.refresh) "nonpositive") (eq (include "nodecache.duration" $v.peers.dialTimeout) "nonpositive") -}}
{{- $errs = append $errs (printf "peers.refresh, peers.dialTimeout: --peers-refresh %s and --peer-dial-timeout %s: want positive durations such as 10s and 1s" $v.peers.refresh $v.peers.dialTimeout) -}}
{{- end -}}
{{- end -}}
{{- /* Scrape interval of the PodMonitor / ServiceMonitor (the Prometheus Operator's Duration). */ -}}
{{- if not (regexMatch "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$" (toString $v.metrics.interval)) -}}
{{- $errs = append $errs (printf "metrics.interval %q: want a Prometheus duration such as 30s, 1m or 1h30m (units ms, s, m, h, d, w, y, largest first)" (toString $v.metrics.interval)) -}}
{{- end -}}
{{- /* Image references: warm's (pkg/warm ParseReference), the pause image and the nodecache image (the kubelet's). */ -}}
{{- range $i, $ref := $v.warm.images -}}
{{- with include "nodecache.reference" (dict "s" $ref "warm" true) }}{{ $errs = append $errs (printf "warm.images[%d]: image reference %q refused: %s" $i $ref .) }}{{ end -}}
{{- end -}}
{{- with include "nodecache.reference" (dict "s" $v.cleanup.pauseImage) }}{{ $errs = append $errs (printf "cleanup.pauseImage: image reference %q refused: %s" $v.cleanup.pauseImage .) }}{{ end -}}
{{- $image := include "nodecache.image" $ -}}
{{- with include "nodecache.reference" (dict "s" $image) }}{{ $errs = append $errs (printf "image.repository, image.tag: image reference %q refused: %s" $image .) }}{{ end -}}
{{- /* warm --platform (pkg/warm ParsePlatform). */ -}}
{{- if not (regexMatch "^[A-Za-z0-9_-]+/[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)?$" $v.warm.platform) -}}
{{- $errs = append $errs (printf "warm.platform: --platform %q refused: want os/arch[/variant], e.g. linux/amd64 or linux/arm64" $v.warm.platform) -}}
{{- end -}}
{{- /* Kubernetes object names (RFC 1123 subdomains) and the cluster's DNS domain. */ -}}
{{- range $n := list (list "upstreamAuth.secretName" $v.upstreamAuth.secretName) (list "peers.keySecret" $v.peers.keySecret) (list "shared.storage.s3.secretName" $v.shared.storage.s3.secretName) -}}
{{- $s := index $n 1 -}}
{{- if and $s (or (gt (len $s) 253) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $s))) -}}
{{- $errs = append $errs (printf "%s %q: want the name of a Secret in the release namespace: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters" (index $n 0) $s) -}}
{{- end -}}
{{- end -}}
{{- if or (gt (len $v.peers.clusterDomain) 253) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $v.peers.clusterDomain)) -}}
{{- $errs = append $errs (printf "peers.clusterDomain %q: want the cluster's DNS domain, such as cluster.local (lower-case DNS labels)" $v.peers.clusterDomain) -}}
{{- end -}}
{{- /* The node's cache directory (a hostPath). */ -}}
{{- if or (not (hasPrefix "/" $v.agent.cachePath)) (has ".." (splitList "/" $v.agent.cachePath)) -}}
{{- $errs = append $errs (printf "agent.cachePath %q: want an absolute host path without '..', such as /var/lib/nodecache" $v.agent.cachePath) -}}
{{- end -}}
{{- /* The PVC's size (a Kubernetes quantity). */ -}}
{{- $size := toString $v.shared.persistence.size -}}
{{- if not (regexMatch "^[+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$" $size) -}}
{{- $errs = append $errs (printf "shared.persistence.size %q: want a Kubernetes quantity such as 50Gi or 200G" $size) -}}
{{- end -}}
{{- /* --s3-endpoint (pkg/mirror S3Storage.validate). */ -}}
{{- with $v.shared.storage.s3.endpoint -}}
{{- if not (regexMatch "^(?i:https?)://[^/?#\\s]+(/)?([?#].*)?$" .) -}}
{{- $errs = append $errs (printf "shared.storage.s3.endpoint: --s3-endpoint %q: want http(s)://HOST[:PORT], e.g. https://minio.storage:9000" .) -}}
{{- end -}}
{{- end -}}
{{- /* extraArgs: flags, each "--name=value" (or "--name" then its value as the next item). */ -}}
{{- $value := false -}}
{{- range $i, $a := $v.extraArgs -}}
{{- if hasPrefix "-" $a -}}
{{- $value = and (not (contains "=" $a)) (regexMatch "^--?[a-z][a-z0-9-]*$" $a) -}}
{{- else if $value -}}
{{- $value = false -}}
{{- else -}}
{{- $errs = append $errs (printf "extraArgs[%d] %q: not a flag: %s takes no arguments, got %q (give each flag as one item, --name=value)" $i $a (ternary "serve" "agent" (eq $v.mode "shared")) $a) -}}
{{- end -}}
{{- end -}}
{{- if $errs -}}
{{- fail (printf "values refused:\n%s" (join "\n" $errs)) -}}
{{- end -}}
{{- end -}}

{{- /* pkg/name Canonical: Docker Hub's aliases are docker.io. */ -}}
{{- define "nodecache.canonical" -}}
{{- $n := lower . -}}
{{- if has $n (list "index.docker.io" "registry-1.docker.io") }}docker.io{{ else }}{{ $n }}{{ end -}}
{{- end -}}

{{- /* pkg/name ParseRegistry: {"name": normalised} or {"err": the binary's reason}. */ -}}
{{- define "nodecache.parseRegistry" -}}
{{- $s := . -}}
{{- $n := lower (trim $s) -}}
{{- $r := dict "name" $n -}}
{{- if not $n -}}
{{- $r = dict "err" "empty registry name: want a host such as ghcr.io or registry.local:5000" -}}
{{- else if not (regexMatch "^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*|\\[(?:[a-fA-F0-9:]+)\\])(?::[0-9]+)?$" $n) -}}
{{- $r = dict "err" (printf "registry name %q: want a host such as ghcr.io, registry.local:5000 or [::1]:5000 (no scheme, path or credentials)" $s) -}}
{{- else if gt (len $n) 253 -}}
{{- $r = dict "err" (printf "registry name %q is %d characters long: want at most 253 (the longest DNS name, RFC 1035; as a path alias it must also leave room for a repository in the 255 characters of a repository path)" $s (len $n)) -}}
{{- else -}}
{{- $host := $n -}}{{- $port := "" -}}
{{- $m := regexFindAll ":[0-9]+$" $n 1 -}}
{{- if and $m (not (and (hasPrefix "[" $n) (hasSuffix "]" $n))) -}}
{{- $port = trimPrefix ":" (first $m) -}}{{- $host = trimSuffix (first $m) $n -}}
{{- end -}}
{{- $ip := dict -}}
{{- if hasPrefix "[" $host }}{{ $ip = include "nodecache.ipv6" (trimAll "[]" $host) | fromJson }}{{ end -}}
{{- if and (hasPrefix "[" $host) (or (not $ip.ok) $ip.v4in6) -}}
{{- $r = dict "err" (printf "registry name %q: %s is not an IPv6 address" $s $host) -}}
{{- else if $port -}}
{{- with include "nodecache.port" $port }}{{ $r = dict "err" (printf "registry name %q: %s" $s .) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toJson $r -}}
{{- end -}}

{{- /* A Go duration (time.ParseDuration): "positive", "nonpositive", or "" when it is none. */ -}}
{{- define "nodecache.duration" -}}
{{- if regexMatch "^[-+]?(0|(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$" . -}}
{{- ternary "nonpositive" "positive" (or (hasPrefix "-" .) (not (regexMatch "[1-9]" .))) -}}
{{- end -}}
{{- end -}}

{{- /* pkg/name checkPort: "" or the binary's reason. */ -}}
{{- define "nodecache.port" -}}
{{- if or (not (regexMatch "^[0-9]{1,10}$" .)) (gt (. | int64) 4294967295) -}}
{{- printf "port %q is not a number: want 1 to 65535" . -}}
{{- else if or (lt (. | int64) 1) (gt (. | int64) 65535) -}}
{{- printf "port %s is out of range: want 1 to 65535" . -}}
{{- end -}}
{{- end -}}

{{- /* An IPv6 address as netip.ParseAddr reads it (no zone): {"ok": bool, "v4in6": bool}. */ -}}
{{- define "nodecache.ipv6" -}}
{{- $a := lower . -}}
{{- $groups := list -}}
{{- $ok := true -}}
{{- $v4 := regexFind "[0-9.]+$" $a -}}
{{- if contains "." $a -}}
{{- /* an embedded IPv4 address counts as the last two groups */ -}}
{{- $ok = and (include "nodecache.ipv4" $v4) (hasSuffix (printf ":%s" $v4) $a) -}}
{{- $a = printf "%s0:0" (trimSuffix $v4 $a) -}}
{{- end -}}
{{- $halves := splitList "::" $a -}}
{{- if gt (len $halves) 2 }}{{ $ok = false }}{{ end -}}
{{- $all := list -}}
{{- range $halves }}{{ if . }}{{ $all = concat $all (splitList ":" .) }}{{ end }}{{ end -}}
{{- range $all }}{{ if not (regexMatch "^[0-9a-f]{1,4}$" .) }}{{ $ok = false }}{{ end }}{{ end -}}
{{- if eq (len $halves) 1 -}}
{{- if ne (len $all) 8 }}{{ $ok = false }}{{ end -}}
{{- else if gt (len $all) 7 }}{{ $ok = false }}{{ end -}}
{{- $full := $all -}}
{{- if and $ok (eq (len $halves) 2) -}}
{{- $left := list -}}{{- if index $halves 0 }}{{ $left = splitList ":" (index $halves 0) }}{{ end -}}
{{- $right := list -}}{{- if index $halves 1 }}{{ $right = splitList ":" (index $halves 1) }}{{ end -}}
{{- $full = $left -}}
{{- range until (sub 8 (add (len $left) (len $right)) | int) }}{{ $full = append $full "0" }}{{ end -}}
{{- $full = concat $full $right -}}
{{- end -}}
{{- $v4in6 := false -}}
{{- if and $ok (eq (len $full) 8) -}}
{{- $v4in6 = and (regexMatch "^(0+:){5}0*ffff$" (join ":" (slice $full 0 6))) true -}}
{{- end -}}
{{- toJson (dict "ok" $ok "v4in6" $v4in6) -}}
{{- end -}}

{{- /* An IPv4 address as netip.ParseAddr reads it: four decimal octets, no leading zeros. */ -}}
{{- define "nodecache.ipv4" -}}
{{- $ok := regexMatch "^(0|[1-9][0-9]{0,2})(\\.(0|[1-9][0-9]{0,2})){3}$" . -}}
{{- if $ok }}{{ range splitList "." . }}{{ if gt (atoi .) 255 }}{{ $ok = false }}{{ end }}{{ end }}{{ end -}}
{{- if $ok }}true{{ end -}}
{{- end -}}

{{- /* A CIDR as netip.ParsePrefix reads it: "true" or "". */ -}}
{{- define "nodecache.cidr" -}}
{{- $addr := regexReplaceAll "/[^/]*$" . "" -}}
{{- $bits := trimPrefix "/" (regexFind "/[^/]*$" .) -}}
{{- if and (contains "/" .) (regexMatch "^(0|[1-9][0-9]{0,2})$" $bits) -}}
{{- if and (include "nodecache.ipv4" $addr) (le (atoi $bits) 32) -}}true
{{- else if and (contains ":" $addr) (le (atoi $bits) 128) ((include "nodecache.ipv6" $addr | fromJson).ok) -}}true
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* pkg/mirror ParseMaxSize, without the disk: "" or the binary's message. */ -}}
{{- define "nodecache.maxSize" -}}
{{- $s := toString . -}}
{{- $accepted := "want a size in binary units such as 500MiB, 30GiB or 1TiB, or a share of the filesystem holding --root such as 30%" -}}
{{- $number := "^[0-9]+(\\.[0-9]+)?$" -}}
{{- if or (eq $s "") (eq $s "0") -}}
{{- else if hasSuffix "%" $s -}}
{{- $pct := trimSuffix "%" $s -}}
{{- if not (regexMatch $number $pct) -}}
{{- printf "--max-size %q: not a share: %s" $s $accepted -}}
{{- else if or (le (float64 $pct) 0.0) (gt (float64 $pct) 100.0) -}}
{{- printf "--max-size %q: a share must be more than 0%% and at most 100%%: %s" $s $accepted -}}
{{- end -}}
{{- else -}}
{{- $unit := regexFind "[^0-9.]*$" $s -}}
{{- $num := trimSuffix $unit $s -}}
{{- $decimal := dict "TB" "TiB" "GB" "GiB" "MB" "MiB" "KB" "KiB" "kB" "KiB" "T" "TiB" "G" "GiB" "M" "MiB" "K" "KiB" "k" "KiB" "Ti" "TiB" "Gi" "GiB" "Mi" "MiB" "Ki" "KiB" -}}
{{- $binary := dict "" 1.0 "B" 1.0 "KiB" 1024.0 "MiB" 1048576.0 "GiB" 1073741824.0 "TiB" 1099511627776.0 -}}
{{- if hasKey $decimal $unit -}}
{{- printf "--max-size %q: decimal and short units are not accepted; did you mean %s%s? (%s)" $s $num (get $decimal $unit) $accepted -}}
{{- else if not (hasKey $binary $unit) -}}
{{- printf "--max-size %q: unknown unit %q: %s" $s $unit $accepted -}}
{{- else if or (not (regexMatch $number $num)) (ge (mulf (float64 $num) (get $binary $unit)) 9223372036854775807.0) -}}
{{- printf "--max-size %q: not a size: %s" $s $accepted -}}
{{- else if and (lt (mulf (float64 $num) (get $binary $unit)) 1.0) (gt (float64 $num) 0.0) -}}
{{- printf "--max-size %q: less than one byte (a cap of 0 would mean no cap; 0 says so): %s" $s $accepted -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* An image reference (s) as distribution/reference ParseNormalizedNamed reads it (the
kubelet's), with warm's character check first when warm is set (pkg/warm ParseReference): ""
or why not. */ -}}
{{- define "nodecache.reference" -}}
{{- $s := toString .s -}}
{{- $bad := regexFind "[^A-Za-z0-9._:/@-]" $s -}}
{{- $chars := "a reference is name[:tag][@digest] made of letters, digits and . _ - : / @" -}}
{{- $grammar := "not a reference by the distribution grammar (name[:tag][@digest])" -}}
{{- if not $s -}}
{{- printf "empty value; %s" $chars -}}
{{- else if and .warm (gt (len $s) 520) -}}
{{- printf "%d bytes long, at most 520 accepted; %s" (len $s) $chars -}}
{{- else if and .warm $bad -}}
{{- $class := "character" -}}
{{- if regexMatch "^[\\x00-\\x1f\\x7f-\\x{9f}]$" $bad }}{{ $class = "control character" -}}
{{- else if regexMatch "^[\\s\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}]$" $bad }}{{ $class = "whitespace" -}}
{{- else if regexMatch "^[|&;<>()$`\\\\\"'*?\\[\\]#~=%!{}^,]$" $bad }}{{ $class = "shell metacharacter" -}}
{{- else if regexMatch "^[^\\x00-\\x7f]$" $bad }}{{ $class = "non-ASCII character" }}{{ end -}}
{{- printf "%s '%s' at byte %d; %s" $class (trimAll "\"" (printf "%q" $bad)) (len (first (regexSplit "[^A-Za-z0-9._:/@-]" $s 2))) $chars -}}
{{- else if not (regexMatch "^((?:(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*|\\[(?:[a-fA-F0-9:]+)\\])(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*)*)(?::([\\w][\\w.-]{0,127}))?(?:@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][[:xdigit:]]{32,}))?$" $s) -}}
{{- $grammar -}}
{{- else -}}
{{- $name := regexReplaceAll "(:[\\w][\\w.-]{0,127})?(@.*)?$" $s "" -}}
{{- $first := first (splitList "/" $name) -}}
{{- $domain := and (contains "/" $name) (or (contains "." $first) (contains ":" $first) (eq $first "localhost") (ne (lower $first) $first)) -}}
{{- $path := ternary (regexReplaceAll "^[^/]*/" $name "") $name $domain -}}
{{- if not (contains "/" $name) }}{{ $path = printf "library/%s" $name }}{{ end -}}
{{- $digest := regexFind "@.*$" $s | trimPrefix "@" -}}
{{- $algo := regexFind "^[^:]*" $digest -}}
{{- $encoded := regexFind "[^:]*$" $digest -}}
{{- $hex := ternary (len $encoded) 0 (regexMatch "^[a-f0-9]+$" $encoded) -}}
{{- if regexMatch "^[a-f0-9]{64}$" $s -}}
{{- $grammar -}}
{{- else if gt (len $path) 255 -}}
{{- $grammar -}}
{{- else if and $digest (not (has (list $algo $hex) (list (list "sha256" 64) (list "sha384" 96) (list "sha512" 128)))) -}}
{{- $grammar -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* pkg/name ParseUpstream: {"name", "url"} or {"err": the binary's message after "upstreams: "}. */ -}}
{{- define "nodecache.parseUpstream" -}}
{{- $s := trim . -}}
{{- $n := $s -}}{{- $raw := "" -}}{{- $hasURL := contains "=" $s -}}
{{- if $hasURL }}{{ $n = regexReplaceAll "=.*$" $s "" }}{{ $raw = regexReplaceAll "^[^=]*=" $s "" }}{{ end -}}
{{- $r := include "nodecache.parseRegistry" $n | fromJson -}}
{{- if $r.err -}}
{{- toJson (dict "err" (printf "--upstream: %s" $r.err)) -}}
{{- else -}}
{{- if not $hasURL }}{{ $raw = ternary "https://registry-1.docker.io" (printf "https://%s" $r.name) (eq (include "nodecache.canonical" $r.name) "docker.io") }}{{ end -}}
{{- $word := trim $raw -}}
{{- $u := dict -}}
{{- if eq (lower $word) "offline" -}}
{{- $u = dict "url" "offline" -}}
{{- else if include "nodecache.nearOffline" $word -}}
{{- $u = dict "err" (printf "URL %q: did you mean offline? want http://HOST[:PORT], https://HOST[:PORT], or offline (serve what the cache holds, never ask the upstream)" $word) -}}
{{- else -}}
{{- $u = include "nodecache.parseURL" (dict "field" "URL" "s" $raw) | fromJson -}}
{{- end -}}
{{- if $u.err -}}
{{- toJson (dict "err" (printf "--upstream %s: %s" $r.name $u.err)) -}}
{{- else -}}
{{- toJson (dict "name" $r.name "url" $u.url) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* pkg/name nearOffline: "true" when a URL word reads as a try at "offline" rather than a host. */ -}}
{{- define "nodecache.nearOffline" -}}
{{- $w := . -}}
{{- $t := regexReplaceAll "[:/]+$" $w "" -}}
{{- if and (ne $t $w) $t -}}
{{- if or (eq (lower $t) "offline") (include "nodecache.nearOffline" $t) }}true{{ end -}}
{{- else if and $w (not (regexMatch "[.:/\\[]" $w)) -}}
{{- $lw := lower $w -}}
{{- $letters := regexReplaceAll "[-_ ]" $lw "" -}}
{{- if has $lw (list "off" "none" "no" "false" "disabled" "disable" "airgap" "airgapped" "air-gapped" "air-gap") -}}true
{{- else if and (hasPrefix "o" $letters) (ne $letters "online") (le (include "nodecache.editDistance" (list $letters "offline") | int) 2) -}}true
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The Levenshtein distance of two strings (list a b), byte-wise; len(a) when a is over 64 bytes. */ -}}
{{- define "nodecache.editDistance" -}}
{{- $a := index . 0 -}}{{- $b := index . 1 -}}
{{- if gt (len $a) 64 -}}{{ len $a }}{{- else -}}
{{- $prev := until (add1 (len $b) | int) -}}
{{- range $i := untilStep 1 (add1 (len $a) | int) 1 -}}
{{- $cur := list $i -}}
{{- range $j := untilStep 1 (add1 (len $b) | int) 1 -}}
{{- $cost := ternary 0 1 (eq (substr (sub $i 1 | int) $i $a) (substr (sub $j 1 | int) $j $b)) -}}
{{- $cur = append $cur (min (add1 (index $prev $j)) (add1 (index $cur (sub $j 1 | int))) (add (index $prev (sub $j 1 | int)) $cost)) -}}
{{- end -}}
{{- $prev = $cur -}}
{{- end -}}
{{- last $prev -}}
{{- end -}}
{{- end -}}

{{- /* pkg/name ParseURL (field, s): {"url": scheme://host[:port]} or {"err": the binary's message}. */ -}}
{{- define "nodecache.parseURL" -}}
{{- $field := .field -}}
{{- $t := trim .s -}}
{{- $want := "want http://HOST[:PORT] or https://HOST[:PORT]" -}}
{{- $shown := include "nodecache.redactURL" $t -}}
{{- $bad := regexFind "[\\x00-\\x20\\x7f-\\x{10FFFF}]" $t -}}
{{- $reason := "" -}}{{- $url := "" -}}
{{- if not $t -}}
{{- $reason = printf "required: %s, e.g. http://10.0.0.5:5000" $want -}}
{{- else if and $bad (ne $shown $t) -}}
{{- $reason = printf "a space, control or non-ASCII character: %s (ASCII, no spaces)" $want -}}
{{- else if $bad -}}
{{- $reason = printf "character '%s' at byte %d: %s (ASCII, no spaces)" (trimAll "\"" (printf "%q" $bad)) (len (first (regexSplit "[\\x00-\\x20\\x7f-\\x{10FFFF}]" $t 2))) $want -}}
{{- else if not (contains "://" $t) -}}
{{- $u := include "nodecache.parseURL" (dict "field" $field "s" (printf "http://%s" $t)) | fromJson -}}
{{- $reason = ternary (printf "no scheme: did you mean %s?" $u.url) (printf "no scheme: %s" $want) (not $u.err) -}}
{{- else -}}
{{- $scheme := regexFind "^[^:]*" $t -}}
{{- $rest := trimPrefix (printf "%s:" $scheme) $t -}}
{{- $beforeFragment := regexReplaceAll "#.*$" $rest "" -}}
{{- $query := contains "?" $beforeFragment -}}
{{- $hier := regexReplaceAll "\\?.*$" $beforeFragment "" -}}
{{- $authority := "" -}}{{- $path := $hier -}}
{{- if hasPrefix "//" $hier }}{{ $authority = regexReplaceAll "/.*$" (trimPrefix "//" $hier) "" }}{{ $path = trimPrefix $authority (trimPrefix "//" $hier) }}{{ end -}}
{{- $user := contains "@" $authority -}}
{{- $host := regexReplaceAll "^.*@" $authority "" -}}
{{- $hostname := $host -}}{{- $port := "" -}}{{- $portErr := "" -}}
{{- if hasPrefix "[" $host -}}
{{- $hostname = regexReplaceAll "\\].*$" (trimPrefix "[" $host) "" -}}
{{- $after := regexReplaceAll "^[^\\]]*\\]" $host "" -}}
{{- if not (contains "]" $host) }}{{ $portErr = "missing ']' in host" }}{{ else if and $after (not (regexMatch "^:[0-9]*$" $after)) }}{{ $portErr = printf "invalid port %q after host" $after }}{{ end -}}
{{- $port = trimPrefix ":" $after -}}
{{- else if contains ":" $host -}}
{{- $hostname = regexReplaceAll ":[^:]*$" $host "" -}}
{{- $port = regexFind "[^:]*$" $host -}}
{{- if not (regexMatch "^[0-9]*$" $port) }}{{ $portErr = printf "invalid port %q after host" (printf ":%s" $port) }}{{ end -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z][A-Za-z0-9+.-]*$" $scheme) -}}
{{- $reason = printf "not a URL (first path segment in URL cannot contain colon): %s" $want -}}
{{- else if $portErr -}}
{{- $reason = printf "not a URL (%s): %s" $portErr $want -}}
{{- else if $user -}}
{{- $reason = printf "credentials (user:password@) are not accepted: %s; nodecache pulls anonymously" $want -}}
{{- else if not (has (lower $scheme) (list "http" "https")) -}}
{{- $reason = printf "scheme %q: %s" (lower $scheme) $want -}}
{{- else if or (not (hasPrefix "//" $hier)) (not $host) -}}
{{- $reason = printf "no host: %s" $want -}}
{{- else if not (has $path (list "" "/")) -}}
{{- $reason = printf "path %q is not accepted: %s (the registry API is at /v2/ of the host)" $path $want -}}
{{- else if $query -}}
{{- $reason = printf "a query is not accepted: %s" $want -}}
{{- else if contains "#" $t -}}
{{- $reason = printf "a fragment is not accepted: %s" $want -}}
{{- else if hasSuffix ":" $host -}}
{{- $reason = printf "empty port: %s" $want -}}
{{- else if and (hasPrefix "[" $host) (not (include "nodecache.ipv6" $hostname | fromJson).ok) -}}
{{- $reason = printf "host [%s] is not an IPv6 address without zone: %s" (replace "%25" "%" $hostname) $want -}}
{{- else if and (not (hasPrefix "[" $host)) (or (contains ":" $hostname) (not (regexMatch "^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*|\\[(?:[a-fA-F0-9:]+)\\])(?::[0-9]+)?$" $hostname))) -}}
{{- $reason = printf "host %q is not a DNS name or IP address: %s" $hostname $want -}}
{{- else if and $port (include "nodecache.port" $port) -}}
{{- $reason = include "nodecache.port" $port -}}
{{- else -}}
{{- $h := lower $hostname -}}
{{- if hasPrefix "[" $host }}{{ $h = printf "[%s]" $h }}{{ end -}}
{{- if $port }}{{ $h = printf "%s:%s" $h $port }}{{ end -}}
{{- $url = printf "%s://%s" (lower $scheme) $h -}}
{{- end -}}
{{- end -}}
{{- if $reason -}}
{{- toJson (dict "err" (ternary (printf "%s: %s" $field $reason) (printf "%s %q: %s" $field $shown $reason) (not $t))) -}}
{{- else -}}
{{- toJson (dict "url" $url) -}}
{{- end -}}
{{- end -}}

{{- /* pkg/name redact: a URL's password replaced by xxxxx. */ -}}
{{- define "nodecache.redactURL" -}}
{{- $s := . -}}
{{- $auth := regexFind "^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*" $s -}}
{{- if and $auth (contains "@" $auth) (not (regexMatch "[\\x00-\\x20\\x7f]" $s)) -}}
{{- $user := regexReplaceAll "@[^@]*$" (regexReplaceAll "^.*://" $auth "") "" -}}
{{- if contains ":" $user -}}
{{- printf "%s%s:xxxxx%s" (regexReplaceAll "://.*$" $auth "://") (regexReplaceAll ":.*$" $user "") (trimPrefix (regexReplaceAll "@[^@]*$" $auth "") $s) -}}
{{- else -}}{{ $s }}{{- end -}}
{{- else if and (contains "@" $s) (contains "://" (regexReplaceAll "@.*$" $s "")) -}}
{{- printf "%sxxxxx%s" (regexReplaceAll "://.*$" $s "://") (regexReplaceAll "^[^@]*" $s "") -}}
{{- else -}}{{ $s }}{{- end -}}
{{- end -}}
