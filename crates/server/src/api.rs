//! The gRPC handlers: `Subscriptions`, `Targets` and `Events`.
//!
//! Handlers check the caller and the request (limits first, so a refused
//! request changes nothing), check subscription text on a blocking thread,
//! and hand changes to the writer (`core.rs`). Reads (get, list, status)
//! are served from memory, which holds exactly what is committed.

use crate::auth::{principal, Principal};
use crate::check::{self, Rejection};
use crate::core::Core;
use crate::metrics::Metrics;
use crate::proto::{self, events_server::Events, subscriptions_server::Subscriptions, targets_server::Targets};
use crate::writer::WriteOp;
use opentelemetry::KeyValue;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// Largest percent-encoded status message (`grpc-message`).
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;
/// Largest encoded details (`grpc-status-details-bin`, before its base64):
/// with the message and the other headers, reply metadata stays under
/// 8 KiB, the smallest limit of common clients (grpcio's default).
const MAX_DETAILS_BYTES: usize = 4608;
/// What of a diagnostic's text is kept when the whole does not fit.
const TRIMMED_TEXT_BYTES: usize = 512;

#[derive(Clone)]
pub struct Api {
    pub core: Arc<Core>,
}

/// The length of `s` percent-encoded as gRPC encodes a status message.
fn encoded_len(s: &str) -> usize {
    s.bytes().map(|b| if (0x20..=0x7e).contains(&b) && b != b'%' { 1 } else { 3 }).sum()
}

/// `s` cut, at a character boundary, to at most `max` encoded bytes.
pub(crate) fn cut_encoded(s: &str, max: usize) -> String {
    let mut out = String::new();
    let mut n = 0;
    for c in s.chars() {
        let mut buf = [0u8; 4];
        let w = encoded_len(c.encode_utf8(&mut buf));
        if n + w > max.saturating_sub(3) {
            out.push_str("...");
            break;
        }
        n += w;
        out.push(c);
    }
    out
}

fn cut_bytes(s: &mut String, max: usize) {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push('…');
    }
}

/// As many of `diagnostics` as fit [`MAX_DETAILS_BYTES`], in order; one
/// whose text is too long for what is left goes in with its text cut.
fn fit_details(diagnostics: Vec<proto::Diagnostic>, total: usize) -> proto::Diagnostics {
    let mut out = proto::Diagnostics { diagnostics: vec![], total: total as u32 };
    for mut d in diagnostics {
        if out.encoded_len() + d.encoded_len() + 8 > MAX_DETAILS_BYTES {
            for text in [&mut d.rendered, &mut d.snippet, &mut d.message, &mut d.label, &mut d.help, &mut d.file] {
                cut_bytes(text, TRIMMED_TEXT_BYTES);
            }
            if out.encoded_len() + d.encoded_len() + 8 > MAX_DETAILS_BYTES {
                break;
            }
        }
        out.diagnostics.push(d);
    }
    out
}

/// A status refusing subscription text: a one-line summary as the message,
/// and a `google.rpc.Status` with a `subc.v1.Diagnostics` (the first
/// diagnostics and the total) in the details; together well under 8 KiB.
/// `Check` returns everything.
pub(crate) fn rejection_status(r: Rejection) -> Status {
    let code = if r.only_limits { tonic::Code::ResourceExhausted } else { tonic::Code::InvalidArgument };
    let message = cut_encoded(&r.summary(), MAX_MESSAGE_BYTES);
    let details = fit_details(r.diagnostics, r.total);
    subc_client::Refusal { diagnostics: details.diagnostics, total: details.total }.into_status(code, message)
}

impl Api {
    /// A write's reply; with etcd, metadata `subc-revision` says a revision
    /// it was committed at or before (a standby that reports that revision
    /// or a later one holds it: `standby.rs`).
    fn committed<T>(&self, value: T) -> Response<T> {
        let mut r = Response::new(value);
        if let Some(revision) = self.core.store_revision() {
            r.metadata_mut().insert("subc-revision", revision.into());
        }
        r
    }

    fn limit(&self, which: &str, message: String) -> Status {
        self.core.metrics().limit_refusals.get_or_create(&Metrics::label("limit", which)).inc();
        Status::resource_exhausted(message)
    }

