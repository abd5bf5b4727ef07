//! Process-wide settings of glibc's allocator for a worker.
//!
//! A task allocates a few lists per batch of a few hundred KiB each (its records, converted
//! records, verdicts) and frees them when the batch is committed. With glibc's defaults the
//! free memory at the top of a pool thread's heap is handed back to the kernel once it passes
//! twice the largest block freed so far, which such batches reach on every commit: the next
//! batch then faults the same pages in again. Measured on `pipeline_ceiling` (2,000,000
//! records): about 490,000 page faults and 1.3 s of system time, more than the pipeline's own
//! user time; with these settings 550 faults and 0.1 s. Peak RSS does not change (memory kept
//! for reuse is memory the process used already); RSS after a peak stays up to
//! [`TRIM_THRESHOLD`] higher.

/// Blocks up to this size come from the heap rather than from a mapping of their own.
pub const MMAP_THRESHOLD: usize = 8 << 20;
/// Free memory at the top of a heap is given back to the kernel past this size.
pub const TRIM_THRESHOLD: usize = 32 << 20;

/// Applies [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`] (glibc only; elsewhere nothing). Call once
/// at the start of a process that runs tasks.
pub fn keep_freed_memory_for_reuse() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets allocator parameters; glibc serializes it with allocations.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
    }
}
