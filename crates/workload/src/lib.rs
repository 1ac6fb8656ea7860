//! Deterministic workloads for subc's tests and benchmarks: subscription sets
//! (Camus's ITCH shape, Siena/SSBG-style filters), random packets for any
//! spec, and the example pcaps. Same seed, same output, on every machine.

pub mod examples;
pub mod packets;
pub mod programs;
pub mod rng;
pub mod subscriptions;

pub use rng::Rng;
