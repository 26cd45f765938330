//! The tensor-core (`mma.sync.m16n8k16`) accumulator layout of a `dot`.
//!
//! The `[M, N]` output is cut into `warps_m x warps_n` contiguous warp tiles
//! of `tile_m x tile_n` elements (warp `w` has `wm = w mod warps_m`,
//! `wn = w / warps_m`); each warp tile is a grid of `tiles_m x tiles_n`
//! instruction tiles of 16 x 8. Within one instruction tile, lane `l` with
//! `g = l / 4` and `t = l mod 4` holds the PTX ISA's C/D fragment: register
//! `r` is row `g + 8 * (r / 2)`, column `2 * t + r mod 2`. A thread's
//! registers are ordered `[i][j][r]` (m tile, n tile, fragment register).
//!
//! Invariants: every warp owns a distinct warp tile (no replicas), so a
//! thread holds exactly `M * N / (32 * warps)` accumulator elements; `M` is a
//! multiple of `16 * warps_m`, `N` of `8 * warps_n`, and the `dot`'s `K` of 16.
//!
//! Values other than `dot` results can live in these layouts too (see
//! `lower/assign.rs`): an `[M, N]` tile in an [`MmaLayout`] (elementwise
//! math on scores, `p`, rescaled accumulators), and an `[M]` (or `[M, 1]`)
//! row vector in the [`RowLayout`] slice of it (row maxima and sums): each
//! thread holds the rows of its accumulator registers, `g` and `g + 8` of
//! every 16-row m tile of its warp, replicated over the four lanes of a quad
//! and over the warps along `N`. The transpose of such a tile (`trans` of an
//! accumulator, the swapped GEMM's epilogue) keeps its registers
//! ([`RegLayout::MmaT`]). [`RegLayout`] names the layout of one value.
//! An accumulator may also hold its n tiles in interleaved pairs
//! ([`MmaLayout::interleaved`]: a product whose B fragments come from an
//! FP8 tile by `ldmatrix.trans`); [`MmaLayout::coord`] and
//! [`MmaLayout::slot_delta`] say where each register's element is either
//! way, and [`MmaLayout::column_pairs`] which registers hold adjacent
//! columns.
//! This module is pure index arithmetic (no LLVM) so it is unit-tested alone.

/// Elements of padding appended to every row of a tile staged in shared
/// memory for `ldmatrix` or accumulator exchanges: 16 bytes for 2-byte
/// inputs, which shifts consecutive rows by four banks so the eight row
/// addresses of one `ldmatrix` phase hit distinct banks.
pub const ROW_PAD: usize = 8;

/// The accumulator layout of one tensor-core `dot`; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaLayout {
    /// Rows of the output tile (`M`).
    pub m: usize,
    /// Columns of the output tile (`N`).
    pub n: usize,
    /// Warps along `M`.
    pub warps_m: usize,
    /// Warps along `N`.
    pub warps_n: usize,
    /// Whether the 8-column n tiles go in interleaved pairs: n tiles `2c`
    /// and `2c + 1` of a warp tile hold its columns `16 c .. 16 c + 15`,
    /// tile `2c + p` the columns `16 c + 2 i + p` (its column `i`), so lane
    /// `t` holds the four adjacent columns `16 c + 4 t .. + 3` of each row
    /// (registers `[2c][0], [2c+1][0], [2c][1], [2c+1][1]`). A `dot` whose B
    /// fragments come from an FP8 tile by `ldmatrix.trans` on byte pairs
    /// produces this order (`pipeline::FragB`). Only with `tile_n` a
    /// multiple of 16.
    pub interleaved: bool,
}

