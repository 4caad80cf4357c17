//! The allocator of the test binary: the system allocator, counting the bytes each thread holds
//! so the fuzz harness can bound what a parser allocates, and refusing allocations beyond a
//! thread's cap (the process then aborts with the size it asked for, after this module has
//! written which input was being parsed). Counting only happens while some thread is between a
//! [`limit`] and its [`unlimit`]: the other tests of the binary allocate at the system
//! allocator's cost (counting everything made the training tests a fifth slower).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

/// [`System`], counting per thread.
pub struct CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const LABEL_CAPACITY: usize = 240;

/// Threads between a [`limit`] and its [`unlimit`]; while there are none nothing is counted.
static LIMITED_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Whether allocations are counted now.
fn counting() -> bool {
    LIMITED_THREADS.load(Ordering::Relaxed) != 0
}

thread_local! {
    /// Bytes allocated minus bytes freed by this thread (frees of memory other threads
    /// allocated make it smaller; only differences are used).
    static HELD: Cell<isize> = const { Cell::new(0) };
    /// `HELD` at the last [`limit`].
    static BASE: Cell<isize> = const { Cell::new(0) };
    /// The largest `HELD` since the last [`limit`].
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// Allocations that would raise `HELD` above this are refused.
    static CAP: Cell<isize> = const { Cell::new(isize::MAX) };
    /// What the thread is doing, written out when an allocation is refused.
    static LABEL: Cell<([u8; LABEL_CAPACITY], usize)> = const { Cell::new(([0; LABEL_CAPACITY], 0)) };
}

/// Bytes the current thread holds now.
pub fn held() -> isize {
    HELD.with(Cell::get)
}

/// Starts a new peak at the current holding and refuses allocations that would hold more than
/// `extra` bytes beyond it; `label` says what is being done, for the message of a refusal. Every
/// `limit` is followed by an [`unlimit`] on the same thread.
pub fn limit(extra: usize, label: &str) {
    LIMITED_THREADS.fetch_add(1, Ordering::SeqCst);
    let now = held();
    BASE.with(|base| base.set(now));
    PEAK.with(|peak| peak.set(now));
    CAP.with(|cap| cap.set(now.saturating_add(extra.min(isize::MAX as usize) as isize)));
    let mut buffer = [0u8; LABEL_CAPACITY];
    let length = label.len().min(LABEL_CAPACITY);
    buffer[..length].copy_from_slice(&label.as_bytes()[..length]);
    LABEL.with(|cell| cell.set((buffer, length)));
}

/// Makes a panic lift its thread's cap before the panic is reported: printing a backtrace
/// allocates, and a refusal there would abort while the backtrace lock is held.
pub fn lift_the_cap_on_panic() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = CAP.try_with(|cap| cap.set(isize::MAX));
            report(info);
        }));
    });
}

/// Lifts the cap of [`limit`] and returns the peak bytes held beyond the holding at that call.
pub fn unlimit() -> usize {
    LIMITED_THREADS.fetch_sub(1, Ordering::SeqCst);
    CAP.with(|cap| cap.set(isize::MAX));
    (PEAK.with(Cell::get) - BASE.with(Cell::get)).max(0) as usize
}

fn reserve(size: usize) -> bool {
    let granted = HELD.try_with(|held| {
        let after = held.get().saturating_add(size as isize);
        if after > CAP.with(Cell::get) {
            return false;
        }
        held.set(after);
        PEAK.with(|peak| peak.set(peak.get().max(after)));
        true
    });
    match granted {
        Ok(true) | Err(_) => true,
        Ok(false) => {
            refuse(size);
            false
        }
    }
}

fn release(size: usize) {
    if !counting() {
        return;
    }
    let _ = HELD.try_with(|held| held.set(held.get().saturating_sub(size as isize)));
}

/// Writes the refusal and the label to stderr without allocating.
fn refuse(size: usize) {
    let (label, length) = LABEL.with(Cell::get);
    let mut message = [0u8; LABEL_CAPACITY + 128];
    let mut cursor = std::io::Cursor::new(&mut message[..]);
    let _ = write!(cursor, "fuzz: refused an allocation of {size} bytes while ");
    let _ = cursor.write_all(&label[..length]);
    let _ = cursor.write_all(b"\n");
    let written = cursor.position() as usize;
    let _ = std::io::stderr().write_all(&message[..written]);
}

/// Runs `allocate` for `size` bytes if the thread's cap allows them, counting them while the
/// allocation holds: a refusal or a failure is a null pointer.
fn counted(size: usize, allocate: impl FnOnce() -> *mut u8) -> *mut u8 {
    if !counting() {
        return allocate();
    }
    if !reserve(size) {
        return std::ptr::null_mut();
    }
    let pointer = allocate();
    if pointer.is_null() {
        release(size);
    }
    pointer
}

// SAFETY: every call is forwarded to `System` with the same layout; the counters are
// thread-local cells that never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        counted(layout.size(), || unsafe { System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        counted(layout.size(), || unsafe { System.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        release(layout.size());
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && counting() && !reserve(new_size - layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as received.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if moved.is_null() {
            if new_size > layout.size() {
                release(new_size - layout.size());
            }
        } else if new_size < layout.size() {
            release(layout.size() - new_size);
        }
        moved
    }
}
