//! The happens-before check of kernels that synchronise programs: which
//! plain writes of one program another program may read.
//!
//! It is a vector-clock race detector in the style of FastTrack, for the
//! memory model of `crate::ir::ops::memory`: every program has a clock (per
//! program, the last epoch of it that it knows about; sparse, since a
//! program hears from few others); its own entry, its epoch, advances at
//! every release it performs. A plain store records, per byte, the writer
//! and its epoch (the writer is the race shadow of `memory.rs`, the epoch is
//! kept here). A release stores the releasing program's clock at the
//! address it writes: a release store replaces what was there, a release
//! read-modify-write joins it (an atomic chain keeps every release made
//! along it, as PTX's release sequences do), a relaxed or plain store
//! clears it, a relaxed read-modify-write keeps it. An acquire (load,
//! atomic or `wait_until`) joins the clock at the address it reads into the
//! program's. A plain read of a byte another program wrote is ordered when
//! the reader's clock has reached the write's epoch; otherwise it is a
//! missing release (the writer has not released since the write) or a
//! missing acquire (it has, but the reader did not acquire that release).
//! A store over another program's unordered write of a different value is
//! a write-write race as before; an ordered one is a hand-over.
//!
//! CTA-scoped orderings never synchronise two programs (each program is a
//! CTA), so they act as relaxed ones here.
//!
//! The check runs for kernels with `wait_until` or an ordered load or store
//! (`Function::synchronizes_programs`) when race detection is on; kernels
//! that hand data over through atomics alone keep the cheaper checks of
//! `memory.rs`, since programs there run one after another.
//!
//! Invariant: an epoch is at least 1, so an unknown program (0) never
//! covers a write.

use crate::ir::ops::{MemOrder, MemScope, MemSem};
use rustc_hash::FxHashMap;

/// A sparse vector clock: `(program, epoch)` pairs sorted by program.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Clock(Vec<(u32, u32)>);

impl Clock {
    /// The epoch of `program` this clock knows (0: none).
    pub(crate) fn get(&self, program: u32) -> u32 {
        match self.0.binary_search_by_key(&program, |e| e.0) {
            Ok(k) => self.0[k].1,
            Err(_) => 0,
        }
    }

    /// Sets the epoch of `program`.
    fn set(&mut self, program: u32, epoch: u32) {
        match self.0.binary_search_by_key(&program, |e| e.0) {
            Ok(k) => self.0[k].1 = epoch,
            Err(k) => self.0.insert(k, (program, epoch)),
        }
    }

    /// The pointwise maximum of `self` and `other`, in `self`.
    fn join(&mut self, other: &Clock) {
        for &(p, e) in &other.0 {
            if self.get(p) < e {
                self.set(p, e);
            }
        }
    }
}

/// True when `o` synchronises programs with semantics that include `sem`.
fn crosses(o: MemOrder, sem: MemSem) -> bool {
    o.scope != MemScope::Cta && (o.sem == sem || o.sem == MemSem::AcqRel)
}

/// What a plain read of another program's write is missing, when it is not
/// ordered after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Missing {
    /// The writer has not released since it wrote.
    Release,
    /// The writer released after the write; the reader did not acquire it.
    Acquire,
}

/// The clocks of one launch.
#[derive(Debug, Default)]
pub(crate) struct Model {
    /// Per program (linear id): its clock.
    clocks: FxHashMap<u32, Clock>,
    /// Per address written by a release: the clock released there.
    released: FxHashMap<i64, Clock>,
    /// Per buffer, per byte: the epoch of its last plain write (allocated
    /// with the race shadow).
    epochs: Vec<Vec<u32>>,
}

impl Model {
    /// A model for `buffers` buffers.
    pub(crate) fn new(buffers: usize) -> Model {
        Model { epochs: vec![Vec::new(); buffers], ..Model::default() }
    }

    /// The clock of `program`, created at epoch 1 on its first use.
    fn clock(&mut self, program: u32) -> &mut Clock {
        self.clocks.entry(program).or_insert_with(|| Clock(vec![(program, 1)]))
    }

    /// The current epoch of `program`.
    fn epoch(&mut self, program: u32) -> u32 {
        self.clock(program).get(program)
    }

