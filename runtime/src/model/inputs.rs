//! A step's inputs as one byte arena on the device: the host packs every
//! array a step's kernels read (token ids, positions, cache slots, context
//! lengths, query offsets, per-row sampling settings, block tables) into one
//! staging buffer and copies it with a single write, and the kernels get
//! typed pointers into the arena (a `u8` buffer may be viewed as any element
//! type on both devices).
//!
//! Invariants: every array starts at a multiple of [`ALIGN`] bytes (so
//! pointers are 16-byte aligned and specialize the same way every step);
//! arrays do not overlap; the block tables come last, so a copy that stops
//! after the rows in use still includes every other array ([`Layout::copy_len`]).
//! Values are little-endian, as the device reads them.

use super::sampler::SampleRow;

/// Byte alignment of every array in the arena.
pub(crate) const ALIGN: usize = 64;

/// Where the per-row sampling settings live in the arena (byte offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SamplingLayout {
    /// Temperatures, f32.
    pub temperature: usize,
    /// Top-k, i32.
    pub top_k: usize,
    /// Top-p, f32.
    pub top_p: usize,
    /// Min-p, f32.
    pub min_p: usize,
    /// Philox keys, i64.
    pub seed: usize,
    /// Philox counters, i32.
    pub step: usize,
    /// Row of the penalty count buffers, i32 (`-1`: no penalties).
    pub pen_slot: usize,
    /// Repetition penalties, f32.
    pub repetition: usize,
    /// Presence penalties, f32.
    pub presence: usize,
    /// Frequency penalties, f32.
    pub frequency: usize,
}

/// The arena layout of a step of up to `tokens` tokens, `seqs` sequences with
/// block tables of `bt_stride` entries per row, and (with sampling) `rows`
/// logit rows. All offsets are in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Token ids, i32 `[tokens]`.
    pub tokens: usize,
    /// Positions, i32 `[tokens]`.
    pub positions: usize,
    /// Cache slots, i32 `[tokens]`.
    pub slots: usize,
    /// Context lengths, i32 `[seqs]`.
    pub ctx: usize,
    /// Query offsets, i32 `[seqs + 1]`.
    pub cu: usize,
    /// Sampling settings, `[rows]` each, when the step samples.
    pub sampling: Option<SamplingLayout>,
    /// Block tables, i32 `[seqs, bt_stride]` (last).
    pub tables: usize,
    /// Entries per block-table row.
    pub bt_stride: usize,
    /// Total bytes.
    pub len: usize,
}

/// Hands out aligned byte ranges in order.
struct Cursor(usize);

impl Cursor {
    fn take(&mut self, bytes: usize) -> usize {
        let at = self.0;
        self.0 = (at + bytes).div_ceil(ALIGN) * ALIGN;
        at
    }
}

impl Layout {
    /// The layout for the given capacities (`rows = None`: no sampling).
    pub fn new(tokens: usize, seqs: usize, bt_stride: usize, rows: Option<usize>) -> Layout {
        let mut c = Cursor(0);
        let tokens_at = c.take(4 * tokens);
        let positions = c.take(4 * tokens);
        let slots = c.take(4 * tokens);
        let ctx = c.take(4 * seqs);
        let cu = c.take(4 * (seqs + 1));
        let sampling = rows.map(|r| SamplingLayout {
            temperature: c.take(4 * r),
            top_k: c.take(4 * r),
            top_p: c.take(4 * r),
            min_p: c.take(4 * r),
            seed: c.take(8 * r),
            step: c.take(4 * r),
            pen_slot: c.take(4 * r),
            repetition: c.take(4 * r),
            presence: c.take(4 * r),
            frequency: c.take(4 * r),
        });
        let tables = c.take(4 * seqs * bt_stride);
        Layout {
            tokens: tokens_at,
            positions,
            slots,
            ctx,
            cu,
            sampling,
            tables,
            bt_stride,
            len: c.0.max(ALIGN),
        }
    }

    /// Bytes from the start through the first `seqs` block-table rows.
    pub fn copy_len(&self, seqs: usize) -> usize {
        (self.tables + 4 * seqs * self.bt_stride).min(self.len)
    }
}

/// A host staging buffer being filled for one arena copy.
pub(crate) struct Stager<'a> {
    bytes: &'a mut Vec<u8>,
}

impl<'a> Stager<'a> {
    /// Starts staging `len` bytes (zero-filled, reusing `bytes`' allocation).
    pub fn new(bytes: &'a mut Vec<u8>, len: usize) -> Stager<'a> {
        bytes.clear();
        bytes.resize(len, 0);
        Stager { bytes }
    }

    /// The staged bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    fn put<const N: usize>(&mut self, at: usize, i: usize, v: [u8; N]) {
        self.bytes[at + N * i..at + N * (i + 1)].copy_from_slice(&v);
    }

    /// Writes i32 `v` as element `i` of the array at `at`.
    pub fn i32(&mut self, at: usize, i: usize, v: i32) {
        self.put(at, i, v.to_le_bytes());
    }

