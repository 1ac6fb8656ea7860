//! Deterministic workloads for subc's tests and benchmarks: subscription sets
//! (Camus's ITCH shape, Siena/SSBG-style filters), random packets for any
//! spec, the example pcaps, and network topologies (`topologies`). Same seed, same output, on every machine.

#![warn(unreachable_pub)]

mod examples;
mod packets;
pub mod programs;
mod rng;
mod subscriptions;
pub mod topologies;

pub use examples::{example_packets, EXAMPLES};
pub use packets::{broker_frame, itch_add_orders, moldudp_add_order, siena_event, udp_packet, PacketGen};
pub use rng::{Rng, Zipf};
/// Also the front end's, where the simulators use them.
pub use subc_lang::{inet_checksum, write_bits};
pub use subscriptions::{
    itch, itch_stateful_rules, itch_stateful_spec, itch_symbols, siena, siena_selective, siena_spec, ItchParams, SelectiveParams,
    SienaParams,
};
