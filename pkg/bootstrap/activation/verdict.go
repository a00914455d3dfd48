package activation

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// State is an activation answer.
type State string

// States, with the exit code `nodecache status` gives each (docs/contracts.md, "Exit codes").
const (
	// Active: the running runtime pulls through the mirror (exit 0).
	Active State = "active"
	// NotActive: it does not, or not yet (exit 1).
	NotActive State = "not_active"
	// Unknown: the evidence could not be read (exit 3).
	Unknown State = "unknown"
	// NotApplicable: no runtime process and no runtime configuration on this node (exit 3).
	NotApplicable State = "not_applicable"
)

// ExitCode maps a state to the exit code of `nodecache status`.
func (s State) ExitCode() int {
	switch s {
	case Active:
		return 0
	case NotActive:
		return 1
	default:
		return 3
	}
}

// Text is the state as printed in the text table.
func (s State) Text() string {
	switch s {
	case Active:
		return "ACTIVE"
	case NotActive:
		return "NOT ACTIVE"
	case NotApplicable:
		return "NOT APPLICABLE"
	default:
		return "UNKNOWN"
	}
}

// Result is the outcome of one check.
type Result string

// Check results.
const (
	Pass    Result = "pass"    // this piece of evidence supports ACTIVE
	Fail    Result = "fail"    // this piece of evidence shows the mirror is bypassed
	Unread  Result = "unknown" // this piece of evidence could not be read
	Warn    Result = "warn"    // does not change the verdict, but needs attention
	Info    Result = "info"    // context only
	Skipped Result = "skip"    // not applicable here
)

// Check is one row of the report: one piece of evidence and why it says what it says.
type Check struct {
	Runtime string `json:"runtime"`
	Name    string `json:"check"`
	Result  Result `json:"result"`
	Reason  string `json:"reason"`
}

// RuntimeReport is the verdict for one runtime.
type RuntimeReport struct {
	Runtime string `json:"runtime"`
	State   State  `json:"state"`
	// Reason is the decisive evidence in one sentence.
	Reason string `json:"reason"`
	// Remedy says what to do when the state is not ACTIVE (or a change is pending).
	Remedy string `json:"remedy,omitempty"`
	// Pending is true when the on-disk configuration differs from what the daemon loaded, or
	// changed after the daemon started: it takes effect at the next restart.
	Pending bool `json:"pending,omitempty"`
	// PID and ProcessStart identify the daemon examined (zero when none was found).
	PID          int        `json:"pid,omitempty"`
	ProcessStart *time.Time `json:"process_start,omitempty"`
	// Version is the daemon's version when it answered.
	Version string `json:"version,omitempty"`
	// LoadedConfigPath is the registry config_path the daemon runs with, when known.
	LoadedConfigPath *string `json:"loaded_config_path,omitempty"`
	// Evidence names where the loaded configuration came from: "introspection",
	// "cri-status", "start-time", "live" (Talos, CRI-O auto reload), or "" when unknown.
	Evidence string `json:"evidence,omitempty"`
	// Mirror is the mirror the runtime is configured to use first, when one was found.
	Mirror string `json:"mirror,omitempty"`

	// startTimeOnly marks a NOT ACTIVE that rests only on the conservative start-time rule,
	// which positive traffic evidence may overturn.
	startTimeOnly bool
	// upstreams are the registries examined (canary picks one).
	upstreams []string
}

// Report is the answer of `nodecache status`.
type Report struct {
	State    State           `json:"state"`
	Reason   string          `json:"reason"`
	Runtimes []RuntimeReport `json:"runtimes"`
	Checks   []Check         `json:"checks"`
	Warnings []string        `json:"warnings,omitempty"`
	// Peers is the mirror's peer summary (with --mirror, when it has --peers); not part of the
	// verdict.
	Peers *PeerSummary `json:"peers,omitempty"`
	// CheckedAt is when the evidence was read.
	CheckedAt time.Time `json:"checked_at"`
}

// ExitCode is the exit code of `nodecache status` for this report.
func (r *Report) ExitCode() int { return r.State.ExitCode() }

// Runtime returns the report of one runtime, if it was examined.
func (r *Report) Runtime(name string) (RuntimeReport, bool) {
	for _, rt := range r.Runtimes {
		if rt.Runtime == name {
			return rt, true
		}
	}
	return RuntimeReport{}, false
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the verdict line, one table row per check with its reason, the warnings and
// the remedy.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", r.State.Text(), r.Reason)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUNTIME\tCHECK\tRESULT\tREASON")
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Runtime, c.Name, strings.ToUpper(string(c.Result)), c.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Peers != nil {
		fmt.Fprintln(&b, r.Peers.Text())
	}
	for _, wn := range r.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", wn)
	}
	for _, rt := range r.Runtimes {
		if rt.Remedy != "" {
			fmt.Fprintf(&b, "%s: %s\n", rt.Runtime, rt.Remedy)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// combine folds per-runtime verdicts into the node's: every examined runtime must be ACTIVE;
// one NOT ACTIVE makes the node NOT ACTIVE; otherwise an UNKNOWN makes it UNKNOWN. Runtimes that
// are not applicable do not count; when none is applicable the node is NOT APPLICABLE.
func combine(rts []RuntimeReport) (State, string) {
	var active, not, unknown []RuntimeReport
	for _, rt := range rts {
		switch rt.State {
		case Active:
			active = append(active, rt)
		case NotActive:
			not = append(not, rt)
		case Unknown:
			unknown = append(unknown, rt)
		}
	}
	join := func(list []RuntimeReport) string {
		var parts []string
		for _, rt := range list {
			parts = append(parts, rt.Runtime+": "+rt.Reason)
		}
		return strings.Join(parts, "; ")
	}
	switch {
	case len(not) > 0:
		return NotActive, join(not)
	case len(unknown) > 0:
		return Unknown, join(unknown)
	case len(active) > 0:
		return Active, join(active)
	}
	var parts []string
	for _, rt := range rts {
		parts = append(parts, rt.Runtime+": "+rt.Reason)
	}
	if len(parts) == 0 {
		return NotApplicable, "no runtime examined"
	}
	return NotApplicable, strings.Join(parts, "; ")
}
