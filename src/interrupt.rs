//! Waits the caller can cut short. A long wait in the core (a producer on a full capture ring, a
//! capture sink's close draining its writer) wakes every [`SLICE`] and asks its [`Interrupt`]
//! whether to stop; the Python bindings answer by running Python's signal handlers, so Ctrl-C
//! reaches a caller blocked in the core within a slice (`src/python/blocking.rs`).

use std::time::Duration;

use crate::error::{Error, Result};

/// The longest a wait goes without asking its [`Interrupt`].
pub const SLICE: Duration = Duration::from_millis(50);

/// Asked by a wait, once per [`SLICE`], whether its caller wants it to stop.
#[derive(Clone, Copy)]
pub struct Interrupt<'a>(Option<&'a (dyn Fn() -> bool + Sync)>);

impl<'a> Interrupt<'a> {
    /// A wait nobody interrupts (Rust callers, tests).
    pub const NEVER: Interrupt<'static> = Interrupt(None);

    /// Interrupts a wait when `stop()` returns true.
    pub fn new(stop: &'a (dyn Fn() -> bool + Sync)) -> Interrupt<'a> {
        Interrupt(Some(stop))
    }

    /// `Error::Interrupted` when the caller asks to stop; the wait returns it at once, having
    /// changed nothing.
    pub fn check(&self) -> Result<()> {
        match self.0 {
            Some(stop) if stop() => Err(Error::Interrupted),
            _ => Ok(()),
        }
    }

    /// How long to wait next: `left`, at most one [`SLICE`].
    pub fn slice(left: Duration) -> Duration {
        left.min(SLICE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    #[test]
    fn check_reports_the_callers_answer() {
        assert!(Interrupt::NEVER.check().is_ok());
        let flag = AtomicBool::new(false);
        let stop = || flag.load(SeqCst);
        let interrupt = Interrupt::new(&stop);
        assert!(interrupt.check().is_ok());
        flag.store(true, SeqCst);
        assert!(matches!(interrupt.check(), Err(Error::Interrupted)));
        assert_eq!(Interrupt::slice(Duration::from_secs(9)), SLICE);
        assert_eq!(Interrupt::slice(Duration::from_millis(3)), Duration::from_millis(3));
    }
}
