package main

import (
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nodecache/nodecache/internal/buildinfo"
	"github.com/nodecache/nodecache/pkg/mirror"
	"github.com/nodecache/nodecache/pkg/mirror/upstream"
	"github.com/nodecache/nodecache/pkg/name"
)

// mirrorFlags are the flags of the embedded registry, shared by serve and agent, bound into c.
func mirrorFlags(c *mirror.Config, lc *logConfig, listenDefault string) []cli.Flag {
	return append([]cli.Flag{
		stringFlag(&c.Listen, "listen", listenDefault, "registry listen `ADDR`"),
		stringFlag(&c.Root, "root", mirror.DefaultRoot, "storage `DIR` (filesystem); created if missing"),
		stringSliceFlag(&c.Upstreams, "upstream", name.DefaultUpstreamValues(),
			"`NAME[=URL]` of a registry to pull through, repeatable; replaces the default set. NAME is the registry host as written in image references (containerd sends it as ?ns=), URL where its API is reached; a bare NAME pulls from that registry itself (https://NAME; Docker Hub: https://registry-1.docker.io). NAME=offline: never ask it (air-gapped sites): what the cache holds is served, tags included, and anything else is 404 at once"),
		boolFlag(&c.Offline, "offline", "make every upstream offline, as NAME=offline: serve only what the cache holds (tags as stored, never revalidated), answer anything else 404 MANIFEST_UNKNOWN or BLOB_UNKNOWN at once, and never connect to an upstream, --chain or --peers for them; their URLs are kept for when the flag is dropped"),
		stringFlag(&c.DefaultUpstream, "default-upstream", "", "upstream `NAME` for requests with neither ?ns= nor a /v2/<NAME>/ prefix (default: docker.io when configured, else none)"),
		durationFlag(&c.UpstreamTimeout, "upstream-timeout", mirror.DefaultUpstreamTimeout, "`DURATION` bound on an upstream answer (headers) and a stalled blob stream; then a cached tag is served as stale"),
		intFlag(&c.UpstreamConcurrency, "upstream-concurrency", upstream.DefaultConcurrency, "`NUMBER` of requests per upstream that may wait for its response headers at once (a body being read holds none); one more waits up to --upstream-timeout for its turn, then gets 429 with Retry-After (a cached tag is served stale instead)"),
		durationFlag(&c.TagTTL, "tag-ttl", 0, "serve a cached tag, and keep a repository's tag listing, for this `DURATION` without asking the upstream (0: revalidate on every request; concurrent listings still share one fetch)"),
		durationFlag(&c.FillTimeout, "fill-timeout", upstream.DefaultFillTimeout, "longest `DURATION` one blob fill from the upstream may take; a broken stream is resumed while it progresses, the fill fails after 5 attempts in a row that add no byte or at this bound"),
		stringFlag(&c.MaxSize, "max-size", "", "cap the cache at `SIZE`: binary units (500MiB, 30GiB, 1TiB) or a share of the filesystem holding --root (30%); over it, least recently pulled images are evicted down to 90% of it (default: no cap)"),
		stringFlag(&c.MetricsListen, "metrics-listen", "", "also serve /metrics, /healthz and /readyz on this `ADDR`"),
		durationFlag(&c.ScrubInterval, "scrub-interval", mirror.DefaultScrubInterval, "re-hash each stored blob once every `DURATION` in the background, evicting one that no longer matches its digest (the next pull fetches it again; counted in nodecache_cache_corrupt_total); 0: never. First after an unclean shutdown. With --storage s3 it is off unless this flag is given (every replica would read the whole shared bucket)"),
		stringFlag(&c.ScrubRate, "scrub-rate", "50MiB", "bound `RATE` on what the scrubber and nodecache cache verify read, bytes a second in binary units (50MiB, 200MiB/s)"),
		durationFlag(&c.IdleTimeout, "idle-timeout", mirror.DefaultIdleTimeout, "close a keep-alive connection idle for this `DURATION` (every listener): idle connections hold descriptors, and anyone who reaches the port could hold them all"),
		intFlag(&c.ClientMaxConns, "client-max-conns", mirror.DefaultClientMaxConns, "`NUMBER` of connections one client address may hold once the connection budget (from the descriptor limit, ulimit -n) is nearly used; more get 503. SNAT and NodePort Services make many nodes one address: keep it above their connections together"),
		stringSliceFlag(&c.Allow, "allow", nil, "`CIDR` allowed to read /nodecache/v1/clients, /nodecache/v1/upstreams and the cache inventory, run verify passes, and pin and unpin images besides loopback, repeatable; it does not gate pulls (that is --pull-allow)"),
		stringSliceFlag(&c.PullAllow, "pull-allow", nil, "`CIDR` allowed to pull (every /v2/ request), repeatable; 127.0.0.1 and ::1 always are; anyone else gets 403 DENIED. Default: every address that reaches the port (said once at start on a non-loopback listener). /healthz, /readyz and /metrics stay open"),
		stringSliceFlag(&c.UpstreamAuth, "upstream-auth", nil, "`NAME=FILE`: pull upstream NAME with the credentials for NAME in FILE, a docker config.json or Kubernetes .dockerconfigjson (auths, credHelpers, credsStore; helpers run from PATH), repeatable. Read again when the file changes. WARNING: everything these credentials can read becomes readable by every client that may pull through the cache: set --pull-allow"),
		stringFlag(&c.Chain, "chain", "", "`URL` of a shared nodecache (http(s)://HOST[:PORT]) through which every upstream is pulled, sent ?ns=<NAME>; when it fails (no answer, timeout, 5xx) the upstream is pulled directly, and after 3 failures in a row for 30 s; --upstream-auth then applies to direct fetches only"),
		stringSliceFlag(&c.UpstreamCA, "upstream-ca", nil, "`NAME=FILE`: also trust the PEM CA certificates in FILE for upstream NAME (its token realm and redirects included), repeatable"),
		stringSliceFlag(&c.UpstreamAllowPrivate, "upstream-allow-private", nil, "`CIDR` an upstream's redirect or token realm may lead to although it is loopback, private, link-local, cloud metadata, CGNAT or otherwise not globally reachable, repeatable. Without it such an address is reached on an upstream's word only when it is a loopback or private address that upstream itself was reached at; configured upstreams, --chain and proxies are always reached. Refusals are 502s, counted in nodecache_upstream_refused_targets_total"),
		stringFlag(&c.MaxUnknownBlobSize, "max-unknown-blob-size", "16GiB", "bound `SIZE` (binary units) of a blob whose size the upstream stated in neither its HEAD nor its GET answer; past it the fill fails and nothing is stored"),
		stringFlag(&c.Peers, "peers", "", "share blobs and manifests by digest with the other node caches listed by `SOURCE`: dns:NAME:PORT (a headless Service's records), file:PATH (HOST:PORT a line, re-read when it changes) or HOST:PORT,HOST:PORT. Each digest's owner (rendezvous hashing) fetches it from the upstream once for the cluster; a node whose peers fail pulls from the upstream as without peers. Needs --peer-key-file"),
		stringFlag(&c.PeerListen, "peer-listen", "", "`ADDR` where this node answers its peers (plain HTTP, every request signed with the cluster key); empty: this node only asks. Needs --peers and --peer-key-file"),
		stringFlag(&c.PeerKeyFile, "peer-key-file", "", "`FILE` holding the cluster key that signs and checks peer requests (HMAC-SHA256): one key of at least 32 bytes, or two lines during a rotation (requests are signed with the first, either is accepted); re-read when it changes"),
		durationFlag(&c.PeersRefresh, "peers-refresh", 10*time.Second, "how often the --peers source is read again and every member is asked for its id (`DURATION`): a member that restarted, died or joined is seen within it"),
		durationFlag(&c.PeerDialTimeout, "peer-dial-timeout", time.Second, "`DURATION` bound on a connection to a member; then the next member, and at last the upstream, is asked"),
	}, logFlags(lc, false)...)
}