    /// Records a plain write by `program` of bytes `off..off + n` of buffer
    /// `b` (of `len` bytes), and that nothing released is at `addr` anymore.
    pub(crate) fn write(&mut self, program: u32, b: usize, len: usize, off: usize, n: usize, addr: i64) {
        let e = self.epoch(program);
        if self.epochs[b].is_empty() {
            self.epochs[b] = vec![0; len];
        }
        self.epochs[b][off..off + n].fill(e);
        if !self.released.is_empty() {
            self.released.remove(&addr);
        }
    }

    /// True when the write of byte `off` of buffer `b` by `writer` happens
    /// before the current point of `program` (another program).
    pub(crate) fn ordered(&self, program: u32, writer: u32, b: usize, off: usize) -> bool {
        let e = self.epochs.get(b).and_then(|v| v.get(off)).copied().unwrap_or(0);
        self.clocks.get(&program).map_or(0, |c| c.get(writer)) >= e
    }

    /// Why the write of byte `off` of buffer `b` by `writer` is not ordered
    /// before another program's read.
    pub(crate) fn missing(&self, writer: u32, b: usize, off: usize) -> Missing {
        let e = self.epochs.get(b).and_then(|v| v.get(off)).copied().unwrap_or(0);
        let now = self.clocks.get(&writer).map_or(1, |c| c.get(writer));
        if now <= e { Missing::Release } else { Missing::Acquire }
    }

    /// The acquire side of an access by `program` of the addresses `addrs`
    /// with ordering `o` (nothing unless it acquires across programs).
    pub(crate) fn acquire(&mut self, program: u32, o: MemOrder, addrs: &[i64]) {
        if !crosses(o, MemSem::Acquire) {
            return;
        }
        let mut got = Clock::default();
        for a in addrs {
            if let Some(c) = self.released.get(a) {
                got.join(c);
            }
        }
        self.clock(program).join(&got);
    }

    /// The release side of an access by `program` of the addresses `addrs`
    /// with ordering `o`: a store (`rmw` false) replaces what was released
    /// there, a read-modify-write joins it; without release semantics a
    /// store clears it and a read-modify-write keeps it. A release advances
    /// the program's epoch, so its later writes are not covered.
    pub(crate) fn release(&mut self, program: u32, o: MemOrder, addrs: &[i64], rmw: bool) {
        if !crosses(o, MemSem::Release) {
            if !rmw {
                for a in addrs {
                    self.released.remove(a);
                }
            }
            return;
        }
        let mine = self.clock(program).clone();
        for &a in addrs {
            match (rmw, self.released.get_mut(&a)) {
                (true, Some(c)) => c.join(&mine),
                _ => {
                    self.released.insert(a, mine.clone());
                }
            }
        }
        let e = mine.get(program);
        self.clock(program).set(program, e + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_join_pointwise() {
        let mut a = Clock::default();
        a.set(3, 2);
        a.set(1, 5);
        let mut b = Clock::default();
        b.set(1, 4);
        b.set(2, 7);
        a.join(&b);
        assert_eq!(a.0, vec![(1, 5), (2, 7), (3, 2)]);
        assert_eq!(a.get(9), 0);
    }

    #[test]
    fn a_release_chain_carries_every_release() {
        let gpu = |sem| MemOrder { sem, scope: MemScope::Gpu };
        let mut m = Model::new(1);
        // Programs 0 and 1 write, then add to a counter with release; 2 acquires it.
        m.epochs[0] = vec![0; 8];
        m.write(0, 0, 8, 0, 4, 100);
        m.write(1, 0, 8, 4, 4, 104);
        m.release(0, gpu(MemSem::AcqRel), &[200], true);
        m.release(1, gpu(MemSem::AcqRel), &[200], true);
        assert!(!m.ordered(2, 0, 0, 0));
        assert_eq!(m.missing(0, 0, 0), Missing::Acquire);
        m.acquire(2, gpu(MemSem::Acquire), &[200]);
        assert!(m.ordered(2, 0, 0, 0) && m.ordered(2, 1, 0, 4));
        // A write after the release is not covered, and is a missing release.
        m.write(0, 0, 8, 0, 4, 100);
        assert!(!m.ordered(2, 0, 0, 0));
        assert_eq!(m.missing(0, 0, 0), Missing::Release);
        // A CTA-scoped release publishes nothing to other programs.
        m.release(0, MemOrder { sem: MemSem::Release, scope: MemScope::Cta }, &[300], false);
        m.acquire(3, gpu(MemSem::Acquire), &[300]);
        assert!(!m.ordered(3, 0, 0, 0));
    }
}
