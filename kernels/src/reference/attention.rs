//! References for attention over a paged KV cache (see `crate::flash_attention`):
//! plain f64 loops, shared by the prefill (varlen) and decode kernels' tests.
//!
//! The building block is [`attend`]: the query rows of **one** sequence, each
//! with its own position, against the sequence's keys read through its block
//! table. Causal rows see the keys at positions `<= position`; full rows see
//! every key of the context. Prefill is [`prefill_varlen`] (per sequence, the
//! query rows are the last `q_len` positions of the context); decode is one
//! row at position `ctx - 1` per sequence.
//!
//! Besides the output, every element comes with the two scales its rounding
//! error is naturally measured in (see [`Attention`]): `mag = sum_j p_j |v_j|`
//! (an output is a convex combination of the `v_j`, so errors in the weights
//! `p_j` move it by at most their relative error times `mag`, however much the
//! `v_j` cancel) and `score_abs = max_j scale * sum_d |q_d k_jd|` (the scale of
//! the rounding error of the scores computed in floating point). A row that
//! sees no key has output 0 and both scales 0.
//!
//! Layouts are the kernels': query rows `[rows, n_q * head_dim]`, caches
//! `[num_blocks, block_size, n_kv, head_dim]`, block tables
//! `[batch, max_blocks_per_seq]`. Inputs are the values as stored (already
//! representable in the kernel's dtype); outputs are unrounded f64.

/// A paged K/V cache in f64: `[num_blocks, block_size, n_kv, head_dim]` each.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    /// The key cache.
    pub k: &'a [f64],
    /// The value cache (same layout).
    pub v: &'a [f64],
    /// Positions per cache block (page).
    pub block_size: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl PagedKv<'_> {
    /// The element offset of head `kvh` of key position `pos` through `table`
    /// (the sequence's block-table row). Panics if the table entry is negative
    /// or the row lies outside the cache (a malformed test input).
    pub fn offset(&self, table: &[i32], pos: usize, kvh: usize) -> usize {
        let page = table[pos / self.block_size];
        assert!(page >= 0, "block table entry for position {pos} is {page}");
        let row = page as usize * self.block_size + pos % self.block_size;
        let off = (row * self.n_kv + kvh) * self.head_dim;
        assert!(off + self.head_dim <= self.k.len(), "cache row {row} out of range");
        off
    }
}

/// The block tables `[pages.len(), max_blocks]` of sequences of `pages[b]`
/// cache pages each: row `b` takes the next `pages[b]` entries of `perm` (a
/// permutation of the cache's blocks, so no two sequences share a block) and
/// is `-1` past them.
pub fn block_tables(pages: &[usize], max_blocks: usize, perm: &[i32]) -> Vec<i32> {
    let mut tables = vec![-1i32; pages.len() * max_blocks];
    let mut next = 0;
    for (b, &n) in pages.iter().enumerate() {
        for p in 0..n {
            tables[b * max_blocks + p] = perm[next];
            next += 1;
        }
    }
    tables
}

/// The cumulative query offsets `[0, q_0, q_0 + q_1, ...]` of sequences of
/// `q_lens` query rows (a varlen batch's `cu_seqlens_q`).
pub fn cu_seqlens(q_lens: impl IntoIterator<Item = usize>) -> Vec<i32> {
    let mut cu = vec![0i32];
    for q_len in q_lens {
        cu.push(cu[cu.len() - 1] + q_len as i32);
    }
    cu
}

/// A varlen batch over a paged KV cache, as the prefill kernel's tests and
/// checks build it: `n_q` query and `n_kv` key/value heads of `d` elements,
/// each sequence's `(q_len, ctx)` and `block_size` positions per cache page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagedBatch {
    /// Query heads.
    pub n_q: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Elements per head.
    pub d: usize,
    /// `(q_len, ctx)` per sequence.
    pub seqs: Vec<(usize, usize)>,
    /// Positions per cache page.
    pub block_size: usize,
}

/// Where the sequences of a [`PagedBatch`] live in the cache
/// ([`PagedBatch::layout`]).
#[derive(Clone, Debug)]
pub struct PagedLayout {
    /// Block tables `[batch, max_blocks]` ([`block_tables`]).
    pub tables: Vec<i32>,
    /// Entries per block-table row.
    pub max_blocks: usize,
    /// Each sequence's context length.
    pub seq_lens: Vec<i32>,
    /// The cumulative query offsets ([`cu_seqlens`]).
    pub cu_seqlens: Vec<i32>,
    /// Elements of each of the K and V caches.
    pub cache_len: usize,
}