    /// Writes f32 `v` as element `i` of the array at `at`.
    pub fn f32(&mut self, at: usize, i: usize, v: f32) {
        self.put(at, i, v.to_le_bytes());
    }

    /// Writes i64 `v` as element `i` of the array at `at`.
    pub fn i64(&mut self, at: usize, i: usize, v: i64) {
        self.put(at, i, v.to_le_bytes());
    }

    /// Writes `vs` as i32 elements from element 0 of the array at `at`.
    pub fn i32s(&mut self, at: usize, vs: impl IntoIterator<Item = i32>) {
        for (i, v) in vs.into_iter().enumerate() {
            self.i32(at, i, v);
        }
    }
}

/// The arrays of one step as the kernels read them (the padded decode step
/// of a graph bucket, or a validated [`super::Step`] copied as is).
pub(crate) struct StepArrays<'s> {
    /// Token ids.
    pub tokens: &'s [u32],
    /// Positions.
    pub positions: &'s [i32],
    /// Cache slots.
    pub slots: &'s [i32],
    /// Context lengths.
    pub ctx: &'s [i32],
    /// Query offsets.
    pub cu: &'s [i32],
    /// Block tables, `src_stride` entries per row.
    pub tables: &'s [i32],
    /// Row stride of `tables`.
    pub src_stride: usize,
}

/// Stages `a` into `layout` (block-table rows are copied to the layout's
/// stride: the first `min(src_stride, bt_stride)` entries, the rest zero,
/// which is a valid block that the kernels do not read past the context).
pub(crate) fn stage_step(s: &mut Stager<'_>, layout: &Layout, a: &StepArrays<'_>) {
    s.i32s(layout.tokens, a.tokens.iter().map(|&t| t as i32));
    s.i32s(layout.positions, a.positions.iter().copied());
    s.i32s(layout.slots, a.slots.iter().copied());
    s.i32s(layout.ctx, a.ctx.iter().copied());
    s.i32s(layout.cu, a.cu.iter().copied());
    let w = a.src_stride.min(layout.bt_stride);
    if a.src_stride == 0 {
        return;
    }
    for (row, src) in a.tables.chunks(a.src_stride).enumerate() {
        let at = layout.tables + 4 * row * layout.bt_stride;
        s.i32s(at, src[..w].iter().copied());
    }
}

/// Whether a row's settings change the logits before sampling (vLLM's
/// penalties are neutral at repetition 1, presence 0, frequency 0).
pub(crate) fn uses_penalties(row: &SampleRow<'_>) -> bool {
    let p = row.params;
    p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0
}

