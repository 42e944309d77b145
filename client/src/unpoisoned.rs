//! Taking a std lock whose holder panicked: the client's copy of the
//! daemon's `unpoisoned` module (two crates, one rule). A panic in one
//! caller's thread while it holds the connection pool or a burst's state
//! must not make every later call panic; what those locks guard stays
//! usable after an interrupted update.

use std::sync::{Mutex, MutexGuard};

/// A mutex's guard, poisoned or not.
pub trait Unpoisoned<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Unpoisoned<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }
}
