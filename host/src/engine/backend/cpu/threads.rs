//! The CPU backend's worker threads: one parallel section at a time, handed out item by item.
//!
//! A forward pass is a few hundred short parallel sections (a layer's products, attention,
//! quantisers and element-wise passes), many of them a few microseconds long at one or two
//! rows. rayon's fork-join costs about as much as such a section: in an ad-hoc test on the
//! 2-core Xeon, four items of 2.4 µs of serial work took 2.35 µs on rayon's pool (from one of
//! its workers) and 1.57 µs here; 10.1 µs of work 6.2 and 5.4 µs. What this pool does instead, as llama.cpp's does:
//! - the calling thread publishes a section (a function, its item count) in one atomic word
//!   and takes items itself, beside the helpers; nothing is queued or stolen;
//! - helpers claim items one at a time from that word, so a slow thread (a core lent to
//!   another process) takes fewer items instead of holding up the rest;
//! - between sections, helpers spin for a few microseconds (the next section of a pass is
//!   usually that close), then yield to other threads a while, then sleep on a condition
//!   variable, so an idle server does not burn its cores.
//!
//! One caller owns the pool at a time. Another thread that wants it meanwhile (a second
//! model's engine thread) or a section started from inside an item runs its items on its own
//! thread: correct, just not parallel.
//!
//! The thread count is `DSPARK_CPU_THREADS`, else `RAYON_NUM_THREADS` (what the backend read
//! before this pool), else the CPU's available parallelism.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The most items one section hands out: the item count and the next item share a 64-bit
/// word with the section's number (16 bits each). More items are grouped into runs.
const MAX_ITEMS: usize = u16::MAX as usize;

/// How long a helper spins on the section word after its last section before it yields.
const SPIN: Duration = Duration::from_micros(50);

/// How long a helper yields to other threads between looks at the section word before it
/// sleeps.
const YIELD: Duration = Duration::from_micros(500);

/// `section << 32 | items << 16 | next`.
fn pack(section: u32, items: usize, next: usize) -> u64 {
    (section as u64) << 32 | (items as u64) << 16 | next as u64
}

fn unpack(word: u64) -> (u32, usize, usize) {
    ((word >> 32) as u32, ((word >> 16) & 0xFFFF) as usize, (word & 0xFFFF) as usize)
}

/// Runs item `index` of the section whose closure `data` points to.
type Call = unsafe fn(*const (), usize);

struct Shared {
    /// The current section's number, item count and next unclaimed item ([`pack`]).
    word: AtomicU64,
    /// The current section's closure and its caller ([`Call`]), written before `word`.
    data: AtomicPtr<()>,
    call: AtomicUsize,
    /// Items of the current section finished, by any thread.
    finished: AtomicUsize,
    /// Whether an item of the current section panicked (the caller panics in turn).
    panicked: AtomicBool,
    /// Helpers asleep or about to be; the caller wakes them when non-zero.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    /// Held by the thread whose section runs.
    owner: Mutex<u32>,
}

struct Pool {
    shared: &'static Shared,
    threads: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = configured_threads();
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            word: AtomicU64::new(0),
            data: AtomicPtr::new(std::ptr::null_mut()),
            call: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            owner: Mutex::new(0),
        }));
        let mut started = 1;
        for n in 1..threads {
            let spawned = std::thread::Builder::new().name(format!("dspark-cpu-{n}")).spawn(move || helper(shared));
            // Without the thread the pool is smaller; sections still run (on fewer threads).
            if spawned.is_ok() {
                started += 1;
            }
        }
        Pool { shared, threads: started }
    })
}

