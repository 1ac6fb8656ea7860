package subc

import (
	"errors"
	"fmt"
	"io"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/subc-dev/subc/clients/go/subcv1"
)

// Severity is how bad a diagnostic is (subcv1.Severity).
type Severity int32

const (
	// SeverityUnspecified: a severity this client does not know.
	SeverityUnspecified Severity = 0
	// SeverityError: the text is refused.
	SeverityError Severity = 1
	// SeverityWarning: accepted, but probably not what was meant (e.g. W0301).
	SeverityWarning Severity = 2
)

func (s Severity) String() string {
	switch s {
	case SeverityError:
		return "error"
	case SeverityWarning:
		return "warning"
	}
	return "unspecified"
}

// Span is where in the text a diagnostic points: 1-based lines, and
// 1-based columns counted in characters, the end exclusive.
type Span struct {
	Line, Column       int
	EndLine, EndColumn int
}

// Diagnostic is one diagnostic, as `subc check --json` prints it.
type Diagnostic struct {
	Severity Severity
	// A stable code, e.g. "E0302".
	Code    string
	Message string
	// The source name (an Add's SourceName, default `<request>`).
	File string
	Span Span
	// The text the span covers, the primary label, and a suggestion.
	Snippet, Label, Help string
	// The rustc-style text `subc check` prints, code, location and caret included.
	Rendered string
}

// DiagnosticFromProto is the Diagnostic of a subcv1.Diagnostic (in a
// CheckResponse, an AddResponse's warnings, or a refusal's details).
func DiagnosticFromProto(d *subcv1.Diagnostic) Diagnostic {
	sev := Severity(d.GetSeverity())
	if sev != SeverityError && sev != SeverityWarning {
		sev = SeverityUnspecified
	}
	return Diagnostic{
		Severity: sev,
		Code:     d.GetCode(),
		Message:  d.GetMessage(),
		File:     d.GetFile(),
		Span: Span{
			Line: int(d.GetLine()), Column: int(d.GetColumn()),
			EndLine: int(d.GetEndLine()), EndColumn: int(d.GetEndColumn()),
		},
		Snippet:  d.GetSnippet(),
		Label:    d.GetLabel(),
		Help:     d.GetHelp(),
		Rendered: d.GetRendered(),
	}
}

func (d Diagnostic) String() string {
	if d.Rendered != "" {
		return d.Rendered
	}
	return fmt.Sprintf("%s: %s at %s:%d:%d", d.Code, d.Message, d.File, d.Span.Line, d.Span.Column)
}

// ReasonNotWriter is the ErrorInfo reason of a write sent to a standby
// replica (UNAVAILABLE): Metadata["writer"] and Metadata["writer_address"]
// name the replica that writes.
const ReasonNotWriter = "NOT_WRITER"

// Refusal is a failed call: its gRPC status code and message, and what the
// status details (google.rpc.Status in grpc-status-details-bin) carry.
// Client methods return it for every failed call; errors.As finds it.
//
// Refused subscription text (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED for a
// limit) has Diagnostics: the first ones (as many as fit in the reply's
// metadata), Total of them in all (Check returns every one), and Reason
// the first error's code. A write to a standby has Reason NOT_WRITER and
// the writer's address (WriterAddress).
type Refusal struct {
	Code    codes.Code
	Message string
	// The subcv1.Diagnostics detail, decoded.
	Diagnostics []Diagnostic
	Total       int
	// The google.rpc.ErrorInfo detail (domain "subc"), if any.
	Reason   string
	Domain   string
	Metadata map[string]string

	status *status.Status
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("subc: %s: %s", r.Code, r.Message)
}

// GRPCStatus is the status the call failed with, details included
// (status.FromError and status.Code see through a Refusal).
func (r *Refusal) GRPCStatus() *status.Status { return r.status }

// Refused says whether the refusal is about subscription text (it has
// diagnostics).
func (r *Refusal) Refused() bool { return len(r.Diagnostics) > 0 }

// WriterAddress is the address of the replica that writes, when this call
// went to a standby (Reason NOT_WRITER); empty otherwise.
func (r *Refusal) WriterAddress() string {
	if r.Reason != ReasonNotWriter {
		return ""
	}
	return r.Metadata["writer_address"]
}

// FromError is err as a *Refusal when it is a gRPC status (details
// decoded), nil for nil, and err itself otherwise (io.EOF, ...).
func FromError(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	r = &Refusal{Code: st.Code(), Message: st.Message(), status: st}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *subcv1.Diagnostics:
			r.Total = int(d.GetTotal())
			for _, x := range d.GetDiagnostics() {
				r.Diagnostics = append(r.Diagnostics, DiagnosticFromProto(x))
			}
		case *errdetails.ErrorInfo:
			r.Reason, r.Domain, r.Metadata = d.GetReason(), d.GetDomain(), d.GetMetadata()
		}
	}
	return r
}