impl PagedBatch {
    /// The batch's pages and `spare` unused ones, in a random order over the
    /// cache (so a read through a wrong table entry lands on another
    /// sequence's or an unused page): a Fisher-Yates shuffle in which
    /// `below(n)` draws an index in `0..n`. Every table row has one entry
    /// more than its longest sequence needs.
    pub fn layout(&self, spare: usize, mut below: impl FnMut(u64) -> u64) -> PagedLayout {
        let bs = self.block_size;
        let pages: Vec<usize> = self.seqs.iter().map(|&(_, ctx)| ctx.div_ceil(bs)).collect();
        let max_blocks = pages.iter().copied().max().unwrap_or(0) + 1;
        let num_blocks = pages.iter().sum::<usize>() + spare;
        let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
        for i in (1..num_blocks).rev() {
            perm.swap(i, below(i as u64 + 1) as usize);
        }
        PagedLayout {
            tables: block_tables(&pages, max_blocks, &perm),
            max_blocks,
            seq_lens: self.seqs.iter().map(|&(_, ctx)| ctx as i32).collect(),
            cu_seqlens: cu_seqlens(self.seqs.iter().map(|&(q_len, _)| q_len)),
            cache_len: num_blocks * bs * self.n_kv * self.d,
        }
    }

    /// Query rows of the whole batch.
    pub fn total_q(&self) -> usize {
        self.seqs.iter().map(|s| s.0).sum()
    }

    /// [`prefill_varlen`] of the batch: queries `q` (`[total_q, n_q * d]`)
    /// against the caches `k` and `v` laid out as `layout`.
    pub fn prefill(
        &self,
        q: &[f64],
        k: &[f64],
        v: &[f64],
        layout: &PagedLayout,
        scale: f64,
        causal: bool,
    ) -> Attention {
        let kv = PagedKv { k, v, block_size: self.block_size, n_kv: self.n_kv, head_dim: self.d };
        let l = layout;
        prefill_varlen(q, &l.cu_seqlens, &l.seq_lens, &l.tables, l.max_blocks, self.n_q, &kv, scale, causal)
    }
}

/// Outputs of an attention reference, `[rows, n_q * head_dim]` each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attention {
    /// `o = sum_j p_j v_j` with `p = softmax(scale * q . k)` over the attended keys.
    pub out: Vec<f64>,
    /// `sum_j p_j |v_j|` per element: the error scale of the weights.
    pub mag: Vec<f64>,
    /// `max_j scale * sum_d |q_d k_jd|` per element (constant along the head):
    /// the error scale of the scores.
    pub score_abs: Vec<f64>,
}

impl Attention {
    fn zeros(n: usize) -> Attention {
        Attention { out: vec![0.0; n], mag: vec![0.0; n], score_abs: vec![0.0; n] }
    }

    /// A bound on `|kernel - out[e]|` for a FlashAttention-style kernel that
    /// computes scores (dot products of `head_dim` terms), exponentials and
    /// accumulations over at most `keys` keys in f32, rounds the weights `p`
    /// to the storage dtype before `p . v`, and rounds the output once; `ut`
    /// is the storage dtype's unit roundoff (`2^-8` bf16, `2^-11` f16, `0`
    /// for f32, whose rounding of `p` is exact). With `u = 2^-24`:
    ///
    /// ```text
    /// (mag (8 (D + 4) u score_abs + 4 (keys + 8) u + ut) + (4 u + ut) |out|) (1 + 2 ut)
    /// ```
    ///
    /// The score term bounds the f32 dot product (`D u score_abs`, also
    /// through `exp2` of the log2-scaled scores) with a margin of 8; the
    /// `keys` term the running sums and the `exp2`/`alpha` rescalings
    /// (relative errors of a few `u`, `ex2.approx` on a GPU included) with a
    /// margin of 4; `ut mag` is the rounding of the weights (`|p' - p| <= ut
    /// p` moves the convex combination by at most `ut mag`); `ut |out|` the
    /// final rounding, and `(1 + 2 ut)` the rounding of the error itself.
    pub fn error_bound(&self, e: usize, head_dim: usize, keys: usize, ut: f64) -> f64 {
        let u = f64::powi(2.0, -24);
        let weights =
            8.0 * (head_dim as f64 + 4.0) * u * self.score_abs[e] + 4.0 * (keys as f64 + 8.0) * u + ut;
        (self.mag[e] * weights + (4.0 * u + ut) * self.out[e].abs()) * (1.0 + 2.0 * ut)
    }
}

