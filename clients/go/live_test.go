package subc_test

// The client against a live `subc serve` (the ITCH example's spec):
// crates/server/tests/go_client.rs starts a plaintext server and an mTLS
// one in-process and runs `go test` with
//
//	SUBC_TARGET, SUBC_TOKEN, SUBC_ADMIN_TOKEN   the plaintext server, an application's and the administrator's tokens
//	SUBC_TLS_TARGET, SUBC_CERTS                 the mTLS server, and the directory of its ca.pem, client.pem and client.key
//	SUBC_LIVE=required                          fail, rather than skip, without them
//
// Without them the live tests skip.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	subc "github.com/subc-dev/subc/clients/go"
	"github.com/subc-dev/subc/clients/go/subcv1"
)

type live struct {
	target, token, adminToken string
	tlsTarget, certs          string
}

func server(t *testing.T) live {
	t.Helper()
	s := live{
		target: os.Getenv("SUBC_TARGET"), token: os.Getenv("SUBC_TOKEN"), adminToken: os.Getenv("SUBC_ADMIN_TOKEN"),
		tlsTarget: os.Getenv("SUBC_TLS_TARGET"), certs: os.Getenv("SUBC_CERTS"),
	}
	if s.target == "" || s.token == "" || s.adminToken == "" {
		if os.Getenv("SUBC_LIVE") == "required" {
			t.Fatal("SUBC_LIVE=required: SUBC_TARGET, SUBC_TOKEN and SUBC_ADMIN_TOKEN must name a live server")
		}
		t.Skip("no live server (SUBC_TARGET, SUBC_TOKEN, SUBC_ADMIN_TOKEN)")
	}
	return s
}

