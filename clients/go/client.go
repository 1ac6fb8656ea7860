// Package subc is a client of the subc compiler service (`subc serve`): one
// gRPC connection, plaintext or TLS (a CA, a client certificate, a server
// name), the bearer token on every call, and a method per RPC over the
// stubs generated from proto/subc/v1/subc.proto (package subcv1).
//
//	c, err := subc.Dial(ctx, "127.0.0.1:50051", subc.WithToken(token))
//	if err != nil { ... }
//	defer c.Close()
//	added, err := c.Add(ctx, []string{"stock == GOOGL && price > 100 : fwd(3)"})
//	var refusal *subc.Refusal
//	if errors.As(err, &refusal) {
//		for _, d := range refusal.Diagnostics {
//			fmt.Println(d.Rendered)
//		}
//	}
//
// Methods return the API's messages (subcv1) and, when a call fails, a
// *Refusal: the status code and message, and what the status details carry
// (the diagnostics of refused subscription text, the google.rpc.ErrorInfo).
package subc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/subc-dev/subc/clients/go/subcv1"
)

// DefaultTimeout is the deadline of every unary call whose context has
// none, unless WithTimeout gives another.
const DefaultTimeout = 60 * time.Second

// Client is a connection to the subc service. It is safe for concurrent use.
type Client struct {
	conn    *grpc.ClientConn
	timeout time.Duration
	subs    subcv1.SubscriptionsClient
	targets subcv1.TargetsClient
	events  subcv1.EventsClient
}

type config struct {
	token      string
	tls        bool
	caPEM      []byte
	certPEM    []byte
	keyPEM     []byte
	serverName string
	tlsConfig  *tls.Config
	timeout    time.Duration
	block      bool
	dialOpts   []grpc.DialOption
}

// An Option configures Dial.
type Option func(*config)

// WithToken sends `authorization: Bearer <token>` on every call: an
// application's token (its own subscriptions) or the administrator's
// (everything, and targets).
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// WithTLS connects over TLS, verifying the server against the system's
// roots unless WithCA gives a CA. Any of the TLS options implies it.
func WithTLS() Option { return func(c *config) { c.tls = true } }

// WithCA verifies the server's certificate against this CA (PEM) instead of
// the system's roots.
func WithCA(pem []byte) Option { return func(c *config) { c.tls, c.caPEM = true, pem } }

// WithClientCert presents this certificate and key (PEM) to a server that
// requires client certificates (mTLS).
func WithClientCert(certPEM, keyPEM []byte) Option {
	return func(c *config) { c.tls, c.certPEM, c.keyPEM = true, certPEM, keyPEM }
}

// WithServerName is the name the server's certificate must carry, when it
// is not the address's host.
func WithServerName(name string) Option { return func(c *config) { c.tls, c.serverName = true, name } }

// WithTLSConfig uses this TLS configuration as the base, to which WithCA,
// WithClientCert and WithServerName add.
func WithTLSConfig(cfg *tls.Config) Option { return func(c *config) { c.tls, c.tlsConfig = true, cfg } }

// WithTimeout is the deadline of each unary call whose context has none
// (DefaultTimeout otherwise; 0: none).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithBlock makes Dial connect and wait until the connection is ready (or
// ctx ends, or the first attempt fails); without it Dial returns at once
// and connects on the first call.
func WithBlock() Option { return func(c *config) { c.block = true } }

// WithDialOptions adds gRPC dial options (interceptors, keepalive, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) { c.dialOpts = append(c.dialOpts, opts...) }
}

// Dial returns a client of the service at addr: `host:port`,
// `http://host:port` (plaintext) or `https://host:port` (TLS). The context
// bounds the connection only with WithBlock.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	cfg := config{timeout: DefaultTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	target, schemeTLS, err := splitAddr(addr)
	if err != nil {
		return nil, err
	}
	var creds credentials.TransportCredentials
	if cfg.tls || schemeTLS {
		t, err := cfg.tlsClientConfig()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(t)
	} else {
		creds = insecure.NewCredentials()
	}
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if cfg.token != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearer(cfg.token)))
	}
	dialOpts = append(dialOpts, cfg.dialOpts...)
	conn, err := grpc.NewClient(target, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("subc: %s: %w", addr, err)
	}
	if cfg.block {
		if err := waitReady(ctx, conn); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("subc: %s: %w", addr, err)
		}
	}
	return &Client{
		conn:    conn,
		timeout: cfg.timeout,
		subs:    subcv1.NewSubscriptionsClient(conn),
		targets: subcv1.NewTargetsClient(conn),
		events:  subcv1.NewEventsClient(conn),
	}, nil
}

