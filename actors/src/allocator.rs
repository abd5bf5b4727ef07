//! The process's allocator: jemalloc, with settings that keep freed memory for reuse.
//!
//! jemalloc's `malloc` and `free` stand in for the C library's (`tikv-jemalloc-sys` built
//! unprefixed), so librdkafka's C code allocates through it as much as Rust does (Rust's
//! `System` allocator calls `malloc` too). glibc's allocator takes its slow path for the many
//! small blocks a record costs on both sides (librdkafka's header lists, five `malloc`/`free`
//! per produced record with headers; Rust's per-record values).
//!
//! A task allocates and frees a few blocks per batch of a few hundred KiB and more each (its
//! record lists, a fetch response). An allocator that hands freed pages back to the kernel soon
//! makes the next batch fault them in again: page faults and system time that instruction
//! counts do not show (bench/README.md, "What instruction counts do not show: page faults").
//! [`SETTINGS`] keep them: freed pages are never purged (`dirty_decay_ms:-1`,
//! `muzzy_decay_ms:-1`), blocks of 8 MiB and more stay in the arenas rather than in jemalloc's
//! arena for oversize blocks, which does not cache them (`oversize_threshold:0`), no background
//! thread wakes up to purge, and two arenas (jemalloc's default is four per CPU) keep what
//! they hold in few places. Measured against glibc with its settings of before (bench/README.md,
//! "A tuned jemalloc for the whole process"): 10-15% fewer instructions per record, peak RSS a
//! few MiB higher; RSS after a peak stays at the peak.
//!
//! Every binary that links this crate gets jemalloc and these settings: they are compiled in
//! (the `malloc_conf` symbol, read at the first allocation, before `main`), not taken from the
//! environment. `MALLOC_CONF` in the environment still overrides them, for experiments.

use std::ffi::{c_char, c_void, CStr};

/// jemalloc's settings (its `malloc_conf` syntax).
pub const SETTINGS: &CStr =
    c"dirty_decay_ms:-1,muzzy_decay_ms:-1,oversize_threshold:0,background_thread:false,narenas:2";

/// A C string pointer that may sit in a `static`.
#[repr(transparent)]
struct ConfString(*const c_char);

// SAFETY: it points to a `'static` C string that nothing writes to.
unsafe impl Sync for ConfString {}

/// jemalloc reads its settings from this symbol (its own definition is weak).
#[used]
#[no_mangle]
#[allow(non_upper_case_globals)]
static malloc_conf: ConfString = ConfString(SETTINGS.as_ptr());

/// Links jemalloc's `malloc` into every binary that links this crate (test binaries among
/// them), whether or not it calls anything here: every `malloc` in the process resolves to it.
#[used]
static LINKS_JEMALLOC: unsafe extern "C" fn(usize) -> *mut c_void = tikv_jemalloc_sys::malloc;

/// jemalloc's settings as it runs with them, read back through its `mallctl`: each field is
/// its `opt.` key of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InEffect {
    pub dirty_decay_ms: isize,
    pub muzzy_decay_ms: isize,
    pub oversize_threshold: usize,
    pub background_thread: bool,
    pub narenas: u32,
}

/// Reads jemalloc's settings in effect (`opt.*`).
pub fn in_effect() -> InEffect {
    InEffect {
        dirty_decay_ms: read(c"opt.dirty_decay_ms"),
        muzzy_decay_ms: read(c"opt.muzzy_decay_ms"),
        oversize_threshold: read(c"opt.oversize_threshold"),
        background_thread: read(c"opt.background_thread"),
        narenas: read(c"opt.narenas"),
    }
}

/// One `mallctl` value of type `T` (the type jemalloc's manual gives for `name`).
fn read<T: Copy + Default>(name: &CStr) -> T {
    let mut value = T::default();
    let mut size = std::mem::size_of::<T>();
    // SAFETY: `value` is a `T` of `size` bytes, the size `mallctl` writes for `name`; no new
    // value is passed.
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&mut value as *mut T).cast(),
            &mut size,
            std::ptr::null_mut(),
            0,
        )
    };
    // The names are jemalloc's documented `opt.*` keys, all present in every build.
    assert_eq!(status, 0, "mallctl({name:?}) failed with {status}");
    value
}

/// Called where a worker's or a benchmark's `main` starts: jemalloc is linked and configured
/// before `main` runs (in every binary that links this crate), so nothing is applied here; the
/// call says so where the process starts, and reading the settings back links jemalloc even
/// into a binary that uses nothing else of this crate.
pub fn use_jemalloc() {
    let _ = in_effect();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jemalloc_runs_with_the_compiled_in_settings() {
        assert!(
            std::env::var_os("MALLOC_CONF").is_none(),
            "MALLOC_CONF is set and overrides the compiled-in settings this test checks: unset it"
        );
        assert_eq!(
            in_effect(),
            InEffect {
                dirty_decay_ms: -1,
                muzzy_decay_ms: -1,
                oversize_threshold: 0,
                background_thread: false,
                narenas: 2,
            }
        );
    }

    #[test]
    fn the_c_librarys_malloc_and_rusts_allocations_are_jemallocs() {
        // `sallocx` (jemalloc's alone) reads a block's size class from jemalloc's own records:
        // 100 bytes are in the 112-byte class. A block from another allocator is not in them.
        // SAFETY: `sallocx` is given live blocks this test owns; `block` is freed once.
        unsafe {
            let block = libc::malloc(100);
            assert!(!block.is_null());
            assert_eq!(tikv_jemalloc_sys::sallocx(block, 0), 112);
            libc::free(block);
            let boxed = Box::new([0u8; 100]);
            assert_eq!(tikv_jemalloc_sys::sallocx(boxed.as_ptr().cast(), 0), 112);
        }
    }
}