    /// Checks an Add request's size limits and shape.
    fn check_add_limits(&self, req: &proto::AddRequest) -> Result<(), Status> {
        let l = &self.core.config().limits;
        let size = req.encoded_len();
        if size > l.max_request_bytes {
            return Err(self.limit("request_bytes", format!("the request has {size} bytes, over the limit of {}", l.max_request_bytes)));
        }
        if req.lines.len() > l.max_lines_per_request {
            return Err(self.limit(
                "lines_per_request",
                format!("the request has {} lines, over the limit of {}", req.lines.len(), l.max_lines_per_request),
            ));
        }
        if let Some((i, line)) = req.lines.iter().enumerate().find(|(_, x)| x.len() > l.max_line_bytes) {
            return Err(
                self.limit("line_bytes", format!("line {} has {} bytes, over the limit of {}", i + 1, line.len(), l.max_line_bytes))
            );
        }
        if let Some(i) = req.lines.iter().position(|x| x.contains(['\n', '\r'])) {
            return Err(Status::invalid_argument(format!(
                "line {} contains a line break: send one subscription per element of `lines`",
                i + 1
            )));
        }
        if req.request_id.len() > 128 || req.source_name.len() > 256 {
            return Err(Status::invalid_argument("request_id is limited to 128 bytes and source_name to 256"));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl Subscriptions for Api {
    async fn add(&self, request: Request<proto::AddRequest>) -> Result<Response<proto::AddResponse>, Status> {
        let who = principal(&request)?;
        let trace = request.extensions().get::<crate::otel::Trace>().cloned().unwrap_or_default();
        let req = request.into_inner();
        self.check_add_limits(&req)?;
        let fingerprint = crate::writer::request_fingerprint(&req.source_name, &req.lines);
        let proto::AddRequest { lines, source_name, request_id, validate_only } = req;
        let checked_in = self.core.fabric();
        let mut span = self.core.tracer().child(&trace, "check", vec![KeyValue::new("subc.lines", lines.len() as i64)]);
        let checked = self.check(&who, checked_in.clone(), source_name, lines).await;
        match &checked {
            Ok(Ok(b)) => span.set(KeyValue::new("subc.rules", b.rules.len() as i64)),
            Ok(Err(_)) => span.fail("the text has errors"),
            Err(s) => span.fail(s.message()),
        }
        drop(span);
        let batch = match checked? {
            Ok(b) => b,
            Err(r) => {
                if r.only_limits {
                    self.core.metrics().limit_refusals.get_or_create(&Metrics::label("limit", "normal_form")).inc();
                }
                return Err(rejection_status(r));
            }
        };
        if batch.rules.is_empty() {
            return Err(Status::invalid_argument("the request holds no subscription (only blank lines or comments)"));
        }
        let resp = self
            .core
            .submit(|reply| {
                let op = WriteOp::Add { who, batch, checked_in, request_id, fingerprint, spent: Duration::ZERO, reply, trace };
                if validate_only {
                    WriteOp::DryRun(Box::new(op))
                } else {
                    op
                }
            })
            .await?;
        Ok(if validate_only { Response::new(resp) } else { self.committed(resp) })
    }

    async fn remove(&self, request: Request<proto::RemoveRequest>) -> Result<Response<proto::RemoveResponse>, Status> {
        let who = principal(&request)?;
        let trace = request.extensions().get::<crate::otel::Trace>().cloned().unwrap_or_default();
        let req = request.into_inner();
        let max = self.core.config().limits.max_lines_per_request;
        if req.ids.len() > max {
            return Err(self.limit("lines_per_request", format!("{} ids, over the limit of {max}", req.ids.len())));
        }
        let (app, ids, validate_only) = (addressed_app(&who, &req.app)?, req.ids, req.validate_only);
        let resp = self
            .core
            .submit(|reply| {
                let op = WriteOp::Remove { who, app, ids, reply, trace };
                if validate_only {
                    WriteOp::DryRun(Box::new(op))
                } else {
                    op
                }
            })
            .await?;
        Ok(if validate_only { Response::new(resp) } else { self.committed(resp) })
    }

    async fn get(&self, request: Request<proto::GetRequest>) -> Result<Response<proto::Subscription>, Status> {
        let who = principal(&request)?;
        let req = request.into_inner();
        let app = addressed_app(&who, &req.app)?;
        Ok(Response::new(self.core.subscription(&who, &app, req.id)?))
    }

    async fn list(&self, request: Request<proto::ListRequest>) -> Result<Response<proto::ListResponse>, Status> {
        let who = principal(&request)?;
        let req = request.into_inner();
        let (app_filter, after, size) = list_query(&who, &req)?;
        Ok(Response::new(self.core.list(&who, app_filter.as_deref(), &after, size)))
    }

    async fn check(&self, request: Request<proto::AddRequest>) -> Result<Response<proto::CheckResponse>, Status> {
        let who = principal(&request)?;
        let req = request.into_inner();
        self.check_add_limits(&req)?;
        let (spec, fabric, max_cubes) = (self.core.spec().clone(), self.core.fabric(), self.core.config().limits.max_cubes);
        let app = who.app.clone();
        let report = self
            .core
            .text_gate()
            .run(&who.app, move |stop| {
                check::check_report(&spec, fabric.as_ref().map(|f| f.endpoints_for(&app)), &req.source_name, &req.lines, max_cubes, stop)
            })
            .await?;
        Ok(Response::new(report))
    }
}

impl Api {
    /// Checks a request's text on a blocking thread, admitted by the text
    /// gate (`admission.rs`).
    async fn check(
        &self,
        who: &Principal,
        fabric: Option<Arc<crate::network::Fabric>>,
        source_name: String,
        lines: Vec<String>,
    ) -> Result<Result<check::CheckedBatch, Rejection>, Status> {
        let (spec, max_cubes) = (self.core.spec().clone(), self.core.config().limits.max_cubes);
        let app = who.app.clone();
        self.core
            .text_gate()
            .run(&who.app, move |stop| {
                check::check_lines_until(&spec, fabric.as_ref().map(|f| f.endpoints_for(&app)), &source_name, &lines, max_cubes, stop)
            })
            .await
    }
}

/// What a List asks for: the application (`None`: all, the
/// administrator's), where the page starts, and its size.
#[allow(clippy::result_large_err)]
pub(crate) fn list_query(who: &Principal, req: &proto::ListRequest) -> Result<(Option<String>, crate::desired::ListCursor, usize), Status> {
    let size = match req.page_size {
        0 => 100,
        n => n.min(1000),
    } as usize;
    let app_filter: Option<String> = if who.admin {
        (!req.app.is_empty()).then(|| req.app.clone())
    } else if !req.app.is_empty() && req.app != *who.app {
        return Err(Status::permission_denied("an application can list only its own subscriptions"));
    } else {
        Some(who.app.to_string())
    };
    let after = crate::core::parse_page_token(&req.page_token, app_filter.is_none())
        .ok_or_else(|| Status::invalid_argument("page_token is not one this server gave"))?;
    Ok((app_filter, after, size))
}

/// The application a Get or Remove addresses: the caller's own when
/// `app` is empty; another only for the administrator (an application
/// naming another is refused, not told whether it exists).
#[allow(clippy::result_large_err)]
pub(crate) fn addressed_app(who: &Principal, app: &str) -> Result<Arc<str>, Status> {
    if app.is_empty() || *app == *who.app {
        Ok(who.app.clone())
    } else if who.admin {
        crate::names::check_name("app", app).map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Arc::from(app))
    } else {
        Err(Status::permission_denied("an application can address only its own subscriptions"))
    }
}

fn target_proto(core: &Core, h: &crate::deploy::TargetHandle) -> proto::Target {
    use proto::register_target_request::Kind as R;
    use proto::target::Kind as T;
    let kind = h.registration.kind.clone().map(|k| match k {
        R::Ebpf(e) => T::Ebpf(e),
        R::P4runtime(mut p) => {
            // The P4Info and device config can be megabytes: the list shows their sizes in the status instead.
            p.p4info.clear();
            p.device_config.clear();
            T::P4runtime(p)
        }
        R::Sim(s) => T::Sim(s),
        R::Custom(c) => T::Custom(c),
        R::Agent(a) => T::Agent(a),
    });
    proto::Target { name: h.name.clone(), kind, manual: h.manual(), status: Some(h.status(core.generation())) }
}

#[tonic::async_trait]
impl Targets for Api {
    async fn register(&self, request: Request<proto::RegisterTargetRequest>) -> Result<Response<proto::Target>, Status> {
        principal(&request)?.require_admin()?;
        let reg = request.into_inner();
        if let Some(f) = self.core.fabric() {
            let devices: Vec<&str> = f.topology.devices.iter().map(|d| d.name.as_str()).collect();
            return Err(match f.device(&reg.name) {
                Some(_) => Status::already_exists(format!("{:?} is a device of the topology, registered at startup", reg.name)),
                None => Status::failed_precondition(format!(
                    "in network mode the targets are the topology's devices ({}), registered at startup; {:?} is not one",
                    devices.join(", "),
                    reg.name
                )),
            });
        }
        crate::deploy::validate_registration(&reg, self.core.kinds()).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if let Some(proto::register_target_request::Kind::P4runtime(p)) = &reg.kind {
            crate::deploy::p4::check_receivers(p, self.core.spec().ports).map_err(|e| Status::invalid_argument(e.to_string()))?;
        }
        let h = self.core.submit(|reply| WriteOp::Register { reg, reply }).await?;
        Ok(Response::new(target_proto(&self.core, &h)))
    }

    async fn list(&self, request: Request<proto::ListTargetsRequest>) -> Result<Response<proto::ListTargetsResponse>, Status> {
        principal(&request)?.require_admin()?;
        let hs = self.core.targets();
        Ok(Response::new(proto::ListTargetsResponse { targets: hs.iter().map(|h| target_proto(&self.core, h)).collect() }))
    }

    async fn remove(&self, request: Request<proto::RemoveTargetRequest>) -> Result<Response<proto::RemoveTargetResponse>, Status> {
        principal(&request)?.require_admin()?;
        let req = request.into_inner();
        let h = self.core.target(&req.name)?;
        if h.view.is_some() {
            return Err(Status::failed_precondition(format!(
                "{:?} is a device of the topology: it stays a target while the server runs in network mode",
                req.name
            )));
        }
        if req.uninstall {
            h.stop();
            h.uninstall(self.core.deploy_ctx())
                .await
                .map_err(|e| Status::failed_precondition(format!("uninstalling failed, the target stays registered: {e}")))?;
        }
        let name = req.name;
        self.core.submit(|reply| WriteOp::Unregister { name, reply }).await?;
        Ok(Response::new(proto::RemoveTargetResponse {}))
    }

    async fn deploy(&self, request: Request<proto::DeployRequest>) -> Result<Response<proto::DeployResponse>, Status> {
        principal(&request)?.require_admin()?;
        let req = request.into_inner();
        let h = self.core.target(&req.name)?;
        let timeout = Duration::from_millis(if req.timeout_ms == 0 { 30_000 } else { req.timeout_ms as u64 });
        let goal = self.core.generation();
        let mut rx = h.subscribe();
        let attempts = rx.borrow().attempts;
        h.request(goal);
        let wait = async {
            loop {
                {
                    let p = rx.borrow_and_update();
                    if p.attempts > attempts {
                        if p.status.deployed_generation >= goal && p.status.consecutive_failures == 0 {
                            return Ok(());
                        }
                        if p.status.consecutive_failures > 0 {
                            return Err(Status::unavailable(format!(
                                "deploying to {:?} failed (retrying with backoff): {}",
                                h.name, p.status.last_error
                            )));
                        }
                    }
                }
                if rx.changed().await.is_err() {
                    return Err(Status::aborted("the target was removed"));
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(())) => Ok(Response::new(proto::DeployResponse { status: Some(h.status(self.core.generation())) })),
            Ok(Err(s)) => Err(s),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "{:?} did not reach generation {goal} within {} ms; it keeps trying",
                h.name,
                timeout.as_millis()
            ))),
        }
    }

