package peer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Membership defaults and bounds.
const (
	// DefaultRefresh is MembershipOptions.Refresh's default (--peers-refresh).
	DefaultRefresh = 10 * time.Second
	// DefaultDialTimeout is MembershipOptions.DialTimeout's default (--peer-dial-timeout).
	DefaultDialTimeout = time.Second
	// DefaultRecheck is MembershipOptions.Recheck's default: 0, every live address is asked again
	// at every Refresh. A member that restarted (a rollout of the DaemonSet restarts every agent
	// at the same address, with a new id) or died is seen within one Refresh; until then nodes
	// would disagree on owners, and a dead member would look live.
	DefaultRecheck = 0
	// maxIDAnswer is the most bytes of an id answer read; a real one is ~30.
	maxIDAnswer = 4 << 10
	// maxID is the longest instance id accepted (upstream.NewInstanceID makes 16 characters).
	maxID = 128
	// idRequests is how many id requests one refresh has in flight at most.
	idRequests = 16
)

// MembershipOptions configure a Membership.
type MembershipOptions struct {
	// Source lists the peer-port addresses (--peers). Required.
	Source Source
	// Self is this node's instance id: a member announcing it is this node (never compared by
	// address).
	Self string
	// Keys signs the id requests. Required.
	Keys *Keys
	// Refresh is how often Run reads Source again and asks unknown or failed addresses for
	// their id (--peers-refresh). Default DefaultRefresh.
	Refresh time.Duration
	// Recheck is how old a live address's answer may get before it is asked again (a node that
	// restarted at the same address with a new id, or stopped answering); 0 (the default,
	// DefaultRecheck): at every Refresh. An id request is one small signed GET.
	Recheck time.Duration
	// DialTimeout bounds the connection of an id request (--peer-dial-timeout); the request as
	// a whole is bounded by 2×DialTimeout+1s. Default DefaultDialTimeout.
	DialTimeout time.Duration
	// Transport sends the id requests (plain HTTP to http://ADDR/nodecache/v1/peer). Default:
	// one dialling within DialTimeout, without proxies (peers are on the cluster network) and
	// without keep-alives (an address is asked rarely, and no idle connection outlives Run).
	Transport http.RoundTripper
	// Logger receives members joining, leaving and failing, and Source failures (each logged
	// when it changes, not at every refresh). Default: disabled.
	Logger zerolog.Logger
	// Clock tells the time for the proofs and Recheck. Default time.Now.
	Clock func() time.Time
}

// Membership keeps the current members: the addresses of the latest good Source read whose id
// request (IDPath, signed) answered. Safe for concurrent use.
type Membership struct {
	opts   MembershipOptions
	client *http.Client

	refreshing sync.Mutex // one Refresh at a time

	mu          sync.Mutex
	addrs       []string         // the latest good Source read
	state       map[string]probe // by address, for addrs only
	sourceError string           // the last Source error logged, "" when the last read worked
}

// probe is the latest id request to one address.
type probe struct {
	id  string // the id it announced; "" when it failed
	err error
	at  time.Time
	// missed counts the re-asks in a row a live address did not answer; it stays live through
	// one (a loaded node that answered late), so one slow answer does not move owners.
	missed int
}

// liveMisses is how many re-asks in a row a live address may miss and stay live.
const liveMisses = 1

// NewMembership returns a Membership with opts' defaults filled in; it starts nothing and has
// no members until Refresh or Run.
func NewMembership(opts MembershipOptions) *Membership {
	if opts.Refresh <= 0 {
		opts.Refresh = DefaultRefresh
	}
	if opts.Recheck < 0 {
		opts.Recheck = DefaultRecheck
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Transport == nil {
		opts.Transport = &http.Transport{
			DialContext:       (&net.Dialer{Timeout: opts.DialTimeout}).DialContext,
			DisableKeepAlives: true,
		}
	}
	return &Membership{
		opts: opts,
		client: &http.Client{
			Transport: opts.Transport,
			Timeout:   2*opts.DialTimeout + time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse // a peer port does not redirect
			},
		},
		state: map[string]probe{},
	}
}

