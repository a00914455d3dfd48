package test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/promqltest"
)

// TestAlertUpstreamNoSuccess (issue 25): NodecacheUpstreamNoSuccess, evaluated by Prometheus' own
// engine (promqltest) over 20 minutes of series as nodecache exposes them (failure series at 0
// from the start, the last success absent before the first), fires for an upstream whose
// failures grew over the last 10 minutes with no success in them — never answered, or answered
// until 15 minutes ago — and not for one that fails but also answers, one idle since an old
// failure, an offline one (no series), or one whose shared tier fails while the registry
// answers in its place.
func TestAlertUpstreamNoSuccess(t *testing.T) {
	t.Parallel()
	expr, forDuration, labels := alertRule(t, "NodecacheUpstreamNoSuccess")
	if forDuration != "5m" || labels["severity"] == "" {
		t.Errorf("NodecacheUpstreamNoSuccess: for %q, labels %v; want for 5m and a severity", forDuration, labels)
	}
	expr = strings.Join(strings.Fields(expr), " ")
	const (
		failures = `nodecache_upstream_failures_total{instance=%q,job="nodecache",upstream="docker.io",tier=%q,reason=%q}`
		success  = `nodecache_upstream_last_success_timestamp_seconds{instance=%q,job="nodecache",upstream="docker.io",tier=%q}`
	)
	f := func(instance, tier, reason string) string { return fmt.Sprintf(failures, instance, tier, reason) }
	s := func(instance, tier string) string { return fmt.Sprintf(success, instance, tier) }
	script := strings.Join([]string{
		"load 1m",
		// Never answered: a failure a minute from the start.
		"  " + f("down", "upstream", "tls") + " 0+1x20",
		"  " + f("down", "upstream", "connect") + " 0x20",
		// Answered (the last success is the time of the sample) until 5m, then fails.
		"  " + f("down-later", "upstream", "http_429") + " 0x5 1+1x15",
		"  " + s("down-later", "upstream") + " 0+60x5 300x15",
		// Fails and answers all along: not down.
		"  " + f("flaky", "upstream", "http_5xx") + " 0+1x20",
		"  " + s("flaky", "upstream") + " 0+60x20",
		// One failure at 2m, idle since: nothing grew in the last 10 minutes.
		"  " + f("idle", "upstream", "dns") + " 0 0 1x18",
		"  " + s("idle", "upstream") + " 0 60x19",
		// The shared tier fails, the registry answers in its place.
		"  " + f("shared", "shared", "timeout") + " 0+1x20",
		"  " + f("shared", "upstream", "timeout") + " 0x20",
		"  " + s("shared", "upstream") + " 0+60x20",
		// Offline: never asked, no health series.
		`  nodecache_upstream_offline{instance="offline",job="nodecache",upstream="docker.io"} 1x20`,
		"",
		"eval instant at 20m " + expr,
		`  {instance="down",upstream="docker.io"} 10`,
		`  {instance="down-later",upstream="docker.io"} 10`,
		"",
		// At 8m the later one still had a success within 10 minutes (at 5m).
		"eval instant at 8m " + expr,
		`  {instance="down",upstream="docker.io"} 8`,
		"",
	}, "\n")
	promqltest.RunTest(t, script, promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery))
}

// TestAlertUpstreamFailingNot404 (issue 25): NodecacheUpstreamFailing reads
// nodecache_upstream_fetch_duration_seconds, where an upstream's 404 is result="not_found" (the
// answer to a client's question): an upstream answering mostly 404s (a node retrying a mistyped
// image) does not fire, one whose fetches mostly fail does.
func TestAlertUpstreamFailingNot404(t *testing.T) {
	t.Parallel()
	expr, _, _ := alertRule(t, "NodecacheUpstreamFailing")
	expr = strings.Join(strings.Fields(expr), " ")
	const count = `nodecache_upstream_fetch_duration_seconds_count{instance=%q,job="nodecache",upstream="docker.io",tier="upstream",kind="manifest",result=%q}`
	c := func(instance, result string) string { return fmt.Sprintf(count, instance, result) }
	script := strings.Join([]string{
		"load 1m",
		// Ten 404s a minute and one success: no failure at all.
		"  " + c("typo", "not_found") + " 0+10x20",
		"  " + c("typo", "ok") + " 0+1x20",
		// Ten errors a minute and one success.
		"  " + c("down", "error") + " 0+10x20",
		"  " + c("down", "ok") + " 0+1x20",
		"",
		"eval instant at 20m " + expr,
		`  {instance="down",upstream="docker.io"} 0.9090909090909091`,
		"",
	}, "\n")
	promqltest.RunTest(t, script, promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery))
}