    async fn status(&self, request: Request<proto::TargetRequest>) -> Result<Response<proto::TargetStatus>, Status> {
        principal(&request)?.require_admin()?;
        let h = self.core.target(&request.into_inner().name)?;
        let mut status = h.status(self.core.generation());
        let deadline = Duration::from_millis(self.core.config().deploy.counter_timeout_ms);
        status.port_counters = h.read_port_counters(self.core.metrics(), deadline).await;
        Ok(Response::new(status))
    }

    async fn plan(&self, request: Request<proto::TargetRequest>) -> Result<Response<proto::PlanResponse>, Status> {
        principal(&request)?.require_admin()?;
        let h = self.core.target(&request.into_inner().name)?;
        let p = h
            .plan(self.core.deploy_ctx(), self.core.config().deploy.plan_max_ops)
            .await
            .map_err(|e| Status::unavailable(format!("cannot read the target: {e}")))?;
        Ok(Response::new(p))
    }

    async fn set_down(&self, request: Request<proto::SetDownRequest>) -> Result<Response<proto::SetDownResponse>, Status> {
        principal(&request)?.require_admin()?;
        let req = request.into_inner();
        let Some(f) = self.core.fabric() else {
            return Err(Status::failed_precondition("the server runs without a topology: there is nothing to mark down"));
        };
        let links = req.links.iter().map(|l| f.link(l)).collect::<Result<_, _>>().map_err(Status::invalid_argument)?;
        let devices = req
            .devices
            .iter()
            .map(|d| f.device(d).ok_or_else(|| format!("the topology has no device named {d:?}")))
            .collect::<Result<_, _>>()
            .map_err(Status::invalid_argument)?;
        let down = req.down;
        let mut resp = self.core.submit(|reply| WriteOp::SetDown { links, devices, down, resolved_in: f, reply }).await?;
        if let (Some(plane), Some((_, down))) = (self.core.label_plane(), self.core.network()) {
            // Label mode: the devices' rules stay; their label tables move.
            resp.changed = plane.rerouted(&self.core, &down, &self.core.latency()).await?.changed;
        }
        Ok(Response::new(resp))
    }