fn configured_threads() -> usize {
    ["DSPARK_CPU_THREADS", "RAYON_NUM_THREADS"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The threads a section runs on (the caller and the helpers).
pub fn threads() -> usize {
    pool().threads
}

/// Claims and runs items of section `section` until none is left or another section began.
fn run_items(shared: &Shared, section: u32) {
    let data = shared.data.load(Ordering::Acquire).cast_const();
    let call = shared.call.load(Ordering::Acquire);
    let mut word = shared.word.load(Ordering::Acquire);
    loop {
        let (s, items, next) = unpack(word);
        if s != section || next >= items {
            return;
        }
        match shared.word.compare_exchange_weak(word, word + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                // SAFETY: `call` and `data` are the section's (written before `word` was
                // published, and not rewritten while an item of it is unclaimed, which this
                // claim proves); the caller waits for every claimed item before its closure
                // goes away.
                let call: Call = unsafe { std::mem::transmute::<usize, Call>(call) };
                if catch_unwind(AssertUnwindSafe(|| unsafe { call(data, next) })).is_err() {
                    shared.panicked.store(true, Ordering::Release);
                }
                shared.finished.fetch_add(1, Ordering::AcqRel);
                word = shared.word.load(Ordering::Acquire);
            }
            Err(current) => word = current,
        }
    }
}

/// A helper thread: waits for a new section, takes its items, and so on.
fn helper(shared: &'static Shared) {
    let mut seen = unpack(shared.word.load(Ordering::Acquire)).0;
    loop {
        let idle = Instant::now();
        let mut spins = 0u32;
        let section = loop {
            let section = unpack(shared.word.load(Ordering::Acquire)).0;
            if section != seen {
                break section;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let waited = idle.elapsed();
            if waited < SPIN {
                std::hint::spin_loop();
            } else if waited < SPIN + YIELD {
                std::thread::yield_now();
            } else {
                // Sleep until a caller publishes a section and sees this sleeper (the
                // counter is raised before the word is read again, the caller reads it
                // after publishing: one of the two sees the other).
                let mut guard = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
                shared.sleepers.fetch_add(1, Ordering::SeqCst);
                while unpack(shared.word.load(Ordering::SeqCst)).0 == seen {
                    guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                shared.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
        };
        seen = section;
        run_items(shared, section);
    }
}

/// Runs `f(i)` for every `i` in `0..items`, on the pool's threads and the caller's, and
/// returns once all have run. Items may run in any order and on any thread; each runs once.
/// A panic in an item is raised here once every item has finished.
pub fn for_each(items: usize, f: impl Fn(usize) + Sync) {
    if items == 0 {
        return;
    }
    let pool = pool();
    let owner = if items == 1 || pool.threads == 1 {
        None
    } else {
        match pool.shared.owner.try_lock() {
            Ok(owner) => Some(owner),
            // Nothing a section does leaves the pool inconsistent when it panics.
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    };
    let Some(mut owner) = owner else {
        // On this thread alone (the pool is busy, or one item): still every item runs, and
        // the first panic is raised after the last, as the contract says.
        let mut first_panic = None;
        for i in 0..items {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                first_panic.get_or_insert(panic);
            }
        }
        if let Some(panic) = first_panic {
            resume_unwind(panic);
        }
        return;
    };
    // Runs of items where there are more than a section holds.
    let per = items.div_ceil(MAX_ITEMS);
    let runs = items.div_ceil(per);
    let run = |r: usize| (r * per..((r + 1) * per).min(items)).for_each(&f);
    unsafe fn call_run<F: Fn(usize)>(data: *const (), r: usize) {
        // SAFETY: `data` is the `&F` published with this function (see `for_each`).
        unsafe { (*data.cast::<F>())(r) }
    }
    fn caller_of<F: Fn(usize)>(_: &F) -> Call {
        call_run::<F>
    }
    let shared = pool.shared;
    *owner = owner.wrapping_add(1);
    let section = *owner;
    shared.data.store((&run as *const _ as *const ()).cast_mut(), Ordering::Release);
    shared.call.store(caller_of(&run) as usize, Ordering::Release);
    shared.finished.store(0, Ordering::Release);
    shared.panicked.store(false, Ordering::Release);
    shared.word.store(pack(section, runs, 0), Ordering::SeqCst);
    if shared.sleepers.load(Ordering::SeqCst) > 0 {
        let _guard = shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
        shared.wake.notify_all();
    }
    run_items(shared, section);
    // Items claimed by helpers may still run, and they borrow `run`: wait for them all.
    let mut spins = 0u32;
    while shared.finished.load(Ordering::Acquire) < runs {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    let panicked = shared.panicked.load(Ordering::Acquire);
    drop(owner);
    if panicked {
        resume_unwind(Box::new("an item of a parallel section panicked"));
    }
}

/// Runs `f(i, &mut items[i])` for every item, as [`for_each`] does: each item is handed to
/// exactly one thread.
pub fn for_each_mut<T: Send>(items: &mut [T], f: impl Fn(usize, &mut T) + Sync) {
    struct Items<T>(*mut T);
    // SAFETY: shared between the section's threads, each of which touches only the items it
    // claimed (every index is claimed once).
    unsafe impl<T: Send> Sync for Items<T> {}
    let base = Items(items.as_mut_ptr());
    let base = &base;
    for_each(items.len(), |i| {
        // SAFETY: `i < items.len()`, and no other thread has item `i` (see above).
        f(i, unsafe { &mut *base.0.add(i) })
    });
}

/// Runs `f(i, chunk)` for every chunk of `chunk` elements of `data` (the last may be shorter),
/// as [`for_each`] does.
pub fn for_each_chunk_mut<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let mut chunks: Vec<&mut [T]> = data.chunks_mut(chunk.max(1)).collect();
    for_each_mut(&mut chunks, |i, c| f(i, c));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_item_runs_once() {
        for items in [0usize, 1, 2, 3, 7, 64, 1000, MAX_ITEMS + 5, 3 * MAX_ITEMS] {
            let counts: Vec<AtomicU32> = (0..items).map(|_| AtomicU32::new(0)).collect();
            for_each(items, |i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "{items} items");
        }
    }

    #[test]
    fn sections_from_several_threads_and_from_inside_items_all_finish() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..200 {
                        for_each(6, |_| {
                            for_each(3, |_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 6 * 3);
    }

    #[test]
    fn chunks_and_items_are_handed_out_whole() {
        let mut data: Vec<usize> = vec![0; 1003];
        for_each_chunk_mut(&mut data, 10, |i, chunk| {
            for (j, x) in chunk.iter_mut().enumerate() {
                *x = i * 10 + j;
            }
        });
        assert!(data.iter().enumerate().all(|(i, &x)| x == i));
    }

    #[test]
    fn a_panicking_item_panics_the_caller_after_the_rest_finish() {
        let finished = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            for_each(16, |i| {
                if i == 5 {
                    panic!("item 5");
                }
                finished.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(result.is_err());
        assert_eq!(finished.load(Ordering::Relaxed), 15);
        // The pool still works afterwards.
        let sum = AtomicUsize::new(0);
        for_each(100, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }
}