impl MmaLayout {
    /// The layout for an `[m, k] x [k, n]` product over `warps` warps, or
    /// `None` when the shape does not fit whole 16 x 8 x 16 instructions with
    /// every warp owning a distinct tile. Among the valid warp grids it picks
    /// the one that loads the fewest fragments per `k` step (the most square
    /// warp tile), preferring more warps along `M` on ties.
    pub fn choose(m: usize, n: usize, k: usize, warps: usize) -> Option<MmaLayout> {
        if m == 0 || n == 0 || k == 0 || !k.is_multiple_of(16) || !warps.is_power_of_two() {
            return None;
        }
        let mut best: Option<(usize, MmaLayout)> = None;
        let mut wm = warps;
        loop {
            let wn = warps / wm;
            if m.is_multiple_of(16 * wm) && n.is_multiple_of(8 * wn) {
                let l = MmaLayout { m, n, warps_m: wm, warps_n: wn, interleaved: false };
                // Fragment loads per k step: one x4 per m tile, one x4 per two n tiles.
                let cost = l.tiles_m() * 2 + l.tiles_n();
                if best.is_none_or(|(c, _)| cost < c) {
                    best = Some((cost, l));
                }
            }
            if wm == 1 {
                break;
            }
            wm /= 2;
        }
        best.map(|(_, l)| l)
    }

    /// Rows of one warp tile.
    pub fn tile_m(&self) -> usize {
        self.m / self.warps_m
    }

    /// Columns of one warp tile.
    pub fn tile_n(&self) -> usize {
        self.n / self.warps_n
    }

    /// 16-row instruction tiles per warp tile.
    pub fn tiles_m(&self) -> usize {
        self.tile_m() / 16
    }

    /// 8-column instruction tiles per warp tile.
    pub fn tiles_n(&self) -> usize {
        self.tile_n() / 8
    }

    /// Accumulator registers per thread.
    pub fn regs(&self) -> usize {
        self.tiles_m() * self.tiles_n() * 4
    }

    /// The layout whose warp grid has `warps_m` warps along `M`, when the
    /// shape fits it (see [`MmaLayout::choose`] for the rules).
    pub fn with_warps_m(m: usize, n: usize, k: usize, warps: usize, warps_m: usize) -> Option<MmaLayout> {
        if m == 0 || n == 0 || !k.is_multiple_of(16) || k == 0 || !warps.is_power_of_two() {
            return None;
        }
        if warps_m == 0 || !warps.is_multiple_of(warps_m) {
            return None;
        }
        let warps_n = warps / warps_m;
        (m.is_multiple_of(16 * warps_m) && n.is_multiple_of(8 * warps_n)).then_some(MmaLayout {
            m,
            n,
            warps_m,
            warps_n,
            interleaved: false,
        })
    }

    /// The row slice of this layout (what a reduction along `N` produces).
    pub fn row(&self) -> RowLayout {
        RowLayout { m: self.m, warps_m: self.warps_m }
    }

    /// The layout with interleaved n-tile pairs ([`MmaLayout::interleaved`]),
    /// when its warp tiles are a multiple of 16 columns wide.
    pub fn interleave(self) -> Option<MmaLayout> {
        self.tile_n().is_multiple_of(16).then_some(MmaLayout { interleaved: true, ..self })
    }

    /// The column of thread `t = lane mod 4`'s register 0 within its warp
    /// tile: `2 t`, or `4 t` when interleaved.
    pub fn lane_col(&self, t: usize) -> usize {
        if self.interleaved { 4 * t } else { 2 * t }
    }

    /// The (row, column) offset of register `slot` from register 0 of the
    /// same thread (the same for every thread).
    pub fn slot_delta(&self, slot: usize) -> (usize, usize) {
        let (tile, r) = (slot / 4, slot % 4);
        let (i, j) = (tile / self.tiles_n(), tile % self.tiles_n());
        let col = if self.interleaved { 16 * (j / 2) + j % 2 + 2 * (r % 2) } else { j * 8 + r % 2 };
        (i * 16 + 8 * (r / 2), col)
    }

    /// The (row, column) of accumulator register `slot` of thread `tid`.
    pub fn coord(&self, tid: usize, slot: usize) -> (usize, usize) {
        let (warp, lane) = (tid / 32, tid % 32);
        let (wm, wn) = (warp % self.warps_m, warp / self.warps_m);
        let (dr, dc) = self.slot_delta(slot);
        let row = wm * self.tile_m() + lane / 4 + dr;
        let col = wn * self.tile_n() + self.lane_col(lane % 4) + dc;
        (row, col)
    }

