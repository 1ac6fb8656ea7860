//! Kinds of targets beyond the built-in ones, as the service is given them.

use crate::{Capabilities, Error, Target};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use subc_lang::spec::Spec;

/// A custom target's options, as its registration gives them (strings, for
/// the kind to parse).
pub type Options = BTreeMap<String, String>;

/// What opening a target is given.
pub struct Opening<'a> {
    /// The target's name: an identifier the service has checked.
    pub name: &'a str,
    pub options: &'a Options,
    pub spec: &'a Arc<Spec>,
    /// A directory that is this target's alone, created by the service: for
    /// what it keeps on disk.
    pub dir: &'a Path,
    /// A device of a network (the service's network mode): it never sends a
    /// packet back out of the port it came in on.
    pub in_network: bool,
}

/// A kind of target: checks registrations and opens targets.
pub trait Kind: Send + Sync {
    /// Checks a registration's options without reaching the target: the
    /// first problem, in words, refuses the registration.
    fn check(&self, options: &Options) -> Result<(), String>;
    /// Opens a target. Reaching the device may wait for the first call.
    fn open(&self, at: &Opening<'_>) -> Result<Box<dyn Target>, Error>;
    /// What a target of these options can hold, as far as is known without
    /// reaching it: a set that targets of this kind follow is lowered to
    /// diagrams when they run no bit-vector group. [`Target::capabilities`]
    /// is what every write is checked against.
    fn capabilities(&self, _options: &Options) -> Capabilities {
        Capabilities::default()
    }
}

/// The names built in to the service, which no custom kind may take.
const BUILT_IN: [&str; 4] = ["ebpf", "p4runtime", "sim", "agent"];

/// The custom kinds a service knows, by name.
#[derive(Clone, Default)]
pub struct Kinds(BTreeMap<String, Arc<dyn Kind>>);

impl Kinds {
    pub fn new() -> Kinds {
        Kinds::default()
    }

    /// Adds `kind` as `name`.
    ///
    /// # Panics
    /// If `name` is built in, taken, or not 1 to 64 of `[a-z0-9_-]`: a
    /// mistake in the program that builds the service, not in its input.
    pub fn with(mut self, name: &str, kind: impl Kind + 'static) -> Kinds {
        let well_formed =
            (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        assert!(well_formed, "a target kind's name is 1 to 64 of [a-z0-9_-], not {name:?}");
        assert!(!BUILT_IN.contains(&name), "target kind {name:?} is built in");
        let previous = self.0.insert(name.to_string(), Arc::new(kind));
        assert!(previous.is_none(), "target kind {name:?} is added twice");
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Kind>> {
        self.0.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

impl std::fmt::Debug for Kinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}
