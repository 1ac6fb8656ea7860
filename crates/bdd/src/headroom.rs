//! How much room a target's tables have for updates: one type for both
//! back ends (P4 table sizes, eBPF map sizes) and their command lines.

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// Tables are sized for this many times the entries a set has now, so that
/// updates have room: a finite number, at least 1. Parsed from text
/// (`2`, `1.5`) by [`FromStr`], so a `clap` argument can be one.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Serialize)]
#[serde(transparent)]
pub struct Headroom(f64);

/// A headroom that is not a finite number of at least 1.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("headroom {0}: tables are sized for this many times today's entries, so it is a number of at least 1 (2, 1.5)")]
pub struct BadHeadroom(String);

impl Headroom {
    /// `factor`, if finite and at least 1.
    pub fn new(factor: f64) -> Result<Headroom, BadHeadroom> {
        if factor.is_finite() && factor >= 1.0 {
            Ok(Headroom(factor))
        } else {
            Err(BadHeadroom(format!("`{factor}`")))
        }
    }

    pub fn factor(self) -> f64 {
        self.0
    }

    /// Room for `n` entries: `n` times the headroom, rounded up (at most
    /// `u64::MAX`).
    pub fn room_for(self, n: u64) -> u64 {
        (n as f64 * self.0).ceil() as u64
    }
}

/// Twice today's entries.
impl Default for Headroom {
    fn default() -> Headroom {
        Headroom(2.0)
    }
}

impl fmt::Display for Headroom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Headroom {
    type Err = BadHeadroom;

    fn from_str(s: &str) -> Result<Headroom, BadHeadroom> {
        s.trim().parse::<f64>().ok().and_then(|f| Headroom::new(f).ok()).ok_or_else(|| BadHeadroom(format!("`{s}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::Headroom;

    #[test]
    fn a_headroom_is_a_finite_number_of_at_least_one() {
        for ok in ["1", "2", "1.5", " 4 ", "1e3"] {
            assert!(ok.parse::<Headroom>().is_ok(), "{ok}");
        }
        for bad in ["0", "0.99", "-2", "NaN", "inf", "-inf", "", "two", "2x"] {
            assert!(bad.parse::<Headroom>().is_err(), "{bad}");
        }
        assert!(Headroom::new(f64::NAN).is_err());
        assert_eq!(Headroom::default().to_string(), "2");
        assert_eq!("1.5".parse::<Headroom>().unwrap().to_string(), "1.5");
    }

    #[test]
    fn room_rounds_up() {
        let h = |f: f64| Headroom::new(f).unwrap();
        assert_eq!(h(2.0).room_for(5), 10);
        assert_eq!(h(1.5).room_for(5), 8);
        assert_eq!(h(1.0).room_for(0), 0);
        assert_eq!(h(1e300).room_for(2), u64::MAX);
    }
}