// Run refreshes now and then every Refresh until ctx ends; every goroutine it starts has
// stopped when it returns.
func (m *Membership) Run(ctx context.Context) {
	t := time.NewTicker(m.opts.Refresh)
	defer t.Stop()
	for {
		m.Refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh reads Source (keeping the previous addresses when that fails) and asks every address
// that is new, failed, or whose answer is older than Recheck for its id, all before it returns.
// An address gone from Source is dropped at once.
func (m *Membership) Refresh(ctx context.Context) {
	m.refreshing.Lock()
	defer m.refreshing.Unlock()
	addrs, err := m.opts.Source.Addresses(ctx)
	m.mu.Lock()
	if err != nil {
		if msg := err.Error(); msg != m.sourceError && ctx.Err() == nil {
			m.opts.Logger.Error().Str("peers", m.opts.Source.String()).Err(err).Msg("cannot read the peer list; keeping the addresses read before")
			m.sourceError = msg
		}
		addrs = m.addrs
	} else {
		m.sourceError = ""
	}
	now := m.opts.Clock()
	var ask []string
	for _, a := range addrs {
		p, ok := m.state[a]
		if !ok || p.err != nil || now.Sub(p.at) >= m.opts.Recheck || p.at.After(now) {
			ask = append(ask, a)
		}
	}
	m.mu.Unlock()

	answers := m.askAll(ctx, ask)
	if ctx.Err() != nil {
		return // answers cut short by the end of ctx say nothing about the peers
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	next := make(map[string]probe, len(addrs))
	for _, a := range addrs {
		if p, ok := answers[a]; ok {
			if before, was := m.state[a]; was && before.err == nil && p.err != nil && before.missed < liveMisses {
				before.missed++ // live through one missed re-ask
				next[a] = before
				continue
			}
			m.logChange(a, m.state[a], p)
			next[a] = p
		} else if p, ok := m.state[a]; ok {
			next[a] = p
		}
	}
	for a, p := range m.state {
		if _, ok := next[a]; !ok && p.err == nil {
			m.opts.Logger.Info().Str("peer", p.id).Str("addr", a).Msg("peer left the peer list")
		}
	}
	m.addrs, m.state = addrs, next
}

// logChange logs what changed at address a from before to after; m.mu is held.
func (m *Membership) logChange(a string, before, after probe) {
	log := m.opts.Logger
	switch {
	case after.err != nil && (before.err == nil || before.err.Error() != after.err.Error()):
		log.Warn().Str("addr", a).Str("was", before.id).Err(after.err).Msg("peer did not answer its id request")
	case after.err == nil && after.id != before.id:
		log.Info().Str("peer", after.id).Str("addr", a).Bool("self", after.id == m.opts.Self).Msg("peer joined")
	}
}

// askAll asks addrs for their ids, idRequests at a time, and returns every answer by address.
func (m *Membership) askAll(ctx context.Context, addrs []string) map[string]probe {
	answers := make(map[string]probe, len(addrs))
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, idRequests)
	for _, a := range addrs {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			id, err := m.askID(ctx, a)
			mu.Lock()
			answers[a] = probe{id: id, err: err, at: m.opts.Clock()}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return answers
}

// askID sends the signed id request to addr and returns the id it announced.
//
// Errors: no answer (dial, timeout), a status other than 200, an answer that is not JSON or
// holds no valid id.
func (m *Membership) askID(ctx context.Context, addr string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+IDPath, nil)
	if err != nil {
		return "", fmt.Errorf("ask %s for its id: %w", addr, err)
	}
	m.opts.Keys.Sign(req, m.opts.Self, m.opts.Clock())
	resp, err := m.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("ask %s for its id: %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxIDAnswer+1))
	if err != nil {
		return "", fmt.Errorf("ask %s for its id: read the answer: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("ask %s for its id: status %d%s", addr, resp.StatusCode, errorMessage(body))
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" {
		return "", fmt.Errorf("ask %s for its id: Content-Type %q; want application/json", addr, resp.Header.Get("Content-Type"))
	}
	var a idAnswer
	if len(body) > maxIDAnswer {
		return "", fmt.Errorf("ask %s for its id: the answer is over %d bytes", addr, maxIDAnswer)
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return "", fmt.Errorf("ask %s for its id: the answer is not {\"id\": ...}: %w", addr, err)
	}
	if err := checkID(a.ID); err != nil {
		return "", fmt.Errorf("ask %s for its id: %w", addr, err)
	}
	return a.ID, nil
}

// checkID refuses an announced id that is empty, longer than maxID or not printable ASCII
// without spaces (it goes into a header and the logs).
func checkID(id string) error {
	if id == "" || len(id) > maxID {
		return fmt.Errorf("the id %q is empty or over %d bytes", id, maxID)
	}
	for _, r := range id {
		if r <= ' ' || r > '~' {
			return fmt.Errorf("the id %q holds a character other than printable ASCII", id)
		}
	}
	return nil
}

// errorMessage returns ": " and the first message of an OCI error body, or "".
func errorMessage(body []byte) string {
	var e struct {
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if json.Unmarshal(body, &e) != nil || len(e.Errors) == 0 || e.Errors[0].Message == "" {
		return ""
	}
	return ": " + e.Errors[0].Message
}

// Members returns the live members other than this node (whose id is Self), sorted by ID: the
// addresses of the latest Source read whose id request answered. An id announced at several
// addresses (a dual-stack Service's A and AAAA records) is one member, at the lowest address.
func (m *Membership) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.members()
}

// members is Members with m.mu held.
func (m *Membership) members() []Member {
	out := []Member{}
	for _, a := range m.addrs { // sorted: the first address of an id is its lowest
		p, ok := m.state[a]
		if !ok || p.err != nil || p.id == m.opts.Self {
			continue
		}
		out = append(out, Member{ID: p.id, Addr: a})
	}
	slices.SortStableFunc(out, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	return slices.CompactFunc(out, func(a, b Member) bool { return a.ID == b.ID })
}

// Count is how many members are live (Members) and how many addresses failed their latest id
// request, for the metric nodecache_peers{state="live|failed"}; this node is not counted live.
func (m *Membership) Count() (live, failed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range m.addrs {
		if p, ok := m.state[a]; ok && p.err != nil {
			failed++
		}
	}
	return len(m.members()), failed
}

// Self reports whether the latest Source read lists this node itself: an address that
// announced Self. False until a Refresh got the answer; a --peers that never lists its own node
// is likely a mistake (another Service, another port).
func (m *Membership) Self() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range m.addrs {
		if p, ok := m.state[a]; ok && p.err == nil && p.id == m.opts.Self {
			return true
		}
	}
	return false
}

// Failures returns the addresses whose latest id request failed, with why (for status pages
// and tests).
func (m *Membership) Failures() map[string]error {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]error{}
	for _, a := range m.addrs {
		if p, ok := m.state[a]; ok && p.err != nil {
			out[a] = p.err
		}
	}
	return out
}

// Validate reports options a Membership cannot work without (Source, Keys).
func (o MembershipOptions) Validate() error {
	if o.Source == nil || o.Keys == nil {
		return errors.New("peer membership needs a Source and Keys")
	}
	if strings.TrimSpace(o.Self) == "" {
		return errors.New("peer membership needs this node's instance id (Self)")
	}
	return nil
}