    /// The registers of a thread in pairs `(a, b)` holding adjacent columns
    /// of one row (`b`'s is `a`'s plus one), every register once: `(2 k,
    /// 2 k + 1)`, or when interleaved the same register of n tiles `2c` and
    /// `2c + 1`.
    pub fn column_pairs(&self) -> Vec<(usize, usize)> {
        if !self.interleaved {
            return (0..self.regs() / 2).map(|k| (2 * k, 2 * k + 1)).collect();
        }
        let tn = self.tiles_n();
        let mut out = Vec::with_capacity(self.regs() / 2);
        for i in 0..self.tiles_m() {
            for c in 0..tn / 2 {
                for r in 0..4 {
                    out.push(((i * tn + 2 * c) * 4 + r, (i * tn + 2 * c + 1) * 4 + r));
                }
            }
        }
        out
    }
}

/// The row slice of an [`MmaLayout`]: an `[M]` vector where each thread
/// holds the rows of its accumulator registers (see the module docs). It
/// depends only on `M` and the warps along `M`, so the row vectors of two
/// `dot`s with the same `M` split are interchangeable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowLayout {
    /// Rows (`M`).
    pub m: usize,
    /// Warps along `M`.
    pub warps_m: usize,
}

impl RowLayout {
    /// Rows of one warp's tile.
    pub fn tile_m(&self) -> usize {
        self.m / self.warps_m
    }

    /// Registers per thread: rows `g` and `g + 8` of every 16-row m tile.
    pub fn regs(&self) -> usize {
        2 * (self.tile_m() / 16)
    }

    /// The row held in register `slot` by thread `tid` (`warps_m` divides
    /// the warp count; warp `w` has `wm = w mod warps_m`).
    pub fn row_of(&self, tid: usize, slot: usize) -> usize {
        let (warp, lane) = (tid / 32, tid % 32);
        let wm = warp % self.warps_m;
        wm * self.tile_m() + (slot / 2) * 16 + lane / 4 + 8 * (slot % 2)
    }
}