    async fn set_latency(&self, request: Request<proto::SetLatencyRequest>) -> Result<Response<proto::SetLatencyResponse>, Status> {
        principal(&request)?.require_admin()?;
        let req = request.into_inner();
        let Some(f) = self.core.fabric() else {
            return Err(Status::failed_precondition("the server runs without a topology: there are no links to measure"));
        };
        let mut measured = vec![];
        for l in &req.links {
            let link = f.link(&l.link).map_err(Status::invalid_argument)?;
            if !crate::labels::valid_latency(l.latency_us) {
                let (lo, hi) = subc_fabric::LATENCY_US;
                return Err(Status::invalid_argument(format!(
                    "link {:?}: a latency of {} µs is not between {lo} and {hi} µs",
                    l.link, l.latency_us
                )));
            }
            measured.push((link, l.latency_us));
        }
        self.core.submit(|reply| WriteOp::SetLatency { measured, resolved_in: f, reply }).await?;
        let plane = self.core.label_plane().ok_or_else(|| Status::internal("label mode without a label plane"))?;
        let down = self.core.network().map(|(_, d)| d).unwrap_or_default();
        let moved = plane.weighted(&self.core, &down, &self.core.latency()).await?;
        Ok(Response::new(proto::SetLatencyResponse { changed: moved.changed, moved: moved.moved, weights_us: moved.weights_us }))
    }

