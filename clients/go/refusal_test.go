package subc_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	subc "github.com/subc-dev/subc/clients/go"
	"github.com/subc-dev/subc/clients/go/subcv1"
)

// The details as the server sends them (crates/client/src/refusal.rs),
// decoded without a server.
func TestRefusalDecodesTheStatusDetails(t *testing.T) {
	st, err := status.New(codes.InvalidArgument, "error[E0302]: unknown field `stok` at a.subs:2:1").WithDetails(
		&subcv1.Diagnostics{Total: 3, Diagnostics: []*subcv1.Diagnostic{{
			Severity: subcv1.Severity_SEVERITY_ERROR, Code: "E0302", Message: "unknown field `stok`", File: "a.subs",
			Line: 2, Column: 1, EndLine: 2, EndColumn: 5, Snippet: "stok", Help: "did you mean `stock`?", Rendered: "error[E0302]: ...",
		}}},
		&errdetails.ErrorInfo{Reason: "E0302", Domain: "subc", Metadata: map[string]string{"total": "3"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	wrapped := fmt.Errorf("adding: %w", subc.FromError(st.Err()))
	var r *subc.Refusal
	if !errors.As(wrapped, &r) {
		t.Fatalf("no Refusal in %v", wrapped)
	}
	want := subc.Diagnostic{
		Severity: subc.SeverityError, Code: "E0302", Message: "unknown field `stok`", File: "a.subs",
		Span: subc.Span{Line: 2, Column: 1, EndLine: 2, EndColumn: 5}, Snippet: "stok", Help: "did you mean `stock`?", Rendered: "error[E0302]: ...",
	}
	if r.Code != codes.InvalidArgument || r.Total != 3 || len(r.Diagnostics) != 1 || r.Diagnostics[0] != want || !r.Refused() {
		t.Fatalf("decoded %+v", r)
	}
	if r.Reason != "E0302" || r.Domain != "subc" || r.Metadata["total"] != "3" || r.WriterAddress() != "" {
		t.Fatalf("error info %q %q %v", r.Reason, r.Domain, r.Metadata)
	}
	if status.Code(r) != codes.InvalidArgument || len(r.GRPCStatus().Details()) != 2 {
		t.Fatalf("the status is not kept: %v", r.GRPCStatus())
	}
}

func TestNotWriterNamesTheWriter(t *testing.T) {
	st, _ := status.New(codes.Unavailable, "this replica stands by").WithDetails(&errdetails.ErrorInfo{
		Reason: subc.ReasonNotWriter, Domain: "subc", Metadata: map[string]string{"writer": "b", "writer_address": "10.0.0.2:50051"},
	})
	var r *subc.Refusal
	if !errors.As(subc.FromError(st.Err()), &r) || r.WriterAddress() != "10.0.0.2:50051" || r.Refused() {
		t.Fatalf("decoded %+v", r)
	}
}

func TestFromErrorKeepsOtherErrors(t *testing.T) {
	if subc.FromError(nil) != nil || subc.FromError(io.EOF) != io.EOF {
		t.Fatal("nil and io.EOF pass through")
	}
	var r *subc.Refusal
	if err := subc.FromError(status.Error(codes.NotFound, "no such subscription")); !errors.As(err, &r) || r.Code != codes.NotFound || r.Refused() {
		t.Fatalf("a status without details: %v", err)
	}
}
