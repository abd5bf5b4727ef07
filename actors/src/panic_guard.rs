//! Panics in plugin and pipeline code become task failures instead of silent zombies.
//!
//! actix runs each actor as a local tokio task: a panic inside a handler drops that actor
//! without a word, so nothing would tell the connector, and the consumer would wait for the
//! batch's credit forever. Every call into a `SinkTask`, a converter, a transform, a predicate
//! or a `SinkConnector` goes through [`guard`] (sync) or [`guard_future`] (async), which turn a
//! panic into a [`Panicked`] naming its message and where it happened.
//!
//! The location is not part of a panic's payload; a panic hook (installed once, chaining the
//! previous hook so the usual stderr report stays) keeps it in a thread-local, which the guard
//! reads on the same thread right after unwinding stopped.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use futures::FutureExt;

/// A panic caught by a guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panicked {
    pub message: String,
    /// `file:line:column`, when the hook saw it.
    pub location: Option<String>,
}

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.location {
            Some(at) => write!(f, "panicked at {at}: {}", self.message),
            None => write!(f, "panicked: {}", self.message),
        }
    }
}

thread_local! {
    /// The location of the last panic on this thread.
    static LAST_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
    /// How many guards the current thread is inside: a panic there is caught and becomes a
    /// task failure, so it does not mean the runtime broke ([`crate::panics`] skips it).
    static GUARD_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// True while the current thread runs code under [`guard`] or polls a [`guard_future`].
pub fn inside_guard() -> bool {
    GUARD_DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// Marks the thread as inside a guard until dropped (also while unwinding).
struct GuardDepth;

impl GuardDepth {
    fn enter() -> GuardDepth {
        let _ = GUARD_DEPTH.try_with(|d| d.set(d.get() + 1));
        GuardDepth
    }
}

impl Drop for GuardDepth {
    fn drop(&mut self) {
        let _ = GUARD_DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

static HOOK: Once = Once::new();

/// Installs the location-keeping hook (once per process; later calls do nothing).
pub fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
            // `try_with`: a panic while the thread is being torn down has no slot left.
            let _ = LAST_LOCATION.try_with(|slot| *slot.borrow_mut() = at);
            previous(info);
        }));
    });
}

fn caught(payload: Box<dyn Any + Send>) -> Panicked {
    let message = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic payload that is not text)".to_owned()
    };
    let location = LAST_LOCATION
        .try_with(|slot| slot.borrow_mut().take())
        .ok()
        .flatten();
    Panicked { message, location }
}

/// Runs `f`, turning a panic into `Err`. The caller must not use what `f` touched as if
/// nothing happened (hence `AssertUnwindSafe` here): a panicked plugin is never called again.
pub fn guard<T>(f: impl FnOnce() -> T) -> Result<T, Panicked> {
    install_hook();
    catch_unwind(AssertUnwindSafe(|| {
        let _inside = GuardDepth::enter();
        f()
    }))
    .map_err(caught)
}

/// Awaits `fut`, turning a panic in any of its polls into `Err`.
pub async fn guard_future<F: Future>(fut: F) -> Result<F::Output, Panicked> {
    install_hook();
    let mut fut = std::pin::pin!(fut);
    let guarded = futures::future::poll_fn(move |cx| {
        let _inside = GuardDepth::enter();
        fut.as_mut().poll(cx)
    });
    AssertUnwindSafe(guarded)
        .catch_unwind()
        .await
        .map_err(caught)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message_and_location() {
        let line = line!() + 1;
        let err = guard(|| -> u32 { panic!("bad value {}", 7) }).expect_err("panics");
        assert_eq!(err.message, "bad value 7");
        let at = err.location.as_deref().expect("a location");
        assert!(
            at.starts_with(&format!("{}:{line}:", file!())),
            "{at} is not line {line} of {}",
            file!()
        );
        assert!(err.to_string().starts_with("panicked at "), "{err}");
        assert_eq!(guard(|| 5).expect("no panic"), 5);
        assert!(guard(inside_guard).expect("no panic"));
        assert!(
            !inside_guard(),
            "the depth is restored after a caught panic"
        );
    }

    #[test]
    fn a_panic_inside_a_future_is_caught_with_its_message() {
        let mut polls = 0;
        let result: Result<(), Panicked> =
            futures::executor::block_on(guard_future(futures::future::poll_fn(|cx| {
                polls += 1;
                if polls == 1 {
                    // Not in the first poll: the guard covers every poll, not just the first.
                    cx.waker().wake_by_ref();
                    return std::task::Poll::Pending;
                }
                panic!("in put")
            })));
        let err = result.expect_err("panics");
        assert_eq!(err.message, "in put");
        assert!(err.location.is_some());
    }
}
