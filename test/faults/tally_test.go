package faults

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
)

// kindClean is the rounds without a fault that store each case's first content (the at-rest
// kind damages stored blobs): judged like the others, with no refusal allowed.
const kindClean kind = "clean"

// counts are the numbers of one kind (or of a run).
type counts struct {
	// faults injected.
	faults int
	// requests judged, and how each was judged (outcome).
	requests, ok, cut, refused, wrongBytes, wrongAnswer int
	// wrongBeforeCut are cut transfers that had already sent bytes that were not the content
	// (not counted as wrong bytes: the transfer broke, no client accepts it).
	wrongBeforeCut int
	// corruptStored: blobs stored under a digest their bytes do not hash to, after a round.
	corruptStored int
	// crashes: serve not alive after a round, other than the intended SIGKILL.
	crashes int
	// failedRecoveries: a clean request after the fault was removed that did not get the
	// right bytes within 10 s.
	failedRecoveries int
	// memoryOver: serve's peak RSS over its bound on a full disk.
	memoryOver int
}

func (c *counts) add(o counts) {
	c.faults += o.faults
	c.requests += o.requests
	c.ok += o.ok
	c.cut += o.cut
	c.refused += o.refused
	c.wrongBytes += o.wrongBytes
	c.wrongAnswer += o.wrongAnswer
	c.wrongBeforeCut += o.wrongBeforeCut
	c.corruptStored += o.corruptStored
	c.crashes += o.crashes
	c.failedRecoveries += o.failedRecoveries
	c.memoryOver += o.memoryOver
}

// judged adds one judged response.
func (c *counts) judged(r result) {
	c.requests++
	switch r.out {
	case outOK:
		c.ok++
	case outCut:
		c.cut++
		if r.wrongBeforeCut {
			c.wrongBeforeCut++
		}
	case outRefused:
		c.refused++
	case outWrongBytes:
		c.wrongBytes++
	case outWrongAnswer:
		c.wrongAnswer++
	}
}

// tally is the run's numbers by kind and the failures found, a few of each sort per kind, with
// where.
type tally struct {
	mu       sync.Mutex
	byKind   map[kind]*counts
	problems map[kind]map[string][]string
	dropped  map[kind]map[string]int
}

// maxProblems is how many failures of one sort (wrong bytes, wrong answer, …) of a kind the
// report lists.
const maxProblems = 8

// problemSorts are the sorts of failure, in the order the report lists them.
var problemSorts = []string{"wrong bytes", "wrong answer", "corrupt stored", "crash", "failed recovery", "memory"}

func newTally() *tally {
	return &tally{byKind: map[kind]*counts{}, problems: map[kind]map[string][]string{}, dropped: map[kind]map[string]int{}}
}

func (tl *tally) add(k kind, c counts) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.byKind[k] == nil {
		tl.byKind[k] = &counts{}
	}
	tl.byKind[k].add(c)
}

// problem records a failure of kind k, of one of problemSorts.
func (tl *tally) problem(k kind, sort, format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.problems[k] == nil {
		tl.problems[k], tl.dropped[k] = map[string][]string{}, map[string]int{}
	}
	if len(tl.problems[k][sort]) >= maxProblems {
		tl.dropped[k][sort]++
		return
	}
	tl.problems[k][sort] = append(tl.problems[k][sort], fmt.Sprintf(format, args...))
}

func (tl *tally) of(k kind) counts {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if c := tl.byKind[k]; c != nil {
		return *c
	}
	return counts{}
}

// total is the sum over the kinds.
func (tl *tally) total() counts {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var t counts
	for _, c := range tl.byKind {
		t.add(*c)
	}
	return t
}

// table writes one line per kind.
func (tl *tally) table(w io.Writer, kinds []kind) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kind\tfaults\tminimum\trequests\tok\tcut\trefused\twrong bytes\twrong answer\tcorrupt stored\tcrashes\tfailed recoveries\t")
	for _, k := range append([]kind{kindClean}, kinds...) {
		c := tl.of(k)
		minimum := "-"
		if k != kindClean {
			minimum = fmt.Sprint(specOf(k).minimum())
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", k, c.faults, minimum, c.requests, c.ok, c.cut,
			c.refused, c.wrongBytes, c.wrongAnswer, c.corruptStored, c.crashes, c.failedRecoveries)
	}
	_ = tw.Flush()
}

// problemsOf lists the recorded failures of k, by sort.
func (tl *tally) problemsOf(k kind) string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var b strings.Builder
	for _, sort := range problemSorts {
		for _, p := range tl.problems[k][sort] {
			fmt.Fprintf(&b, "\n  %s: %s", sort, p)
		}
		if n := tl.dropped[k][sort]; n > 0 {
			fmt.Fprintf(&b, "\n  %s: … and %d more", sort, n)
		}
	}
	return b.String()
}

// line is the suite's one-line result (issue 23).
func (c counts) line() string {
	return fmt.Sprintf("faults %d, requests %d, wrong bytes %d, corrupt stored %d, crashes %d, failed recoveries %d",
		c.faults, c.requests, c.wrongBytes, c.corruptStored, c.crashes, c.failedRecoveries)
}