func splitAddr(addr string) (string, bool, error) {
	for _, s := range []struct {
		prefix string
		tls    bool
	}{{"http://", false}, {"https://", true}} {
		if rest, ok := strings.CutPrefix(addr, s.prefix); ok {
			return strings.TrimRight(rest, "/"), s.tls, nil
		}
	}
	if strings.Contains(addr, "://") {
		return "", false, fmt.Errorf("subc: %s: the address is host:port, http://host:port or https://host:port", addr)
	}
	return addr, false, nil
}

func (cfg *config) tlsClientConfig() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.tlsConfig != nil {
		t = cfg.tlsConfig.Clone()
	}
	if cfg.caPEM != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.caPEM) {
			return nil, errors.New("subc: the CA holds no PEM certificate")
		}
		t.RootCAs = pool
	}
	if (cfg.certPEM == nil) != (cfg.keyPEM == nil) {
		return nil, errors.New("subc: a client certificate and its key go together")
	}
	if cfg.certPEM != nil {
		pair, err := tls.X509KeyPair(cfg.certPEM, cfg.keyPEM)
		if err != nil {
			return nil, fmt.Errorf("subc: the client certificate: %w", err)
		}
		t.Certificates = append(t.Certificates, pair)
	}
	if cfg.serverName != "" {
		t.ServerName = cfg.serverName
	}
	return t, nil
}

func waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			return fmt.Errorf("cannot connect (%s)", s)
		}
		if !conn.WaitForStateChange(ctx, s) {
			return ctx.Err()
		}
	}
}

// bearer is the token as per-call credentials. It does not require a
// secure transport: a server on loopback may be plaintext.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying connection, for the generated stubs
// (subcv1.NewTargetsClient(c.Conn()), ...).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// unary runs one call under the client's default deadline (when ctx has
// none, and extra added for calls that wait on the server) and turns its
// error into a *Refusal.
func unary[Req, Resp any](c *Client, ctx context.Context, extra time.Duration, call func(context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	if _, ok := ctx.Deadline(); !ok && c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout+extra)
		defer cancel()
	}
	resp, err := call(ctx, req)
	if err != nil {
		var zero Resp
		return zero, FromError(err)
	}
	return resp, nil
}

// ---------------------------------------------------------------- subscriptions

// An AddOption sets a field of an Add or Check request.
type AddOption func(*subcv1.AddRequest)

// SourceName is the name diagnostics give the lines (default `<request>`).
func SourceName(name string) AddOption { return func(r *subcv1.AddRequest) { r.SourceName = name } }

// RequestID makes a retry safe: a second Add with the same id and lines
// returns the first reply (Replayed) instead of adding again.
func RequestID(id string) AddOption { return func(r *subcv1.AddRequest) { r.RequestId = id } }

// DryRun checks and compiles the lines as an add would, and commits
// nothing: the reply has ValidatedOnly set and, for the administrator,
// WouldWrite per target.
func DryRun() AddOption { return func(r *subcv1.AddRequest) { r.ValidateOnly = true } }