    async fn change_topology(
        &self,
        request: Request<proto::ChangeTopologyRequest>,
    ) -> Result<Response<proto::ChangeTopologyResponse>, Status> {
        principal(&request)?.require_admin()?;
        let req = request.into_inner();
        let change = subc_fabric::TopologyChange {
            add: req.add,
            remove_devices: req.remove_devices,
            remove_links: req.remove_links,
            remove_endpoints: req.remove_endpoints,
        };
        let dry_run = req.dry_run;
        Ok(Response::new(self.core.submit(|reply| WriteOp::ChangeTopology { change: Box::new(change), dry_run, reply }).await?))
    }

    async fn get_topology(&self, request: Request<proto::GetTopologyRequest>) -> Result<Response<proto::GetTopologyResponse>, Status> {
        principal(&request)?.require_admin()?;
        let Some((f, down)) = self.core.network() else {
            return Err(Status::failed_precondition("the server runs without a topology"));
        };
        let (links_down, devices_down) = f.describe_down(&down);
        Ok(Response::new(proto::GetTopologyResponse { topology: f.topology.to_toml(), links_down, devices_down }))
    }
}

#[tonic::async_trait]
impl Events for Api {
    type WatchStream = crate::watch::EventStream;

    async fn watch(&self, request: Request<proto::WatchRequest>) -> Result<Response<crate::watch::EventStream>, Status> {
        let who = principal(&request)?;
        let req = request.into_inner();
        let slot = self.core.claim_watcher(&who).map_err(|e| self.limit(e.label(), e.to_string()))?;
        Ok(Response::new(crate::watch::start(self.core.clone(), who, req, slot)))
    }
}
