//! Refused subscription text, as a status's details.
//!
//! A refusal (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED for a limit) carries
//! the standard `google.rpc.Status` in `grpc-status-details-bin`, so any
//! gRPC library's status-details helper can read it: its details hold one
//! `subc.v1.Diagnostics` (the first diagnostics and the total) and one
//! `google.rpc.ErrorInfo` (the first code as `reason`, domain `subc`), for
//! clients that know only the standard detail types.

use crate::proto;
use prost::Message;
use tonic_types::{ErrorInfo, RpcStatusExt};

/// The `type_url` of the `subc.v1.Diagnostics` detail.
pub const DIAGNOSTICS_TYPE_URL: &str = "type.googleapis.com/subc.v1.Diagnostics";
const ERROR_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// The diagnostics a refusal carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Refusal {
    /// The first diagnostics, in order (as many as fit in reply metadata).
    pub diagnostics: Vec<proto::Diagnostic>,
    /// How many the text had in all; `Check` returns every one.
    pub total: u32,
}

impl Refusal {
    /// The diagnostics in a status's details, if it carries any.
    pub fn of(status: &tonic::Status) -> Option<Refusal> {
        let st = tonic_types::Status::decode(status.details()).ok()?;
        let any = st.details.iter().find(|a| a.type_url == DIAGNOSTICS_TYPE_URL)?;
        let d = proto::Diagnostics::decode(any.value.as_slice()).ok()?;
        Some(Refusal { diagnostics: d.diagnostics, total: d.total })
    }

    /// The status a server sends for these diagnostics: `message` as the
    /// status message, and the details described in the module docs.
    pub fn into_status(self, code: tonic::Code, message: String) -> tonic::Status {
        let reason = self.diagnostics.iter().find(|d| d.severity() == proto::Severity::Error).or(self.diagnostics.first());
        let info = ErrorInfo {
            reason: reason.map(|d| d.code.clone()).unwrap_or_default(),
            domain: "subc".into(),
            metadata: [("total".to_string(), self.total.to_string())].into(),
        };
        let details = proto::Diagnostics { diagnostics: self.diagnostics, total: self.total };
        let status = tonic_types::Status {
            code: code as i32,
            message: message.clone(),
            details: vec![
                prost_types::Any { type_url: DIAGNOSTICS_TYPE_URL.into(), value: details.encode_to_vec() },
                prost_types::Any { type_url: ERROR_INFO_TYPE_URL.into(), value: tonic_types::pb::ErrorInfo::from(info).encode_to_vec() },
            ],
        };
        tonic::Status::with_details(code, message, status.encode_to_vec().into())
    }

    /// The standard `ErrorInfo` of a status, as generic clients see it.
    pub fn error_info(status: &tonic::Status) -> Option<ErrorInfo> {
        tonic_types::Status::decode(status.details()).ok()?.get_details_error_info()
    }
}

/// A checked program's diagnostic as the API's message (what `Check`,
/// refusals and `subc check --json` carry). Feature `lang`.
#[cfg(feature = "lang")]
impl From<subc_lang::DiagnosticRecord> for proto::Diagnostic {
    fn from(r: subc_lang::DiagnosticRecord) -> proto::Diagnostic {
        proto::Diagnostic {
            severity: match r.severity {
                subc_lang::Severity::Error => proto::Severity::Error,
                subc_lang::Severity::Warning => proto::Severity::Warning,
            } as i32,
            code: r.code,
            message: r.message,
            file: r.file,
            line: r.line as u32,
            column: r.column as u32,
            end_line: r.end_line as u32,
            end_column: r.end_column as u32,
            snippet: r.snippet,
            label: r.label,
            help: r.help.unwrap_or_default(),
            rendered: r.rendered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_round_trips_through_the_standard_status() {
        let d = proto::Diagnostic { code: "E0302".into(), severity: proto::Severity::Error as i32, line: 3, ..Default::default() };
        let r = Refusal { diagnostics: vec![d], total: 7 };
        let s = r.clone().into_status(tonic::Code::InvalidArgument, "error[E0302] ...".into());
        assert_eq!(Refusal::of(&s), Some(r));
        let info = Refusal::error_info(&s).expect("an ErrorInfo detail");
        assert_eq!((info.reason.as_str(), info.domain.as_str(), info.metadata["total"].as_str()), ("E0302", "subc", "7"));
        // A status without details, or with others, is no refusal.
        assert_eq!(Refusal::of(&tonic::Status::invalid_argument("x")), None);
    }
}