func addRequest(lines []string, opts []AddOption) *subcv1.AddRequest {
	r := &subcv1.AddRequest{Lines: lines}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Add adds the subscriptions of lines (a rules file's lines: blank lines
// and `#` comments are skipped, every other line is one subscription)
// atomically. Refused text is a *Refusal with Diagnostics.
func (c *Client) Add(ctx context.Context, lines []string, opts ...AddOption) (*subcv1.AddResponse, error) {
	return unary(c, ctx, 0, c.subs.Add, addRequest(lines, opts))
}

// Check checks lines as Add would, changing nothing, and returns every
// diagnostic (DiagnosticFromProto turns them into Diagnostics).
func (c *Client) Check(ctx context.Context, lines []string, opts ...AddOption) (*subcv1.CheckResponse, error) {
	return unary(c, ctx, 0, c.subs.Check, addRequest(lines, opts))
}

// An AppOption names the application whose subscriptions a call addresses.
type AppOption func(*string)

// App addresses application app's subscriptions (the administrator may
// name any application; an application only itself). Without it a call
// addresses the caller's own.
func App(app string) AppOption { return func(a *string) { *a = app } }

func appOf(opts []AppOption) string {
	var app string
	for _, o := range opts {
		o(&app)
	}
	return app
}

// Remove removes subscriptions atomically, by id.
func (c *Client) Remove(ctx context.Context, ids []uint64, opts ...AppOption) (*subcv1.RemoveResponse, error) {
	return unary(c, ctx, 0, c.subs.Remove, &subcv1.RemoveRequest{Ids: ids, App: appOf(opts)})
}

// RemoveDryRun is Remove as a dry run: checked, nothing removed; WouldWrite
// per target for the administrator.
func (c *Client) RemoveDryRun(ctx context.Context, ids []uint64, opts ...AppOption) (*subcv1.RemoveResponse, error) {
	return unary(c, ctx, 0, c.subs.Remove, &subcv1.RemoveRequest{Ids: ids, App: appOf(opts), ValidateOnly: true})
}

// Get returns one subscription.
func (c *Client) Get(ctx context.Context, id uint64, opts ...AppOption) (*subcv1.Subscription, error) {
	return unary(c, ctx, 0, c.subs.Get, &subcv1.GetRequest{Id: id, App: appOf(opts)})
}

// ListOptions selects the subscriptions List returns.
type ListOptions struct {
	// At most this many per page (0: the server's default, 100; at most 1000).
	PageSize uint32
	// Where to start: a page's NextPageToken (empty: the first page).
	PageToken string
	// The administrator only: this application's subscriptions only.
	App string
}

// ListPage returns one page of subscriptions, in id order; its
// NextPageToken (empty on the last page) continues the listing.
func (c *Client) ListPage(ctx context.Context, o ListOptions) (*subcv1.ListResponse, error) {
	return unary(c, ctx, 0, c.subs.List, &subcv1.ListRequest{PageSize: o.PageSize, PageToken: o.PageToken, App: o.App})
}

// List iterates over every subscription the caller can see from
// o.PageToken on, fetching a page of o.PageSize at a time. A failed page
// ends the iteration with its error.
func (c *Client) List(ctx context.Context, o ListOptions) iter.Seq2[*subcv1.Subscription, error] {
	return func(yield func(*subcv1.Subscription, error) bool) {
		for {
			page, err := c.ListPage(ctx, o)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, s := range page.Subscriptions {
				if !yield(s, nil) {
					return
				}
			}
			if page.NextPageToken == "" {
				return
			}
			o.PageToken = page.NextPageToken
		}
	}
}

// ListAll returns every subscription the caller can see (List, collected).
func (c *Client) ListAll(ctx context.Context, o ListOptions) ([]*subcv1.Subscription, error) {
	var out []*subcv1.Subscription
	for s, err := range c.List(ctx, o) {
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// ---------------------------------------------------------------- targets

// A Kind is what a target is: Sim, Ebpf, P4Runtime, Agent or Custom.
type Kind struct {
	set func(*subcv1.RegisterTargetRequest)
}

// Sim is the in-memory target; path (a file name, or empty) keeps its
// tables across restarts.
func Sim(path string) Kind {
	return Kind{func(r *subcv1.RegisterTargetRequest) {
		r.Kind = &subcv1.RegisterTargetRequest_Sim{Sim: &subcv1.SimTarget{Path: path}}
	}}
}

// Ebpf is an eBPF program on a Linux interface of the server's host.
func Ebpf(t *subcv1.EbpfTarget) Kind {
	return Kind{func(r *subcv1.RegisterTargetRequest) { r.Kind = &subcv1.RegisterTargetRequest_Ebpf{Ebpf: t} }}
}

// P4Runtime is a P4Runtime switch.
func P4Runtime(t *subcv1.P4RuntimeTarget) Kind {
	return Kind{func(r *subcv1.RegisterTargetRequest) { r.Kind = &subcv1.RegisterTargetRequest_P4Runtime{P4Runtime: t} }}
}

// Agent is a host running `subc agent`.
func Agent(t *subcv1.AgentTarget) Kind {
	return Kind{func(r *subcv1.RegisterTargetRequest) { r.Kind = &subcv1.RegisterTargetRequest_Agent{Agent: t} }}
}

// Custom is a kind the server was built with beyond the others.
func Custom(kind string, options map[string]string) Kind {
	return Kind{func(r *subcv1.RegisterTargetRequest) {
		r.Kind = &subcv1.RegisterTargetRequest_Custom{Custom: &subcv1.CustomTarget{Kind: kind, Options: options}}
	}}
}

// A RegisterOption sets a field of a Register request.
type RegisterOption func(*subcv1.RegisterTargetRequest)

// Manual makes the target change only on Deploy.
func Manual() RegisterOption { return func(r *subcv1.RegisterTargetRequest) { r.Manual = true } }

// Register registers a target (the administrator only). It holds nothing
// until the first Deploy.
func (c *Client) Register(ctx context.Context, name string, kind Kind, opts ...RegisterOption) (*subcv1.Target, error) {
	r := &subcv1.RegisterTargetRequest{Name: name}
	if kind.set != nil {
		kind.set(r)
	}
	for _, o := range opts {
		o(r)
	}
	return unary(c, ctx, 0, c.targets.Register, r)
}

// Targets lists the registered targets with their status.
func (c *Client) Targets(ctx context.Context) ([]*subcv1.Target, error) {
	r, err := unary(c, ctx, 0, c.targets.List, &subcv1.ListTargetsRequest{})
	if err != nil {
		return nil, err
	}
	return r.Targets, nil
}

// RemoveTarget forgets a target; with uninstall, it first removes what subc
// installed on it.
func (c *Client) RemoveTarget(ctx context.Context, name string, uninstall bool) error {
	_, err := unary(c, ctx, 0, c.targets.Remove, &subcv1.RemoveTargetRequest{Name: name, Uninstall: uninstall})
	return err
}

// Deploy brings a target to the current generation and waits until it
// holds it, for at most timeout (0: the server's default, 30 s).
func (c *Client) Deploy(ctx context.Context, name string, timeout time.Duration) (*subcv1.TargetStatus, error) {
	wait := timeout
	if wait == 0 {
		wait = 30 * time.Second
	}
	r, err := unary(c, ctx, wait, c.targets.Deploy, &subcv1.DeployRequest{Name: name, TimeoutMs: uint32(timeout.Milliseconds())})
	if err != nil {
		return nil, err
	}
	return r.Status, nil
}

// Status is a target's state, generations, entries and counters.
func (c *Client) Status(ctx context.Context, name string) (*subcv1.TargetStatus, error) {
	return unary(c, ctx, 0, c.targets.Status, &subcv1.TargetRequest{Name: name})
}

// Plan is the diff a deploy of the target would apply now.
func (c *Client) Plan(ctx context.Context, name string) (*subcv1.PlanResponse, error) {
	return unary(c, ctx, 0, c.targets.Plan, &subcv1.TargetRequest{Name: name})
}

// SetDown marks links and devices down, or up again (network mode).
func (c *Client) SetDown(ctx context.Context, r *subcv1.SetDownRequest) (*subcv1.SetDownResponse, error) {
	return unary(c, ctx, 0, c.targets.SetDown, r)
}

// SetLatency reports measured one-way latencies of links (label mode): routes
// follow, damped, make before break; the reply names the devices changed.
func (c *Client) SetLatency(ctx context.Context, r *subcv1.SetLatencyRequest) (*subcv1.SetLatencyResponse, error) {
	return unary(c, ctx, 0, c.targets.SetLatency, r)
}

// ChangeTopology adds and removes devices, links and endpoints (network mode).
func (c *Client) ChangeTopology(ctx context.Context, r *subcv1.ChangeTopologyRequest) (*subcv1.ChangeTopologyResponse, error) {
	return unary(c, ctx, 0, c.targets.ChangeTopology, r)
}

// Topology is the topology the server runs now (network mode).
func (c *Client) Topology(ctx context.Context) (*subcv1.GetTopologyResponse, error) {
	return unary(c, ctx, 0, c.targets.GetTopology, &subcv1.GetTopologyRequest{})
}

// ---------------------------------------------------------------- events

// WatchOptions selects where a watch starts.
type WatchOptions struct {
	// Stored events first (those after AfterSeq), then new ones.
	Replay bool
	// With Replay: the last event already seen (its Seq); 0 for all.
	AfterSeq uint64
}

// Watch streams events until ctx ends or Close: with Replay, the stored
// ones after AfterSeq first. To resume after an error (an ABORTED watcher
// that fell behind, a new writer), watch again with Replay and AfterSeq
// set to the last Seq seen (Watch.LastSeq).
func (c *Client) Watch(ctx context.Context, o WatchOptions) (*Watch, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.events.Watch(ctx, &subcv1.WatchRequest{Replay: o.Replay, AfterSeq: o.AfterSeq})
	if err != nil {
		cancel()
		return nil, FromError(err)
	}
	return &Watch{stream: stream, cancel: cancel, last: o.AfterSeq}, nil
}

// Watch is a stream of events.
type Watch struct {
	stream grpc.ServerStreamingClient[subcv1.Event]
	cancel context.CancelFunc
	last   uint64
}

// Recv returns the next event. The stream's end is io.EOF; a failure is a
// *Refusal.
func (w *Watch) Recv() (*subcv1.Event, error) {
	e, err := w.stream.Recv()
	if err != nil {
		return nil, FromError(err)
	}
	w.last = e.Seq
	return e, nil
}

// LastSeq is the Seq of the last event received (AfterSeq before any): the
// point to resume from.
func (w *Watch) LastSeq() uint64 { return w.last }

// Close ends the stream.
func (w *Watch) Close() { w.cancel() }