/// The layout of one tile value during lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegLayout {
    /// The flattened blocked layout of `crate::blocked` (the default).
    Blocked,
    /// An `[M, N]` tile in a tensor-core accumulator layout.
    Mma(MmaLayout),
    /// An `[M]` or `[M, 1]` row vector in the row slice of such a layout.
    Row(RowLayout),
    /// The transpose `[N, M]` of an `[M, N]` tile in accumulator layout
    /// `l` (`trans` of an accumulator): the same registers, register `k`
    /// holding element `(c, r)` where `l`'s register `k` holds `(r, c)`.
    MmaT(MmaLayout),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_deltas_are_offsets_from_register_zero() {
        for l in [
            MmaLayout { m: 128, n: 256, warps_m: 8, warps_n: 1, interleaved: false },
            MmaLayout { m: 64, n: 32, warps_m: 2, warps_n: 2, interleaved: false },
            MmaLayout { m: 16, n: 128, warps_m: 1, warps_n: 4, interleaved: true },
        ] {
            for tid in [0, 5, 37, 100, 127] {
                let (r0, c0) = l.coord(tid, 0);
                for slot in 0..l.regs() {
                    let (dr, dc) = l.slot_delta(slot);
                    assert_eq!(l.coord(tid, slot), (r0 + dr, c0 + dc), "{l:?} tid {tid} slot {slot}");
                }
            }
        }
    }

    #[test]
    fn interleaved_tiles_cover_every_element_once_in_adjacent_pairs() {
        for &(m, n, w) in &[(16usize, 128usize, 4usize), (16, 64, 4), (32, 32, 2), (16, 16, 1)] {
            let l = MmaLayout::choose(m, n, 16, w).unwrap().interleave().unwrap();
            let mut seen = vec![0u32; m * n];
            for t in 0..32 * w {
                for s in 0..l.regs() {
                    let (r, c) = l.coord(t, s);
                    seen[r * n + c] += 1;
                }
                for (a, b) in l.column_pairs() {
                    let ((ra, ca), (rb, cb)) = (l.coord(t, a), l.coord(t, b));
                    assert_eq!((rb, cb), (ra, ca + 1), "{m}x{n} w{w} t{t} pair {a},{b}");
                }
                // Tile 2c + p holds columns 16 c + 2 i + p: lane t's column
                // 2 t (register 0) and 2 t + 1 (register 1) of each.
                let lane = t % 32;
                let (wn, tl) = ((t / 32) / l.warps_m, lane % 4);
                for j in 0..l.tiles_n() {
                    for r in 0..2 {
                        let i = 2 * tl + r;
                        let want = wn * l.tile_n() + 16 * (j / 2) + 2 * i + j % 2;
                        assert_eq!(l.coord(t, j * 4 + r).1, want, "{m}x{n} t{t} tile {j} reg {r}");
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{m}x{n} over {w} warps");
        }
        let l = MmaLayout::choose(16, 64, 16, 8).unwrap();
        assert_eq!(l.tile_n(), 8);
        assert!(l.interleave().is_none());
    }

    #[test]
    fn chooses_square_warp_tiles() {
        let l = MmaLayout::choose(128, 128, 32, 8).unwrap();
        assert_eq!((l.warps_m, l.warps_n, l.tile_m(), l.tile_n()), (4, 2, 32, 64));
        let fa = MmaLayout::choose(64, 32, 128, 4).unwrap();
        assert_eq!((fa.warps_m, fa.warps_n), (4, 1));
        let thin = MmaLayout::choose(16, 64, 16, 4).unwrap();
        assert_eq!((thin.warps_m, thin.warps_n, thin.tile_n()), (1, 4, 16));
        assert!(MmaLayout::choose(16, 16, 16, 8).is_none());
        assert!(MmaLayout::choose(64, 64, 8, 4).is_none());
        assert!(MmaLayout::choose(8, 64, 16, 1).is_none());
    }

    #[test]
    fn row_slices_match_the_accumulator_rows() {
        for &(m, n, w, wm) in
            &[(64usize, 32usize, 4usize, 4usize), (128, 64, 8, 4), (16, 64, 4, 1), (128, 128, 4, 4)]
        {
            let l = MmaLayout::with_warps_m(m, n, 16, w, wm).unwrap();
            let r = l.row();
            for t in 0..32 * w {
                for s in 0..l.regs() {
                    let (row, _) = l.coord(t, s);
                    // Accumulator register [i][j][q] sits in row slot 2 i + q / 2.
                    let i = s / 4 / l.tiles_n();
                    assert_eq!(r.row_of(t, 2 * i + (s % 4) / 2), row, "{m}x{n} w{w} t{t} s{s}");
                }
            }
            assert_eq!(r.regs(), 2 * l.tiles_m());
        }
        assert!(MmaLayout::with_warps_m(64, 32, 16, 4, 2).is_some());
        assert!(MmaLayout::with_warps_m(16, 32, 16, 4, 4).is_none());
        assert!(MmaLayout::with_warps_m(64, 32, 16, 4, 3).is_none());
    }

    #[test]
    fn covers_every_element_once() {
        for &(m, n, w) in
            &[(128usize, 128usize, 8usize), (64, 32, 4), (16, 8, 1), (32, 256, 4), (256, 128, 8)]
        {
            let l = MmaLayout::choose(m, n, 16, w).unwrap();
            let mut seen = vec![0u32; m * n];
            for t in 0..32 * w {
                for s in 0..l.regs() {
                    let (r, c) = l.coord(t, s);
                    seen[r * n + c] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{m}x{n} over {w} warps");
            assert_eq!(l.regs() * 32 * w, m * n);
        }
    }
}
