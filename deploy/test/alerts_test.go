package test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	promlabels "github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	sigsyaml "sigs.k8s.io/yaml"
)

// series is one sample of an instant vector: its labels (with __name__ while it has one) and value.
type series struct {
	labels map[string]string
	value  float64
}

// evalInstant evaluates the PromQL subset the instant alerts use — selectors with label
// matchers, numbers, parentheses, sum/max/min/count by or without, comparisons (filtering),
// + - * / and and/or/unless with on/ignoring matching — over the samples of one instant, as
// Prometheus does (one-to-one matching on the labels but __name__; arithmetic drops __name__).
// Anything else fails the test, so that this evaluator is extended rather than approximated.
func evalInstant(t *testing.T, e parser.Expr, in []series) ([]series, float64, bool) {
	t.Helper()
	switch n := e.(type) {
	case *parser.ParenExpr:
		return evalInstant(t, n.Expr, in)
	case *parser.NumberLiteral:
		return nil, n.Val, true
	case *parser.VectorSelector:
		var out []series
		for _, s := range in {
			if !slices.ContainsFunc(n.LabelMatchers, func(m *promlabels.Matcher) bool { return !m.Matches(s.labels[m.Name]) }) {
				out = append(out, series{maps.Clone(s.labels), s.value})
			}
		}
		return out, 0, false
	case *parser.AggregateExpr:
		vec, _, scalar := evalInstant(t, n.Expr, in)
		if scalar || n.Param != nil {
			t.Fatalf("evalInstant: aggregation %s not supported", n)
		}
		groups := map[string]*series{}
		for _, s := range vec {
			key := map[string]string{}
			for k, v := range s.labels {
				if k != "__name__" && slices.Contains(n.Grouping, k) != n.Without {
					key[k] = v
				}
			}
			sig := signature(key)
			g, ok := groups[sig]
			if !ok {
				g = &series{labels: key, value: s.value}
				if n.Op == parser.COUNT {
					g.value = 1
				}
				groups[sig] = g
				continue
			}
			switch n.Op {
			case parser.SUM:
				g.value += s.value
			case parser.COUNT:
				g.value++
			case parser.MAX:
				g.value = max(g.value, s.value)
			case parser.MIN:
				g.value = min(g.value, s.value)
			default:
				t.Fatalf("evalInstant: aggregation %s not supported", n.Op)
			}
		}
		var out []series
		for _, k := range slices.Sorted(maps.Keys(groups)) {
			out = append(out, *groups[k])
		}
		return out, 0, false
	case *parser.BinaryExpr:
		lv, ls, lScalar := evalInstant(t, n.LHS, in)
		rv, rs, rScalar := evalInstant(t, n.RHS, in)
		if n.ReturnBool {
			t.Fatalf("evalInstant: bool modifier not supported: %s", n)
		}
		switch {
		case lScalar && rScalar:
			v, keep := binop(t, n.Op, ls, rs)
			if !keep {
				t.Fatalf("evalInstant: scalar comparison without bool: %s", n)
			}
			return nil, v, true
		case rScalar || lScalar:
			vec := lv
			if lScalar {
				vec = rv
			}
			var out []series
			for _, s := range vec {
				a, b := s.value, rs
				if lScalar {
					a, b = ls, s.value
				}
				v, keep := binop(t, n.Op, a, b)
				if !keep {
					continue
				}
				o := series{maps.Clone(s.labels), v}
				if n.Op.IsComparisonOperator() {
					o.value = s.value // a filter keeps the vector's sample as it is
				} else {
					delete(o.labels, "__name__")
				}
				out = append(out, o)
			}
			return out, 0, false
		}
		m := n.VectorMatching
		if m == nil {
			m = &parser.VectorMatching{}
		}
		if m.Card != parser.CardOneToOne && !n.Op.IsSetOperator() {
			t.Fatalf("evalInstant: group_left/group_right not supported: %s", n)
		}
		match := func(l map[string]string) string {
			key := map[string]string{}
			for k, v := range l {
				if k != "__name__" && slices.Contains(m.MatchingLabels, k) == m.On {
					key[k] = v
				}
			}
			return signature(key)
		}
		right := map[string]series{}
		for _, s := range rv {
			if _, dup := right[match(s.labels)]; dup && !n.Op.IsSetOperator() {
				t.Fatalf("evalInstant: %s: many-to-one match on the right", n)
			}
			right[match(s.labels)] = s
		}
		var out []series
		switch n.Op {
		case parser.LAND, parser.LUNLESS:
			for _, s := range lv {
				if _, ok := right[match(s.labels)]; ok == (n.Op == parser.LAND) {
					out = append(out, s)
				}
			}
		case parser.LOR:
			left := map[string]bool{}
			for _, s := range lv {
				left[match(s.labels)] = true
				out = append(out, s)
			}
			for _, s := range rv {
				if !left[match(s.labels)] {
					out = append(out, s)
				}
			}
		default:
			for _, s := range lv {
				r, ok := right[match(s.labels)]
				if !ok {
					continue
				}
				v, keep := binop(t, n.Op, s.value, r.value)
				if !keep {
					continue
				}
				o := series{maps.Clone(s.labels), v}
				if n.Op.IsComparisonOperator() {
					o.value = s.value
				} else {
					delete(o.labels, "__name__")
				}
				if m.On {
					for k := range o.labels {
						if !slices.Contains(m.MatchingLabels, k) {
							delete(o.labels, k)
						}
					}
				} else {
					for _, k := range m.MatchingLabels {
						delete(o.labels, k)
					}
				}
				out = append(out, o)
			}
		}
		return out, 0, false
	}
	t.Fatalf("evalInstant: %T (%s) not supported", e, e)
	return nil, 0, false
}

