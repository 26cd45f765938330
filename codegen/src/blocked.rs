//! The distributed layout of tile values over the threads of a program.
//!
//! Today every tile uses a *flattened blocked layout* that depends only on its
//! element count `n` and the thread count `threads` (32 * num_warps): the
//! row-major linear index space `[0, n)` is cut into chunks of `spt`
//! consecutive elements; chunk `c` belongs to thread `c mod threads`, in
//! register slots `(c / threads) * spt .. + spt`. When there are fewer chunks
//! than threads, thread `t` holds a *replica* of chunk `t mod nchunks`: only the
//! owner (`t < nchunks`) may perform side effects (stores, atomics) for it.
//!
//! Because the layout is a function of `n` alone, `reshape` and `expand_dims`
//! move no data and elementwise ops never convert layouts. Scalars (rank 0)
//! have `n == 1`: one register, replicated in every thread (uniform).
//!
//! `spt` is the kernel-wide cap for every tile of at least `cap` elements,
//! even when that leaves threads holding replicas: with one chunk size, the
//! chunk of linear index `i` of a tile of `n` elements and the chunk of
//! `i mod m` of a tile of `m | n` elements live in the same thread, so
//! broadcasting along leading dimensions (`[1, K] -> [N, K]`) moves no data.
//!
//! Invariants: `n`, `spt` and `threads` are powers of two; `spt` divides `n`.
//! A later issue can add Triton's blocked/slice/mma layouts behind this type.

/// The default cap on consecutive elements one thread owns in a chunk (16 bytes
/// of f32). Kernels whose memory accesses use narrower elements get a larger
/// cap (see [`spt_cap_for`]) so each access can still be 16 bytes wide.
pub const MAX_SPT: usize = 4;

/// The chunk-size cap of a kernel whose narrowest global-memory element is
/// `min_bytes` wide: enough elements for one 16-byte access, between 4 and 8.
pub fn spt_cap_for(min_bytes: usize) -> usize {
    (16 / min_bytes.max(1)).clamp(MAX_SPT, 8)
}

/// A flattened blocked layout; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockedLayout {
    /// Element count of the tile (1 for scalars).
    pub n: usize,
    /// Consecutive elements per chunk ("size per thread").
    pub spt: usize,
    /// Threads per program.
    pub threads: usize,
}

impl BlockedLayout {
    /// The layout of a tile of `n` elements over `threads` threads.
    pub fn new(n: usize, threads: usize) -> BlockedLayout {
        BlockedLayout::with_cap(n, threads, MAX_SPT)
    }

    /// The layout of a tile of `n` elements over `threads` threads, with at most
    /// `cap` (a power of two) consecutive elements per chunk. All tiles of one
    /// kernel use the same cap, so the layout is still a function of `n` there.
    pub fn with_cap(n: usize, threads: usize, cap: usize) -> BlockedLayout {
        let n = n.max(1);
        let threads = threads.max(1);
        let spt = n.min(cap.max(1));
        BlockedLayout { n, spt, threads }
    }

    /// Number of chunks of `spt` elements.
    pub fn nchunks(&self) -> usize {
        self.n / self.spt
    }

    /// True when some threads hold replicas (fewer chunks than threads).
    pub fn replicated(&self) -> bool {
        self.nchunks() < self.threads
    }

    /// Registers (elements) each thread holds.
    pub fn regs(&self) -> usize {
        (self.nchunks() / self.threads).max(1) * self.spt
    }

    /// The chunk index of thread `t`'s first chunk (`t mod nchunks`, as a mask
    /// because both are powers of two).
    pub fn first_chunk(&self, t: usize) -> usize {
        t & (self.nchunks().min(self.threads) - 1)
    }

    /// The per-thread part of the linear index: `first_chunk(t) * spt`.
    pub fn thread_base(&self, t: usize) -> usize {
        self.first_chunk(t) * self.spt
    }

    /// The constant part of the linear index of register `slot`, added to
    /// [`BlockedLayout::thread_base`].
    pub fn slot_offset(&self, slot: usize) -> usize {
        (slot / self.spt) * self.threads * self.spt + slot % self.spt
    }

    /// The linear (row-major) element index that thread `t` holds in `slot`.
    pub fn linear_index(&self, t: usize, slot: usize) -> usize {
        self.thread_base(t) + self.slot_offset(slot)
    }

    /// True when thread `t` owns (rather than replicates) its elements.
    pub fn is_owner(&self, t: usize) -> bool {
        t < self.nchunks()
    }
}

/// Row-major strides of `shape` (empty for scalars).
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_every_element_once() {
        for &threads in &[32usize, 128, 256] {
            for &n in &[1usize, 2, 32, 64, 128, 512, 1024, 4096, 16384] {
                let l = BlockedLayout::new(n, threads);
                let mut seen = vec![0u32; n];
                for t in 0..threads {
                    for s in 0..l.regs() {
                        let i = l.linear_index(t, s);
                        assert!(i < n, "n={n} t={t} s={s}");
                        if l.is_owner(t) {
                            seen[i] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "n={n} threads={threads}");
            }
        }
    }

    #[test]
    fn chunks_are_contiguous_and_replicas_match() {
        let l = BlockedLayout::new(1024, 128);
        assert_eq!((l.spt, l.regs()), (4, 8));
        let small = BlockedLayout::new(128, 128);
        assert_eq!((small.spt, small.nchunks(), small.regs()), (4, 32, 4));
        assert!(small.replicated() && small.is_owner(31) && !small.is_owner(32));
        assert_eq!(l.linear_index(1, 0), 4);
        assert_eq!(l.linear_index(1, 3), 7);
        assert_eq!(l.linear_index(1, 4), 516);
        let r = BlockedLayout::new(64, 128);
        assert!(r.replicated());
        assert_eq!((r.spt, r.regs(), r.nchunks()), (4, 4, 16));
        assert_eq!(r.linear_index(70, 0), r.linear_index(6, 0));
        assert!(!r.is_owner(70));
        let two = BlockedLayout::new(2, 128);
        assert_eq!((two.spt, two.regs(), two.nchunks()), (2, 2, 1));
        let s = BlockedLayout::new(1, 256);
        assert_eq!((s.regs(), s.linear_index(200, 0)), (1, 0));
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(strides(&[4, 8, 2]), vec![16, 2, 1]);
        assert!(strides(&[]).is_empty());
    }
}
