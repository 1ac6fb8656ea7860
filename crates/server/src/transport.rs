//! The service's listeners (gRPC and metrics) accept through
//! `subc_listen::GatedListener`: the limits come from `[transport]`, and
//! what the gate counts and closes goes to the metrics
//! (`subc_connections`, `subc_connections_closed_total`).

use crate::config::TransportConfig;
use crate::metrics::Metrics;
use std::time::Duration;
pub(crate) use subc_listen::{raise_descriptor_limit, ConnectionLimits, GatedListener};

/// The configured limits, bounded by the process's descriptor limit.
pub(crate) fn limits(c: &TransportConfig) -> ConnectionLimits {
    ConnectionLimits {
        max_connections: c.max_connections,
        max_per_peer: c.max_connections_per_peer,
        handshake_timeout: Duration::from_millis(c.handshake_timeout_ms),
        nodelay: c.tcp_nodelay,
        keepalive: (c.tcp_keepalive_secs > 0).then(|| Duration::from_secs(c.tcp_keepalive_secs)),
    }
    .within_descriptors()
}

impl subc_listen::Observer for Metrics {
    fn open(&self, listener: &'static str, count: usize) {
        self.connections.get_or_create(&Metrics::label("listener", listener)).set(count as i64);
    }

    fn closed(&self, listener: &'static str, reason: &'static str) {
        self.connections_closed.get_or_create(&Metrics::labels(&[("listener", listener), ("reason", reason)])).inc();
    }
}