// binop applies a binary operator to two numbers; for a comparison, keep reports whether it holds.
func binop(t *testing.T, op parser.ItemType, a, b float64) (v float64, keep bool) {
	t.Helper()
	switch op {
	case parser.ADD:
		return a + b, true
	case parser.SUB:
		return a - b, true
	case parser.MUL:
		return a * b, true
	case parser.DIV:
		return a / b, true
	case parser.EQLC:
		return a, a == b
	case parser.NEQ:
		return a, a != b
	case parser.GTR:
		return a, a > b
	case parser.LSS:
		return a, a < b
	case parser.GTE:
		return a, a >= b
	case parser.LTE:
		return a, a <= b
	}
	t.Fatalf("evalInstant: operator %s not supported", op)
	return 0, false
}

func signature(l map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(l)) {
		fmt.Fprintf(&b, "%s=%q,", k, l[k])
	}
	return b.String()
}

// alertRule returns the rule of alert name in files/alerts.yaml.
func alertRule(t *testing.T, name string) (expr, forDuration string, labels map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert  string            `json:"alert"`
				Expr   string            `json:"expr"`
				For    string            `json:"for"`
				Labels map[string]string `json:"labels"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := sigsyaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r.Expr, r.For, r.Labels
			}
		}
	}
	t.Fatalf("files/alerts.yaml has no alert %s", name)
	return "", "", nil
}

// TestAlertNoLivePeers (issue 22): NodecacheNoLivePeers holds for 5 minutes before it fires, and
// its expression, evaluated as Prometheus would over one instant of scraped series (target labels
// included), selects exactly the nodes that list other members but reach none: not a node with a
// live member, not a node that lists only itself (a one-node cluster), not a node without --peers
// (no nodecache_peers at all).
func TestAlertNoLivePeers(t *testing.T) {
	t.Parallel()
	expr, forDuration, labels := alertRule(t, "NodecacheNoLivePeers")
	if forDuration != "5m" || labels["severity"] == "" {
		t.Errorf("NodecacheNoLivePeers: for %q, labels %v; want for 5m and a severity", forDuration, labels)
	}
	parsed, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	peers := func(instance string, live, failed float64) []series {
		target := map[string]string{"job": "nodecache", "namespace": "nodecache", "pod": "nodecache-" + instance, "node": instance, "instance": instance + ":9464"}
		var out []series
		for state, v := range map[string]float64{"live": live, "failed": failed} {
			l := maps.Clone(target)
			l["__name__"], l["state"] = "nodecache_peers", state
			out = append(out, series{l, v})
		}
		return out
	}
	var in []series
	in = append(in, peers("isolated", 0, 3)...)     // lists 3 others, reaches none: fires
	in = append(in, peers("partial", 1, 2)...)      // one live member: does not
	in = append(in, peers("healthy", 3, 0)...)      // does not
	in = append(in, peers("alone", 0, 0)...)        // lists only itself: does not
	in = append(in, peers("isolated-too", 0, 1)...) // a two-node cluster whose other node fails: fires
	in = append(in, series{map[string]string{"__name__": "nodecache_requests_total", "instance": "no-peers:9464", "job": "nodecache"}, 7})
	out, _, scalar := evalInstant(t, parsed, in)
	if scalar {
		t.Fatalf("%q evaluates to a scalar", expr)
	}
	var firing []string
	for _, s := range out {
		firing = append(firing, s.labels["instance"])
	}
	sort.Strings(firing)
	if want := []string{"isolated-too:9464", "isolated:9464"}; !slices.Equal(firing, want) {
		t.Errorf("NodecacheNoLivePeers fires for %v, want %v (expression %q)", firing, want, expr)
	}
	// The check of the check: the expression as first drafted, without ignoring (state), never
	// fires (its two sides differ in state), and the evaluator must say so.
	naive, err := parser.NewParser(parser.Options{}).ParseExpr(`nodecache_peers{state="live"} == 0 and (nodecache_peers{state="live"} + nodecache_peers{state="failed"}) > 0`)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := evalInstant(t, naive, in); len(out) != 0 {
		t.Errorf("the evaluator matched series that differ in state: %v", out)
	}
}
