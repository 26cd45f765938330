//! The threads that run a launch's programs.
//!
//! A decode step is a few hundred launches of tens of microseconds each, so
//! what a launch costs beyond its programs decides the step time. The pool
//! keeps that cost near zero:
//!
//! - The calling thread takes part: it publishes the job, runs programs
//!   like every helper, then waits only for the programs still running. A
//!   launch therefore needs `threads - 1` helpers and never puts more
//!   threads than cores to work.
//! - Helpers poll for the next job for a while ([`SPIN`]) after each one,
//!   so back-to-back launches start without a wake-up; then they sleep on a
//!   condition variable and cost nothing while the process is idle.
//! - A kernel whose frame is too large for the caller's stack
//!   (`caller = false`) runs on the helpers plus one reserve helper that
//!   sleeps until such a job comes; the caller sleeps meanwhile.
//!
//! Launches from several threads are serialized: one job at a time.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a helper polls for the next job before it sleeps.
const SPIN: Duration = Duration::from_millis(2);

/// A job: run programs until none is left. Lives on the launching
/// thread's stack for the duration of one launch.
type Job<'a> = &'a (dyn Fn() + Sync);

/// What the launching thread publishes.
#[derive(Clone, Copy)]
struct Slot {
    /// The job, with its lifetime erased (see [`Pool::run`]).
    job: Option<Job<'static>>,
    /// Whether the reserve helper takes part (the caller does not).
    reserve: bool,
}

/// State shared by the launching thread and the helpers.
struct Shared {
    /// Incremented once per job, after the slot is written.
    epoch: AtomicU64,
    /// The current job; written only while `launch` is held and no helper
    /// of the previous job is still running.
    slot: Mutex<Slot>,
    /// Helpers (and the reserve) still running the current job.
    active: AtomicUsize,
    /// Helpers asleep, and where they sleep.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    /// The reserve helper's own wake-up and the caller's sleep while a
    /// job runs without it.
    reserve_epoch: Mutex<u64>,
    reserve_wake: Condvar,
    done: Mutex<bool>,
    done_wake: Condvar,
}

/// A fixed set of helper threads with large stacks.
pub(crate) struct Pool {
    shared: &'static Shared,
    /// Helpers that take part in every job (threads - 1).
    helpers: usize,
    /// Serializes launches.
    launch: Mutex<()>,
}

impl Pool {
    /// A pool for `threads` threads in all (the caller included): `threads
    /// - 1` helpers and a reserve, each with a `stack`-byte stack.
    pub(crate) fn new(threads: usize, stack: usize) -> std::io::Result<Pool> {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            epoch: AtomicU64::new(0),
            slot: Mutex::new(Slot { job: None, reserve: false }),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            reserve_epoch: Mutex::new(0),
            reserve_wake: Condvar::new(),
            done: Mutex::new(false),
            done_wake: Condvar::new(),
        }));
        let helpers = threads.max(1) - 1;
        for i in 0..helpers {
            std::thread::Builder::new()
                .name(format!("tessera-host-{i}"))
                .stack_size(stack)
                .spawn(move || helper(shared))?;
        }
        std::thread::Builder::new()
            .name("tessera-host-reserve".into())
            .stack_size(stack)
            .spawn(move || reserve(shared))?;
        Ok(Pool { shared, helpers, launch: Mutex::new(()) })
    }

    /// Threads that run a job's programs (the caller included).
    pub(crate) fn threads(&self) -> usize {
        self.helpers + 1
    }

    /// Runs `job` on every helper and, with `caller`, on this thread; with
    /// `caller` false on the reserve instead, this thread sleeping. Returns
    /// when every thread has returned from `job`.
    pub(crate) fn run(&self, job: &(dyn Fn() + Sync), caller: bool) {
        let _serial = self.launch.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.shared;
        // SAFETY: the lifetime is erased only for the helpers' view of the
        // slot: this function does not return before `active` is zero,
        // i.e. before every helper has returned from `job`, and the slot
        // is cleared before return, so no helper calls it afterwards.
        let erased: Job<'static> = unsafe { std::mem::transmute::<Job<'_>, Job<'static>>(job) };
        let workers = self.helpers + usize::from(!caller);
        *s.slot.lock().unwrap_or_else(|e| e.into_inner()) = Slot { job: Some(erased), reserve: !caller };
        s.active.store(workers, Ordering::SeqCst);
        if !caller {
            *s.done.lock().unwrap_or_else(|e| e.into_inner()) = false;
        }
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        if caller {
            job();
            let mut spins = 0u32;
            while s.active.load(Ordering::Acquire) != 0 {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        } else {
            {
                let mut e = s.reserve_epoch.lock().unwrap_or_else(|e| e.into_inner());
                *e += 1;
                s.reserve_wake.notify_one();
            }
            let mut d = s.done.lock().unwrap_or_else(|e| e.into_inner());
            while !*d {
                d = s.done_wake.wait(d).unwrap_or_else(|e| e.into_inner());
            }
        }
        s.slot.lock().unwrap_or_else(|e| e.into_inner()).job = None;
    }
}