func serveCommand() *cli.Command {
	var (
		cfg mirror.Config
		lc  logConfig
	)
	return withConfig(&cli.Command{
		Name:  "serve",
		Usage: "run the pull-through registry for many upstreams on one port",
		Description: `Serves the OCI distribution API read-only and fills its cache from the configured upstreams.

Routing: containerd sends ?ns=<registry> (hosts.toml); CRI-O and other clients use a path
prefix /v2/<registry>/<repository>/...; anything else goes to --default-upstream.
Only configured upstreams are ever contacted; an offline one (NAME=offline, --offline) never.

Who may pull: every address that reaches --listen, unless --pull-allow CIDR is given; then only
127.0.0.1, ::1 and those networks (anyone else: 403 DENIED, counted in
nodecache_refused_total{reason="pull_allow"}). /healthz, /readyz and /metrics stay open;
/nodecache/v1/clients, /nodecache/v1/upstreams, /nodecache/v1/cache and its pins are answered to
loopback and --allow networks only.

Upstream credentials: --upstream-auth NAME=FILE reads NAME's entry from a docker config.json or
a Kubernetes .dockerconfigjson as docker does (Docker Hub under https://index.docker.io/v1/;
credHelpers/credsStore run docker-credential-* from PATH), and re-reads the file when it changes.
They are sent only to that upstream and an https token realm on its registrable domain, and
never logged. Everything they can read becomes readable by every client that may pull: set
--pull-allow. An upstream that refuses nodecache (401/403) makes the client's answer 403 DENIED,
so containerd falls back to the registry with the node's own pull secrets.

HTTPS_PROXY/HTTP_PROXY/NO_PROXY apply to upstream traffic; --upstream-ca NAME=FILE trusts a
private CA. --tls-cert/--tls-key serve HTTPS (TLS 1.2+), re-read when the files change.

Examples:
   nodecache serve --root /var/lib/nodecache
   nodecache serve --upstream ghcr.io=https://ghcr.io --upstream docker.io=https://registry-1.docker.io
   NODECACHE_LISTEN=127.0.0.1:5000 nodecache serve`,
		Flags: append(mirrorFlags(&cfg, &lc, ":5000"),
			stringFlag(&cfg.TLSCert, "tls-cert", "", "serve HTTPS (TLS 1.2+) on --listen with the PEM certificate (chain) in `FILE`; needs --tls-key; both read again when they change"),
			stringFlag(&cfg.TLSKey, "tls-key", "", "PEM private key `FILE` of --tls-cert"),
			stringFlag(&cfg.Storage, "storage", mirror.StorageFilesystem, "where the cache lives, a storage `TYPE`: filesystem (under --root) or s3 (a bucket several replicas may share; --root then holds only fills in flight, and the background scrubber is off unless --scrub-interval is given)"),
			stringFlag(&cfg.S3.Bucket, "s3-bucket", "", "S3 `BUCKET` of --storage s3"),
			stringFlag(&cfg.S3.Region, "s3-region", "", "AWS `REGION` of the bucket; required unless --s3-endpoint"),
			stringFlag(&cfg.S3.Endpoint, "s3-endpoint", "", "`URL` of an S3-compatible server (http(s)://HOST[:PORT]); default AWS"),
			boolFlag(&cfg.S3.PathStyle, "s3-path-style", "address the bucket as ENDPOINT/BUCKET (most S3-compatible servers)"),
			stringFlag(&cfg.S3.RootDirectory, "s3-root-directory", "", "key `PREFIX` inside the bucket"),
			stringFlag(&cfg.Seed, "seed", "", "at start, store and pin the images of the bundle in `DIR` (an OCI image layout naming its images, or a Talos image cache) once the cache index is loaded; /readyz answers 503 until they are stored, blobs already stored are not read again, and a bundle with a missing or damaged blob stops serve naming it, nothing of it stored"),
			stringFlag(&cfg.S3Profile, "s3-profile", "", "AWS shared-config `PROFILE` for the bucket's credentials (sets AWS_PROFILE); credentials otherwise come from the AWS SDK's default chain: environment, shared credentials file, IRSA, instance roles"),
		),
		Action: func(c *cli.Context) error {
			log, err := lc.logger()
			if err != nil {
				return err
			}
			cfg.ScrubIntervalSet = c.IsSet("scrub-interval")
			opts, err := cfg.Options(log)
			if err != nil {
				return withCode(exitUsage, err)
			}
			opts.Logger = log
			cert, err := cfg.TLS(log)
			if err != nil {
				return withCode(exitUsage, err)
			}
			mirror.ForwardDistributionLogs(log)
			m, err := mirror.New(c.Context, opts)
			if err != nil {
				return err // refused input: exit 2 (exitCode)
			}
			log.Info().Str("version", buildinfo.Version()).Msg("nodecache serve")
			err = mirror.Serve(c.Context, m, mirror.ServeOptions{Listen: cfg.Listen, MetricsListen: cfg.MetricsListen, PeerListen: cfg.PeerListen, IdleTimeout: cfg.IdleTimeout, ClientMaxConns: cfg.ClientMaxConns, Logger: log, TLS: cert})
			if cerr := m.Close(); err == nil {
				err = cerr
			}
			return err // --root held by another process (Serve takes it first): exit 2 (exitCode)
		},
	})
}
