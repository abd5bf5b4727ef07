//! Panics on the worker's runtime thread, recorded so that the worker can say its runtime is
//! broken (`/health` answers 503 with the panic) instead of looking healthy.
//!
//! An actor that panics dies alone: tokio catches the panic of its task and the thread goes on,
//! but what the actor owned (a connector, or the supervisor of them all) is gone. One process
//! may run several workers (tests do), so a panic is recorded for the worker whose runtime
//! thread it happened on: the thread registers its slot, and one process-wide hook (chained
//! before the previous one) fills the slot of the panicking thread, if it has one.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, Once};

/// The first panic of one worker's runtime thread, as `panicked at FILE:LINE: MESSAGE`.
pub type PanicSlot = Arc<Mutex<Option<String>>>;

thread_local! {
    static SLOT: RefCell<Option<PanicSlot>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Records panics of the current thread into `slot` from now on.
pub fn watch_current_thread(slot: PanicSlot) {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // A panic inside a guard is caught and fails its task; the runtime goes on.
            if crate::panic_guard::inside_guard() {
                previous(info);
                return;
            }
            let _ = SLOT.try_with(|s| {
                if let Some(slot) = s.borrow().as_ref() {
                    let message = info
                        .payload()
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| info.payload().downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".to_owned());
                    let location = info
                        .location()
                        .map(|l| format!(" at {}:{}", l.file(), l.line()))
                        .unwrap_or_default();
                    let mut first = slot.lock().unwrap_or_else(|e| e.into_inner());
                    first.get_or_insert(format!("panicked{location}: {message}"));
                }
            });
            previous(info);
        }));
    });
    SLOT.with(|s| *s.borrow_mut() = Some(slot));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_recorded_for_the_watching_thread_only() {
        let watched = PanicSlot::default();
        // First a panic a guard catches: a task failure, not a broken runtime.
        let guarded = Arc::clone(&watched);
        let caught = std::thread::spawn(move || {
            watch_current_thread(guarded);
            crate::panic_guard::guard(|| panic!("caught by a guard")).is_err()
        })
        .join();
        assert!(caught.expect("the guard caught it"));
        assert_eq!(*watched.lock().expect("slot"), None);
        let slot = Arc::clone(&watched);
        let outcome = std::thread::spawn(move || {
            watch_current_thread(slot);
            panic!("boom in the runtime");
        })
        .join();
        assert!(outcome.is_err());
        let other = std::thread::spawn(|| panic!("elsewhere")).join();
        assert!(other.is_err());
        let recorded = watched.lock().expect("slot").clone().expect("recorded");
        assert!(recorded.contains("boom in the runtime"), "{recorded}");
        assert!(recorded.contains("panics.rs"), "{recorded}");
    }
}