/// Marks one worker of the current job done (the last one wakes a
/// sleeping caller).
fn finish(s: &Shared, reserve_job: bool) {
    if s.active.fetch_sub(1, Ordering::AcqRel) == 1 && reserve_job {
        let mut d = s.done.lock().unwrap_or_else(|e| e.into_inner());
        *d = true;
        s.done_wake.notify_one();
    }
}

/// A helper: polls for jobs, sleeps when none comes for [`SPIN`].
fn helper(s: &'static Shared) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        // A helper takes part in every job, so the job it sees is the one
        // of the newest epoch: the next one is published only after this
        // helper has finished this one.
        let slot = *s.slot.lock().unwrap_or_else(|e| e.into_inner());
        seen = s.epoch.load(Ordering::Acquire);
        if let Some(job) = slot.job {
            job();
        }
        finish(s, slot.reserve);
    }
}

/// The reserve helper: sleeps until a job without the caller comes.
fn reserve(s: &'static Shared) {
    let mut seen = 0u64;
    loop {
        {
            let mut e = s.reserve_epoch.lock().unwrap_or_else(|e| e.into_inner());
            while *e == seen {
                e = s.reserve_wake.wait(e).unwrap_or_else(|e| e.into_inner());
            }
            seen = *e;
        }
        let slot = *s.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = slot.job {
            job();
        }
        finish(s, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Runs `programs` programs on `pool` and checks each ran exactly once.
    fn launch_once(pool: &Pool, programs: u32, caller: bool) {
        let next = AtomicU32::new(0);
        let hits: Vec<AtomicU32> = (0..programs).map(|_| AtomicU32::new(0)).collect();
        let job = || {
            loop {
                let p = next.fetch_add(1, Ordering::Relaxed);
                if p >= programs {
                    break;
                }
                hits[p as usize].fetch_add(1, Ordering::Relaxed);
            }
        };
        pool.run(&job, caller);
        for (p, h) in hits.iter().enumerate() {
            assert_eq!(h.load(Ordering::Relaxed), 1, "program {p} of {programs} (caller {caller})");
        }
    }

    /// Every program runs once, with and without the caller, from several
    /// launching threads at once, back to back and after the helpers have
    /// gone to sleep.
    #[test]
    fn every_program_runs_once() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads, 1 << 20).unwrap();
            assert_eq!(pool.threads(), threads);
            std::thread::scope(|sc| {
                for t in 0..3u32 {
                    let pool = &pool;
                    sc.spawn(move || {
                        for i in 0..200u32 {
                            launch_once(pool, (i * 7 + t) % 50, (i + t) % 3 != 0);
                        }
                    });
                }
            });
            std::thread::sleep(SPIN * 3);
            launch_once(&pool, 17, true);
            std::thread::sleep(SPIN * 3);
            launch_once(&pool, 17, false);
        }
    }
}
