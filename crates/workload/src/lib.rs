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
pub use packets::{inet_checksum, itch_add_orders, moldudp_add_order, siena_event, udp_packet, write_bits, PacketGen};
pub use rng::{Rng, Zipf};
pub use subscriptions::{itch, itch_symbols, siena, siena_spec, ItchParams, SienaParams};