/// Stages the sampling settings of `rows` followed by `padding` greedy rows
/// without penalties. Rows that use penalties get consecutive penalty slots
/// from 0 in row order; the count of such rows is returned.
pub(crate) fn stage_sampling(
    s: &mut Stager<'_>,
    l: &SamplingLayout,
    rows: &[SampleRow<'_>],
    padding: usize,
) -> usize {
    let mut pen = 0;
    for (i, r) in rows.iter().enumerate() {
        let p = r.params;
        s.f32(l.temperature, i, p.temperature);
        s.i32(l.top_k, i, p.top_k);
        s.f32(l.top_p, i, p.top_p);
        s.f32(l.min_p, i, p.min_p);
        s.i64(l.seed, i, p.seed as i64);
        s.i32(l.step, i, r.step as i32);
        let slot = if uses_penalties(r) {
            pen += 1;
            pen as i32 - 1
        } else {
            -1
        };
        s.i32(l.pen_slot, i, slot);
        s.f32(l.repetition, i, p.repetition_penalty);
        s.f32(l.presence, i, p.presence_penalty);
        s.f32(l.frequency, i, p.frequency_penalty);
    }
    for i in rows.len()..rows.len() + padding {
        s.f32(l.temperature, i, 0.0);
        s.i32(l.top_k, i, 0);
        s.f32(l.top_p, i, 1.0);
        s.f32(l.min_p, i, 0.0);
        s.i64(l.seed, i, 0);
        s.i32(l.step, i, 0);
        s.i32(l.pen_slot, i, -1);
        s.f32(l.repetition, i, 1.0);
        s.f32(l.presence, i, 0.0);
        s.f32(l.frequency, i, 0.0);
    }
    pen
}

/// The batch-size buckets of decode graphs.
pub const BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// The smallest bucket holding `b` sequences, if any.
pub fn bucket_for(b: usize) -> Option<usize> {
    BUCKETS.iter().copied().find(|&k| k >= b.max(1))
}

/// A decode step of `b` sequences padded to `bucket` rows: padding rows read
/// token 0 at position 0 with a context of 1 (block-table row of zeros),
/// write no cache slot (`-1`) and are never returned.
pub(crate) struct PaddedDecode {
    /// Token ids, `[bucket]`.
    pub tokens: Vec<u32>,
    /// Positions, `[bucket]`.
    pub positions: Vec<i32>,
    /// Slots, `[bucket]`.
    pub slots: Vec<i32>,
    /// Context lengths, `[bucket]`.
    pub ctx: Vec<i32>,
    /// Query offsets `0..=bucket`.
    pub cu: Vec<i32>,
}

impl PaddedDecode {
    /// Pads the per-token and per-sequence arrays of a decode step (one token
    /// per sequence, so tokens and sequences coincide).
    pub fn new(tokens: &[u32], positions: &[i32], slots: &[i32], ctx: &[i32], bucket: usize) -> PaddedDecode {
        let pad = bucket.saturating_sub(tokens.len());
        let ext = |v: &[i32], fill: i32| v.iter().copied().chain(std::iter::repeat_n(fill, pad)).collect();
        PaddedDecode {
            tokens: tokens.iter().copied().chain(std::iter::repeat_n(0, pad)).collect(),
            positions: ext(positions, 0),
            slots: ext(slots, -1),
            ctx: ext(ctx, 1),
            cu: (0..=bucket as i32).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sampler::SamplingParams;

    fn read_i32(b: &[u8], at: usize, i: usize) -> i32 {
        i32::from_le_bytes(b[at + 4 * i..at + 4 * i + 4].try_into().unwrap())
    }

    #[test]
    fn layout_is_aligned_disjoint_and_tables_last() {
        let l = Layout::new(5, 3, 7, Some(2));
        let s = l.sampling.unwrap();
        let mut ranges = vec![
            (l.tokens, 20),
            (l.positions, 20),
            (l.slots, 20),
            (l.ctx, 12),
            (l.cu, 16),
            (s.temperature, 8),
            (s.top_k, 8),
            (s.top_p, 8),
            (s.min_p, 8),
            (s.seed, 16),
            (s.step, 8),
            (s.pen_slot, 8),
            (s.repetition, 8),
            (s.presence, 8),
            (s.frequency, 8),
            (l.tables, 84),
        ];
        assert!(ranges.iter().all(|(at, _)| at % ALIGN == 0));
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?}");
        }
        assert_eq!(ranges.last().unwrap().0, l.tables);
        assert!(l.tables + 84 <= l.len);
        assert_eq!(l.copy_len(1), l.tables + 28);
        assert_eq!(l.copy_len(3), l.tables + 84);
        assert!(Layout::new(1, 1, 1, None).sampling.is_none());
    }

    #[test]
    fn staging_restrides_tables_and_pads_sampling() {
        let l = Layout::new(4, 2, 3, Some(4));
        let mut buf = Vec::new();
        let mut s = Stager::new(&mut buf, l.len);
        let a = StepArrays {
            tokens: &[7, 8],
            positions: &[4, 9],
            slots: &[20, -1],
            ctx: &[5, 10],
            cu: &[0, 1, 2],
            tables: &[1, 2, 9, 9, 3, 4, 5, 6],
            src_stride: 4,
        };
        stage_step(&mut s, &l, &a);
        let greedy = SamplingParams::default();
        let pen = SamplingParams { repetition_penalty: 1.3, ..SamplingParams::default() };
        let rows = [
            SampleRow { params: &pen, step: 3, tokens: &[1], prompt_len: 1 },
            SampleRow { params: &greedy, step: 0, tokens: &[], prompt_len: 0 },
            SampleRow { params: &pen, step: 1, tokens: &[2], prompt_len: 0 },
        ];
        let sl = l.sampling.unwrap();
        assert_eq!(stage_sampling(&mut s, &sl, &rows, 1), 2);
        let b = s.bytes();
        assert_eq!((read_i32(b, l.tokens, 1), read_i32(b, l.slots, 1)), (8, -1));
        let tables: Vec<i32> = (0..6).map(|i| read_i32(b, l.tables, i)).collect();
        assert_eq!(tables, vec![1, 2, 9, 3, 4, 5]);
        let slots: Vec<i32> = (0..4).map(|i| read_i32(b, sl.pen_slot, i)).collect();
        assert_eq!(slots, vec![0, -1, 1, -1]);
        assert_eq!(read_i32(b, sl.step, 0), 3);
        assert_eq!(f32::from_le_bytes(b[sl.top_p + 12..sl.top_p + 16].try_into().unwrap()), 1.0);
    }

    #[test]
    fn buckets_and_padding() {
        assert_eq!(bucket_for(1), Some(1));
        assert_eq!(bucket_for(3), Some(4));
        assert_eq!(bucket_for(64), Some(64));
        assert_eq!(bucket_for(65), None);
        let p = PaddedDecode::new(&[5, 6, 7], &[10, 3, 0], &[40, 19, 2], &[11, 4, 1], 4);
        assert_eq!(p.tokens, vec![5, 6, 7, 0]);
        assert_eq!(p.slots, vec![40, 19, 2, -1]);
        assert_eq!(p.ctx, vec![11, 4, 1, 1]);
        assert_eq!(p.positions, vec![10, 3, 0, 0]);
        assert_eq!(p.cu, vec![0, 1, 2, 3, 4]);
    }
}