func context60(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, addr string, opts ...subc.Option) *subc.Client {
	t.Helper()
	c, err := subc.Dial(context.Background(), addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// must(f())(t) is f's value; the test fails with f's error.
func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ids(subs []*subcv1.Subscription) []uint64 {
	out := make([]uint64, len(subs))
	for i, s := range subs {
		out[i] = s.Id
	}
	return out
}

// refusal is err's *Refusal with code; the test fails otherwise.
func refusal(t *testing.T, err error, code codes.Code) *subc.Refusal {
	t.Helper()
	var r *subc.Refusal
	if !errors.As(err, &r) {
		t.Fatalf("want a *subc.Refusal (%s), got %v", code, err)
	}
	if r.Code != code || status.Code(err) != code {
		t.Fatalf("want %s, got %v", code, r)
	}
	return r
}

// next is the next event of kind on w.
func next(t *testing.T, w *subc.Watch, kind subcv1.EventKind) *subcv1.Event {
	t.Helper()
	for {
		e := must(w.Recv())(t)
		if e.Kind == kind {
			return e
		}
	}
}

func TestAddListWatchResumeRemove(t *testing.T) {
	s := server(t)
	ctx := context60(t)
	c := dial(t, s.target, subc.WithToken(s.token))

	// A dry run adds nothing: its subscriptions have id 0.
	dry := must(c.Add(ctx, []string{"stock == DRY : fwd(1)"}, subc.DryRun()))(t)
	if !dry.ValidatedOnly || len(dry.Subscriptions) != 1 || dry.Subscriptions[0].Id != 0 {
		t.Fatalf("dry run %v", dry)
	}
	first := must(c.Add(ctx, []string{"stock == GOOGL && price > 100 : fwd(1)", "", "# a comment", "stock == MSFT : fwd(2)"}))(t)
	if !slices.Equal(first.Lines, []uint32{1, 4}) || first.Subscriptions[1].Text != "stock == MSFT : fwd(2)" {
		t.Fatalf("added %v", first)
	}
	if first.Subscriptions[0].CreateTime.AsTime().Before(time.Now().Add(-time.Hour)) {
		t.Fatalf("create time %v", first.Subscriptions[0].CreateTime)
	}

	// Stored events first, then live ones: both adds are seen either way.
	w := must(c.Watch(ctx, subc.WatchOptions{Replay: true}))(t)
	second := must(c.Add(ctx, []string{"stock == AAPL : fwd(3)"}))(t)
	all := append(ids(first.Subscriptions), ids(second.Subscriptions)...)
	var added [][]uint64
	for len(added) < 2 {
		e := next(t, w, subcv1.EventKind_EVENT_KIND_SUBSCRIPTIONS_ADDED)
		if slices.ContainsFunc(e.SubscriptionIds, func(id uint64) bool { return slices.Contains(all, id) }) {
			added = append(added, e.SubscriptionIds)
		}
	}
	if !slices.Equal(added[0], ids(first.Subscriptions)) || !slices.Equal(added[1], ids(second.Subscriptions)) {
		t.Fatalf("added events %v", added)
	}
	seen := w.LastSeq()
	w.Close()

	// Paging: pages of 2, each continuing from the last one's token.
	page := must(c.ListPage(ctx, subc.ListOptions{PageSize: 2}))(t)
	if len(page.Subscriptions) != 2 || page.NextPageToken == "" || page.Total < 3 {
		t.Fatalf("first page %v", page)
	}
	listed := must(c.ListAll(ctx, subc.ListOptions{PageSize: 2}))(t)
	if uint64(len(listed)) != page.Total {
		t.Fatalf("listed %d of %d", len(listed), page.Total)
	}
	for _, id := range all {
		if !slices.Contains(ids(listed), id) {
			t.Fatalf("%d not listed in %v", id, ids(listed))
		}
	}
	rest := must(c.ListPage(ctx, subc.ListOptions{PageSize: 1000, PageToken: page.NextPageToken}))(t)
	if got := append(ids(page.Subscriptions), ids(rest.Subscriptions)...); !slices.Equal(got, ids(listed)) || rest.NextPageToken != "" {
		t.Fatalf("page and rest %v, all %v", got, ids(listed))
	}

	got := must(c.Get(ctx, second.Subscriptions[0].Id))(t)
	if got.Text != "stock == AAPL : fwd(3)" || got.App == "" {
		t.Fatalf("got %v", got)
	}

	removed := must(c.Remove(ctx, all))(t)
	if removed.Generation <= second.Generation {
		t.Fatalf("removal's generation %d after %d", removed.Generation, second.Generation)
	}
	// Resumed after the last event seen: the removal is the very next one.
	w = must(c.Watch(ctx, subc.WatchOptions{Replay: true, AfterSeq: seen}))(t)
	defer w.Close()
	e := must(w.Recv())(t)
	if e.Seq != seen+1 || e.Kind != subcv1.EventKind_EVENT_KIND_SUBSCRIPTIONS_REMOVED || !slices.Equal(slices.Sorted(slices.Values(e.SubscriptionIds)), all) {
		t.Fatalf("after %d: %v", seen, e)
	}
	left := must(c.ListAll(ctx, subc.ListOptions{}))(t)
	if slices.ContainsFunc(ids(left), func(id uint64) bool { return slices.Contains(all, id) }) {
		t.Fatalf("still listed: %v", ids(left))
	}
}

func TestRefusedLineHasDiagnostics(t *testing.T) {
	s := server(t)
	ctx := context60(t)
	c := dial(t, s.target, subc.WithToken(s.token))
	before := ids(must(c.ListAll(ctx, subc.ListOptions{}))(t))

	_, err := c.Add(ctx, []string{"stock == GOOGL : fwd(1)", "stok == GOOGL : fwd(2)"}, subc.SourceName("mine.subs"))
	r := refusal(t, err, codes.InvalidArgument)
	if !r.Refused() || r.Total != 1 || r.Reason != "E0302" || r.Domain != "subc" || !strings.Contains(r.Message, "E0302") {
		t.Fatalf("refusal %+v", r)
	}
	d := r.Diagnostics[0]
	want := subc.Diagnostic{
		Severity: subc.SeverityError, Code: "E0302", File: "mine.subs",
		Span: subc.Span{Line: 2, Column: 1, EndLine: 2, EndColumn: 5}, Snippet: "stok",
	}
	if d.Severity != want.Severity || d.Code != want.Code || d.File != want.File || d.Span != want.Span || d.Snippet != want.Snippet {
		t.Fatalf("diagnostic %+v", d)
	}
	if !strings.Contains(d.Rendered, "mine.subs:2:1") || !strings.Contains(d.String(), "E0302") {
		t.Fatalf("rendered %q", d.Rendered)
	}
	// Atomic: the valid first line was not added either.
	if after := ids(must(c.ListAll(ctx, subc.ListOptions{}))(t)); !slices.Equal(after, before) {
		t.Fatalf("listed %v, before %v", after, before)
	}
}

func TestCheckReturnsEveryDiagnostic(t *testing.T) {
	s := server(t)
	ctx := context60(t)
	c := dial(t, s.target, subc.WithToken(s.token))
	var lines []string
	for i := range 3 {
		lines = append(lines, fmt.Sprintf("nosuchfield%d == 1 : fwd(1)", i))
	}
	r := must(c.Check(ctx, lines))(t)
	if r.Ok || r.Total != 3 || len(r.Diagnostics) != 3 {
		t.Fatalf("check %v", r)
	}
	for i, d := range r.Diagnostics {
		if got := subc.DiagnosticFromProto(d); got.Code != "E0302" || got.Span.Line != i+1 {
			t.Fatalf("diagnostic %d: %+v", i, got)
		}
	}
	if !must(c.Check(ctx, []string{"stock == GOOGL : fwd(1)"}))(t).Ok {
		t.Fatal("a valid line is not ok")
	}
}

func TestOtherRefusals(t *testing.T) {
	s := server(t)
	ctx := context60(t)
	c := dial(t, s.target, subc.WithToken(s.token))
	_, err := c.Get(ctx, 1<<60)
	if r := refusal(t, err, codes.NotFound); r.Refused() {
		t.Fatalf("a missing subscription has diagnostics: %+v", r)
	}
	stranger := dial(t, s.target, subc.WithToken("not-a-token"))
	_, err = stranger.ListPage(ctx, subc.ListOptions{})
	refusal(t, err, codes.Unauthenticated)
	// Targets belong to the administrator.
	_, err = c.Targets(ctx)
	refusal(t, err, codes.PermissionDenied)
}

func TestRequestIDMakesARetrySafe(t *testing.T) {
	s := server(t)
	ctx := context60(t)
	c := dial(t, s.target, subc.WithToken(s.token))
	key := fmt.Sprintf("go-%d", time.Now().UnixNano())
	first := must(c.Add(ctx, []string{"stock == IBM : fwd(4)"}, subc.RequestID(key)))(t)
	again := must(c.Add(ctx, []string{"stock == IBM : fwd(4)"}, subc.RequestID(key)))(t)
	if !again.Replayed || !slices.Equal(ids(again.Subscriptions), ids(first.Subscriptions)) {
		t.Fatalf("again %v", again)
	}
	must(c.Remove(ctx, ids(first.Subscriptions)))(t)
}

func TestTargets(t *testing.T) {
	s := server(t)
	ctx := context60(t)
	c := dial(t, s.target, subc.WithToken(s.token))
	admin := dial(t, s.target, subc.WithToken(s.adminToken))
	added := must(c.Add(ctx, []string{"stock == NVDA : fwd(5)"}))(t)

	name := fmt.Sprintf("go-%d", time.Now().UnixNano()%1e9)
	target := must(admin.Register(ctx, name, subc.Sim("")))(t)
	if target.Name != name || target.GetSim() == nil {
		t.Fatalf("registered %v", target)
	}
	names := func() []string {
		var out []string
		for _, tg := range must(admin.Targets(ctx))(t) {
			out = append(out, tg.Name)
		}
		return out
	}
	if !slices.Contains(names(), name) {
		t.Fatalf("%s not in %v", name, names())
	}
	plan := must(admin.Plan(ctx, name))(t)
	if !plan.FullInstall || plan.Inserts == 0 || len(plan.Ops) == 0 {
		t.Fatalf("plan %v", plan)
	}
	st := must(admin.Deploy(ctx, name, 30*time.Second))(t)
	if st.State != subcv1.TargetState_TARGET_STATE_IN_SYNC || st.DeployedGeneration < added.Generation || st.LastDeployTime == nil {
		t.Fatalf("deployed %v", st)
	}
	if now := must(admin.Status(ctx, name))(t); now.Entries != st.Entries || now.Entries == 0 {
		t.Fatalf("status %v after %v", now, st)
	}
	if err := admin.RemoveTarget(ctx, name, false); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names(), name) {
		t.Fatalf("%s still in %v", name, names())
	}
	must(c.Remove(ctx, ids(added.Subscriptions)))(t)
}

func TestMutualTLS(t *testing.T) {
	s := server(t)
	if s.tlsTarget == "" || s.certs == "" {
		if os.Getenv("SUBC_LIVE") == "required" {
			t.Fatal("SUBC_LIVE=required: SUBC_TLS_TARGET and SUBC_CERTS must name an mTLS server")
		}
		t.Skip("no mTLS server (SUBC_TLS_TARGET, SUBC_CERTS)")
	}
	ctx := context60(t)
	pem := func(name string) []byte { return must(os.ReadFile(filepath.Join(s.certs, name)))(t) }

	c := dial(t, s.tlsTarget, subc.WithToken(s.token), subc.WithCA(pem("ca.pem")),
		subc.WithClientCert(pem("client.pem"), pem("client.key")), subc.WithServerName("localhost"), subc.WithBlock())
	added := must(c.Add(ctx, []string{"stock == TSLA : fwd(6)"}))(t)
	if !slices.Contains(ids(must(c.ListAll(ctx, subc.ListOptions{}))(t)), added.Subscriptions[0].Id) {
		t.Fatal("not listed over TLS")
	}
	must(c.Remove(ctx, ids(added.Subscriptions)))(t)

	// Without a client certificate the handshake fails.
	bare := dial(t, s.tlsTarget, subc.WithToken(s.token), subc.WithCA(pem("ca.pem")), subc.WithServerName("localhost"))
	_, err := bare.ListPage(ctx, subc.ListOptions{})
	refusal(t, err, codes.Unavailable)
	// Nor does a server verified against the system's roots pass.
	system := dial(t, "https://"+s.tlsTarget, subc.WithToken(s.token), subc.WithClientCert(pem("client.pem"), pem("client.key")))
	_, err = system.ListPage(ctx, subc.ListOptions{})
	refusal(t, err, codes.Unavailable)
}