/// Attention of `positions.len()` query rows of one sequence with `n_q` query
/// heads (query head `h` reads key/value head `h / (n_q / kv.n_kv)`): row `i`
/// (`q[i * n_q * head_dim..]`) at position `positions[i]` sees keys
/// `0..=positions[i]` (clipped to `ctx`) when `causal`, keys `0..ctx`
/// otherwise; key `j` is read through `table`. A negative position sees no
/// key when causal.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f64],
    positions: &[i64],
    n_q: usize,
    ctx: usize,
    table: &[i32],
    kv: &PagedKv<'_>,
    scale: f64,
    causal: bool,
) -> Attention {
    let d = kv.head_dim;
    assert!(n_q.is_multiple_of(kv.n_kv), "n_q {n_q} is not a multiple of n_kv {}", kv.n_kv);
    assert_eq!(q.len(), positions.len() * n_q * d);
    let group = n_q / kv.n_kv;
    let mut att = Attention::zeros(q.len());
    let mut s = Vec::with_capacity(ctx);
    for (i, &p) in positions.iter().enumerate() {
        let keys = if causal { (p + 1).clamp(0, ctx as i64) as usize } else { ctx };
        for h in 0..n_q {
            let qh = &q[(i * n_q + h) * d..][..d];
            let kvh = h / group;
            s.clear();
            let mut abs = 0.0f64;
            for j in 0..keys {
                let k = &kv.k[kv.offset(table, j, kvh)..][..d];
                s.push(scale * qh.iter().zip(k).map(|(a, b)| a * b).sum::<f64>());
                abs = abs.max(scale.abs() * qh.iter().zip(k).map(|(a, b)| (a * b).abs()).sum::<f64>());
            }
            if keys == 0 {
                continue;
            }
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
            let base = (i * n_q + h) * d;
            for (j, &x) in s.iter().enumerate() {
                let pj = (x - m).exp() / l;
                let v = &kv.v[kv.offset(table, j, kvh)..][..d];
                for (e, &ve) in v.iter().enumerate() {
                    att.out[base + e] += pj * ve;
                    att.mag[base + e] += pj * ve.abs();
                }
            }
            att.score_abs[base..base + d].fill(abs);
        }
    }
    att
}

/// Varlen prefill: sequence `b` has `q_len_b = cu_seqlens_q[b + 1] -
/// cu_seqlens_q[b]` query rows (rows `cu_seqlens_q[b]..` of `q`), the last
/// `q_len_b` positions of its context of `seq_lens[b]` keys, whose pages are
/// row `b` of `block_tables` (`max_blocks_per_seq` entries per row).
#[allow(clippy::too_many_arguments)]
pub fn prefill_varlen(
    q: &[f64],
    cu_seqlens_q: &[i32],
    seq_lens: &[i32],
    block_tables: &[i32],
    max_blocks_per_seq: usize,
    n_q: usize,
    kv: &PagedKv<'_>,
    scale: f64,
    causal: bool,
) -> Attention {
    let row = n_q * kv.head_dim;
    let mut att = Attention::zeros(q.len());
    for (b, &ctx) in seq_lens.iter().enumerate() {
        let (start, end) = (cu_seqlens_q[b] as usize, cu_seqlens_q[b + 1] as usize);
        let q_len = end - start;
        let prefix = ctx as i64 - q_len as i64;
        let positions: Vec<i64> = (0..q_len as i64).map(|i| prefix + i).collect();
        let table = &block_tables[b * max_blocks_per_seq..(b + 1) * max_blocks_per_seq];
        let a = attend(&q[start * row..end * row], &positions, n_q, ctx as usize, table, kv, scale, causal);
        att.out[start * row..end * row].copy_from_slice(&a.out);
        att.mag[start * row..end * row].copy_from_slice(&a.mag);
        att.score_abs[start * row..end * row].copy_from_slice(&a.score_abs);
    }
    att
}
