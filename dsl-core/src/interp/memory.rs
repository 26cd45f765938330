//! Global memory of one launch: pointer encoding, bounds and alignment checks,
//! masked loads and stores, atomics, and write-race detection between programs.
//!
//! Pointers are `i64` virtual addresses: buffer `i` occupies the region around
//! `(i + 1) << 44`, so an address is `base(i) + byte offset`. Pointer tiles are
//! therefore plain integer tiles (shape ops, `select`, comparisons and hints
//! need no pointer case), and a buffer base is aligned to 2^44 bytes, so
//! `multiple_of` on a pointer checks its byte offset. A region spans ±2^43
//! bytes around its base; `addptr` refuses to leave it (no offset that large is
//! meaningful), so an address always names the buffer it was derived from.
//!
//! Races: programs run one after another. For every buffer that a program
//! stores to (non-atomically), a shadow array records per byte the last program
//! that stored it. A store to a byte last stored by another program with a
//! different value is a write-write race; storing the same value is benign.
//! Atomics never race and clear the shadow of the bytes they update.
//!
//! Synchronising kernels (`wait_until`, ordered loads and stores) also get
//! the happens-before check of `model.rs` on top: the shadow then names the
//! writer of each byte for it, plain reads are checked against it, and a
//! store over another program's write is a race only when the two are not
//! ordered. Strong accesses (ordered loads and stores, atomics) never race
//! and clear the shadow of what they write. `version` counts the stores and
//! atomics of the launch, so a waiting program is only re-checked after
//! memory changed.
//!
//! Block loads (`load_block`) are executed directly from their definition:
//! the elements inside the matrix get their addresses (with the region check
//! of `addptr`) and go through the masked load path, so they are bounds- and
//! alignment-checked like any load; the others read nothing and are zero.
//! This is deliberately independent of the op's expansion into a masked
//! `load` (`crate::passes::block_load`), so each checks the other.
//!
//! Invariants: masked-off lanes never touch memory or the shadow; every access
//! is bounds- and alignment-checked before any byte is read or written.

use super::buffer::Buffer;
use super::model::{Missing, Model};
use super::tile::{Data, lane_str, pid_str};
use crate::dtype::{DType, f8_bits, f8_value};
use crate::ir::ops::MemOrder;
use half::{bf16, f16};

/// Bits of the per-buffer address region.
const REGION_BITS: u32 = 44;
/// Half a region: the largest distance from the base an address may have.
const HALF_REGION: i64 = 1 << (REGION_BITS - 1);

/// The base address of buffer `index`.
pub(crate) fn base_addr(index: usize) -> i64 {
    ((index as i64) + 1) << REGION_BITS
}

/// The region (buffer index + 1) an address belongs to.
pub(crate) fn region_of(addr: i64) -> i64 {
    addr.wrapping_add(HALF_REGION) >> REGION_BITS
}

/// The most buffers one launch may bind (the address regions must fit an `i64`).
pub(crate) const MAX_BUFFERS: usize = (1 << (63 - REGION_BITS)) - 2;

/// The byte offset of an address from its buffer's base.
pub(crate) fn byte_offset(addr: i64) -> i64 {
    decode(addr).1
}

/// Splits an address into a buffer index (possibly invalid) and a byte offset.
fn decode(addr: i64) -> (i64, i64) {
    let region = region_of(addr);
    (region - 1, addr.wrapping_sub(region.wrapping_shl(REGION_BITS)))
}

/// The scalar operands of one `load_block` (see `crate::ir::ops::memory`).
pub(crate) struct BlockBox {
    /// The matrix base address.
    pub ptr: i64,
    /// Rows of the matrix.
    pub rows: i64,
    /// Columns of the matrix.
    pub cols: i64,
    /// Elements between the starts of consecutive rows.
    pub row_stride: i64,
    /// The box's first row (may be negative).
    pub row0: i64,
    /// The box's first column (may be negative).
    pub col0: i64,
}

/// The memory of one launch.
pub(crate) struct Memory<'b> {
    bufs: &'b mut [Buffer],
    /// Per buffer: the names of the parameters bound to it, for messages.
    names: Vec<String>,
    /// Per buffer: the last program (linear id + 1) that stored each byte; empty
    /// until the first store when race detection is on.
    shadow: Vec<Vec<u32>>,
    track_races: bool,
    /// The running program (linear id + 1) and its grid coordinates.
    current: u32,
    grid: [u32; 3],
    /// The happens-before check (synchronising kernels with race detection).
    model: Option<Model>,
    /// The number of stores and atomics so far.
    pub(crate) version: u64,
}

/// What one memory op is doing, for messages.
pub(crate) struct Access<'a> {
    /// The tile shape (for lane indices).
    pub shape: &'a [usize],
    /// The pointee dtype.
    pub dtype: DType,
}

impl<'b> Memory<'b> {
    /// Memory over `bufs`, with `names[i]` naming the parameters bound to
    /// buffer `i`; `model` turns on the happens-before check (with races).
    pub(crate) fn new(
        bufs: &'b mut [Buffer],
        names: Vec<String>,
        track_races: bool,
        grid: [u32; 3],
        model: bool,
    ) -> Self {
        let n = bufs.len();
        let model = (track_races && model).then(|| Model::new(n));
        Memory { bufs, names, shadow: vec![Vec::new(); n], track_races, current: 1, grid, model, version: 0 }
    }

    /// An address as "byte offset N of buffer `name`", for messages.
    pub(crate) fn describe(&self, addr: i64) -> String {
        let (b, off) = decode(addr);
        match usize::try_from(b) {
            Ok(b) if b < self.bufs.len() => format!("byte offset {off} of buffer {}", self.name(b)),
            _ => format!("address 0x{addr:x}"),
        }
    }

    /// True when the happens-before check runs.
    pub(crate) fn checks_order(&self) -> bool {
        self.model.is_some()
    }

    /// Sets the running program (linear id, row-major over the grid).
    pub(crate) fn set_program(&mut self, linear: u32) {
        self.current = linear + 1;
    }

    /// The grid coordinates of a linear program id.
    fn coords(&self, linear: u32) -> [u32; 3] {
        coords(self.grid, linear)
    }

    /// The parameter name(s) of buffer `buf`, for messages.
    fn name(&self, buf: usize) -> String {
        match self.names.get(buf) {
            Some(n) if !n.is_empty() => format!("`{n}`"),
            _ => format!("#{buf}"),
        }
    }

    /// Resolves lane `lane`'s address to (buffer, byte offset), checking that the
    /// `size` bytes there lie inside the buffer and are aligned. This is the slow
    /// path of the access loops, taken when a lane leaves the buffer of the lane
    /// before it, and the only place that formats access errors.
    #[cold]
    #[inline(never)]
    fn locate(
        &self,
        addr: i64,
        size: usize,
        acc: &Access<'_>,
        lane: usize,
        verb: &str,
    ) -> Result<(usize, usize), String> {
        let (buf, off) = decode(addr);
        let Some(b) = usize::try_from(buf).ok().filter(|&b| b < self.bufs.len()) else {
            return Err(format!(
                "{} at {}: the address 0x{addr:x} does not point into any buffer",
                verb,
                lane_str(acc.shape, lane)
            ));
        };
        let len = self.bufs[b].size_bytes();
        let inside = off >= 0 && (off as u64).checked_add(size as u64).is_some_and(|end| end <= len as u64);
        if !inside {
            let bd = self.bufs[b].dtype();
            return Err(format!(
                "out-of-bounds {verb} at {}: {size} byte(s) at byte offset {off} of buffer {} \
                 ({len} bytes, {} x {bd}); mask the lane or fix the offset",
                lane_str(acc.shape, lane),
                self.name(b),
                self.bufs[b].len(),
            ));
        }
        if off as usize & (size - 1) != 0 {
            return Err(format!(
                "misaligned {verb} at {}: byte offset {off} of buffer {} is not a multiple of {size} (the size of {})",
                lane_str(acc.shape, lane),
                self.name(b),
                acc.dtype
            ));
        }
        Ok((b, off as usize))
    }

    /// Loads `acc.dtype` elements from `ptrs` where `mask` is set; other lanes take
    /// `other` (or zero).
    pub(crate) fn load(
        &self,
        acc: &Access<'_>,
        ptrs: &[i64],
        mask: Option<&[i64]>,
        other: Option<&Data>,
    ) -> Result<Data, String> {
        macro_rules! lanes {
            ($variant:ident, $zero:expr, $size:expr, |$b:ident| $read:expr) => {{
                let other = match other {
                    Some(Data::$variant(o)) => Some(o.as_slice()),
                    Some(_) => return Err(super::tile::internal("`other` has the wrong storage".into())),
                    None => None,
                };
                Data::$variant(self.read_lanes(acc, ptrs, mask, other, $zero, $size, |$b| $read)?)
            }};
        }
        Ok(match acc.dtype {
            DType::F32 => lanes!(F32, 0.0, 4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DType::F16 => lanes!(F32, 0.0, 2, |b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
            DType::BF16 => lanes!(F32, 0.0, 2, |b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            DType::F8E4M3 | DType::F8E5M2 => lanes!(F32, 0.0, 1, |b| f8_value(acc.dtype, b[0])),
            DType::F64 => {
                lanes!(F64, 0.0, 8, |b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            }
            DType::I1 => lanes!(Int, 0, 1, |b| (b[0] != 0) as i64),
            DType::I8 => lanes!(Int, 0, 1, |b| b[0] as i8 as i64),
            DType::U8 => lanes!(Int, 0, 1, |b| b[0] as i64),
            DType::I16 => lanes!(Int, 0, 2, |b| i16::from_le_bytes([b[0], b[1]]) as i64),
            DType::I32 => lanes!(Int, 0, 4, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64),
            DType::U32 => lanes!(Int, 0, 4, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64),
            DType::I64 => {
                lanes!(Int, 0, 8, |b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            }
        })
    }

    /// Loads the `block` box of `b` of `dtype` elements: elements inside the
    /// matrix are read (bounds- and alignment-checked like [`Memory::load`]),
    /// the others are zero. An element offset that leaves the buffer's address
    /// region is refused as `addptr` refuses it.
    pub(crate) fn load_block(&self, dtype: DType, b: &BlockBox, block: [usize; 2]) -> Result<Data, String> {
        let [br, bc] = block;
        let size = dtype.size_bytes() as i64;
        let mut ptrs = vec![0i64; br * bc];
        let mut mask = vec![0i64; br * bc];
        for i in 0..br {
            let r = b.row0 + i as i64;
            if r < 0 || r >= b.rows {
                continue;
            }
            for j in 0..bc {
                let c = b.col0 + j as i64;
                if c < 0 || c >= b.cols {
                    continue;
                }
                let lane = i * bc + j;
                // |r * row_stride + c| < 2^62 + 2^31 for i32 operands: no overflow.
                let off = r * b.row_stride + c;
                let addr = off
                    .checked_mul(size)
                    .and_then(|bytes| b.ptr.checked_add(bytes))
                    .filter(|&a| region_of(a) == region_of(b.ptr));
                let Some(addr) = addr else {
                    return Err(format!(
                        "pointer offset {off} (x {size} bytes) at {} (row {r}, column {c} of the matrix) \
                         moves the pointer out of its buffer's address range; no buffer is that large",
                        lane_str(&block, lane)
                    ));
                };
                ptrs[lane] = addr;
                mask[lane] = 1;
            }
        }
        self.load(&Access { shape: &block, dtype }, &ptrs, Some(&mask), None)
    }

    /// Reads `read(bytes)` for every active lane; inactive lanes take `other`
    /// (or `zero`).
    #[allow(clippy::too_many_arguments)]
    fn read_lanes<T: Copy>(
        &self,
        acc: &Access<'_>,
        ptrs: &[i64],
        mask: Option<&[i64]>,
        other: Option<&[T]>,
        zero: T,
        size: usize,
        read: impl Fn(&[u8]) -> T,
    ) -> Result<Vec<T>, String> {
        let on = |lane: usize| mask.is_none_or(|m| m.get(lane).or(m.first()).is_some_and(|&x| x != 0));
        let mut out = Vec::with_capacity(ptrs.len());
        let mut lane = 0;
        while lane < ptrs.len() {
            if !on(lane) {
                out.push(other.and_then(|o| o.get(lane).or(o.first()).copied()).unwrap_or(zero));
                lane += 1;
                continue;
            }
            // A run of active lanes at consecutive addresses is checked once and
            // read in bulk; any problem falls back to the per-lane `locate`,
            // which reports the first bad lane exactly.
            let end = self.run_end(ptrs, lane, size, &on);
            match self.run_bytes(ptrs[lane], size, end - lane) {
                Some((b, o)) => {
                    let bytes = &self.bufs[b].as_bytes()[o..o + (end - lane) * size];
                    out.extend(bytes.chunks_exact(size).map(&read));
                }
                None => {
                    for (l, &addr) in ptrs.iter().enumerate().take(end).skip(lane) {
                        let (b, o) = self.locate(addr, size, acc, l, "read")?;
                        out.push(read(&self.bufs[b].as_bytes()[o..o + size]));
                    }
                }
            }
            lane = end;
        }
        Ok(out)
    }

    /// The end of the run of active lanes from `lane` whose addresses step by `size`.
    fn run_end(&self, ptrs: &[i64], lane: usize, size: usize, on: &impl Fn(usize) -> bool) -> usize {
        let mut end = lane + 1;
        while end < ptrs.len() && ptrs[end] == ptrs[end - 1].wrapping_add(size as i64) && on(end) {
            end += 1;
        }
        end
    }

    /// The buffer and byte offset of a run of `count` elements of `size` bytes
    /// starting at `addr`, when all of it is inside one buffer and aligned.
    fn run_bytes(&self, addr: i64, size: usize, count: usize) -> Option<(usize, usize)> {
        let (b, off) = decode(addr);
        let b = usize::try_from(b).ok().filter(|&b| b < self.bufs.len())?;
        let o = usize::try_from(off).ok().filter(|&o| o & (size - 1) == 0)?;
        (o + count * size <= self.bufs[b].size_bytes()).then_some((b, o))
    }

    /// Stores `vals` (storage of `acc.dtype`) to `ptrs` where `mask` is set;
    /// a `strong` (ordered) store never races and clears the shadow.
    pub(crate) fn store(
        &mut self,
        acc: &Access<'_>,
        ptrs: &[i64],
        vals: &Data,
        mask: Option<&[i64]>,
        strong: bool,
    ) -> Result<(), String> {
        self.version += 1;
        macro_rules! lanes {
            ($variant:ident, $size:expr, |$x:ident| $bytes:expr) => {{
                let Data::$variant(v) = vals else {
                    return Err(super::tile::internal("stored value has the wrong storage".into()));
                };
                self.write_lanes(acc, ptrs, mask, $size, strong, |lane| {
                    let $x = v.get(lane).or(v.first()).copied().unwrap_or_default();
                    let mut out = [0u8; 8];
                    let b = $bytes;
                    out[..b.len()].copy_from_slice(&b);
                    out
                })
            }};
        }
        match acc.dtype {
            DType::F32 => lanes!(F32, 4, |x| x.to_le_bytes()),
            DType::F16 => lanes!(F32, 2, |x| f16::from_f32(x).to_le_bytes()),
            DType::BF16 => lanes!(F32, 2, |x| bf16::from_f32(x).to_le_bytes()),
            DType::F8E4M3 | DType::F8E5M2 => lanes!(F32, 1, |x| [f8_bits(acc.dtype, x)]),
            DType::F64 => lanes!(F64, 8, |x| x.to_le_bytes()),
            DType::I1 => lanes!(Int, 1, |x| [(x != 0) as u8]),
            DType::I8 | DType::U8 => lanes!(Int, 1, |x| [x as u8]),
            DType::I16 => lanes!(Int, 2, |x| (x as i16).to_le_bytes()),
            DType::I32 | DType::U32 => lanes!(Int, 4, |x| (x as u32).to_le_bytes()),
            DType::I64 => lanes!(Int, 8, |x| x.to_le_bytes()),
        }
    }

    /// Writes `bytes_of(lane)` to every active lane's address.
    fn write_lanes(
        &mut self,
        acc: &Access<'_>,
        ptrs: &[i64],
        mask: Option<&[i64]>,
        size: usize,
        strong: bool,
        bytes_of: impl Fn(usize) -> [u8; 8],
    ) -> Result<(), String> {
        let on = |lane: usize| mask.is_none_or(|m| m.get(lane).or(m.first()).is_some_and(|&x| x != 0));
        let mut lane = 0;
        while lane < ptrs.len() {
            if !on(lane) {
                lane += 1;
                continue;
            }
            // Runs of consecutive addresses are bounds-checked once (see `read_lanes`).
            let end = self.run_end(ptrs, lane, size, &on);
            match self.run_bytes(ptrs[lane], size, end - lane) {
                Some((b, o)) => {
                    for (j, l) in (lane..end).enumerate() {
                        self.put(b, o + j * size, &bytes_of(l)[..size], acc, l, strong)?;
                    }
                }
                None => {
                    for (l, &addr) in ptrs.iter().enumerate().take(end).skip(lane) {
                        let (b, o) = self.locate(addr, size, acc, l, "write")?;
                        self.put(b, o, &bytes_of(l)[..size], acc, l, strong)?;
                    }
                }
            }
            lane = end;
        }
        Ok(())
    }

    /// Writes `new` at byte `off` of buffer `b` (already bounds-checked), after
    /// the race check, which also updates the race shadow (a `strong` write
    /// clears the shadow instead).
    fn put(
        &mut self,
        b: usize,
        off: usize,
        new: &[u8],
        acc: &Access<'_>,
        lane: usize,
        strong: bool,
    ) -> Result<(), String> {
        if strong {
            if let Some(s) = self.shadow[b].get_mut(off..off + new.len()) {
                s.fill(0);
            }
        } else if self.track_races {
            // Another program's byte may only be overwritten with the same
            // value or when the memory model orders its store first; the
            // shadow then records this program as the bytes' writer.
            let me = self.current;
            if self.shadow[b].is_empty() {
                self.shadow[b] = vec![0; self.bufs[b].size_bytes()];
            }
            let old = &self.bufs[b].as_bytes()[off..off + new.len()];
            let shadow = &self.shadow[b][off..off + new.len()];
            let model = self.model.as_ref();
            let unordered = |i: usize| !model.is_some_and(|m| m.ordered(me - 1, shadow[i] - 1, b, off + i));
            if let Some(i) = (0..new.len())
                .find(|&i| shadow[i] != 0 && shadow[i] != me && old[i] != new[i] && unordered(i))
            {
                let other = self.coords(shadow[i] - 1);
                let d = acc.dtype;
                return Err(format!(
                    "write-write race: {} stores {} to byte offset {off} of buffer {} ({}), \
                     but {} already stored a different value there ({}); programs must not \
                     store different values to one address (use atomics, or partition the output)",
                    pid_str(self.coords(me - 1)),
                    fmt_bytes(d, new),
                    self.name(b),
                    lane_str(acc.shape, lane),
                    pid_str(other),
                    fmt_bytes(d, old),
                ));
            }
            self.shadow[b][off..off + new.len()].fill(me);
            let len = self.bufs[b].size_bytes();
            if let Some(m) = &mut self.model {
                m.write(self.current - 1, b, len, off, new.len(), base_addr(b) + off as i64);
            }
        }
        self.bufs[b].as_bytes_mut()[off..off + new.len()].copy_from_slice(new);
        Ok(())
    }

    /// The happens-before check of a plain load of `ptrs` (which succeeded,
    /// so every active lane is in bounds): every byte another program wrote
    /// must be ordered before this read (see `model.rs`).
    pub(crate) fn check_reads(
        &self,
        acc: &Access<'_>,
        ptrs: &[i64],
        mask: Option<&[i64]>,
    ) -> Result<(), String> {
        let Some(m) = &self.model else { return Ok(()) };
        let me = self.current;
        let size = acc.dtype.size_bytes();
        for (lane, &addr) in ptrs.iter().enumerate() {
            let on = mask.is_none_or(|m| m.get(lane).or(m.first()).is_some_and(|&x| x != 0));
            if !on {
                continue;
            }
            let (b, off) = decode(addr);
            let (Ok(b), Ok(off)) = (usize::try_from(b), usize::try_from(off)) else { continue };
            let Some(shadow) = self.shadow.get(b).and_then(|s| s.get(off..off + size)) else { continue };
            for (k, &w) in shadow.iter().enumerate() {
                if w == 0 || w == me || m.ordered(me - 1, w - 1, b, off + k) {
                    continue;
                }
                let (reader, writer) = (pid_str(self.coords(me - 1)), pid_str(self.coords(w - 1)));
                let at = format!(
                    "byte offset {} of buffer {} ({})",
                    off + k,
                    self.name(b),
                    lane_str(acc.shape, lane)
                );
                return Err(match m.missing(w - 1, b, off + k) {
                    Missing::Release => format!(
                        "missing release: {reader} reads {at}, which {writer} stored and has not released \
                         since, so nothing orders that store before this read; {writer} must publish it \
                         with a release after the store (a store or atomic with `sem = release`) that \
                         {reader} acquires (`wait_until`, or a load with `sem = acquire`)"
                    ),
                    Missing::Acquire => format!(
                        "missing acquire: {reader} reads {at}, which {writer} stored and then released, \
                         but {reader} has not acquired that release, so nothing orders the store before \
                         this read; wait for the flag with `wait_until` (acquire) or load it with \
                         `sem = acquire` before reading"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The active lanes' addresses.
    fn active(ptrs: &[i64], mask: Option<&[i64]>) -> Vec<i64> {
        ptrs.iter()
            .enumerate()
            .filter(|&(lane, _)| mask.is_none_or(|m| m.get(lane).or(m.first()).is_some_and(|&x| x != 0)))
            .map(|(_, &a)| a)
            .collect()
    }

    /// The acquire side of a strong access of `ptrs` with ordering `o` by
    /// the running program (see `model.rs`).
    pub(crate) fn acquire(&mut self, o: MemOrder, ptrs: &[i64], mask: Option<&[i64]>) {
        if self.model.is_none() {
            return;
        }
        let addrs = Self::active(ptrs, mask);
        let me = self.current - 1;
        if let Some(m) = &mut self.model {
            m.acquire(me, o, &addrs);
        }
    }

    /// The release side of a strong store (`rmw` false) or atomic of `ptrs`
    /// with ordering `o` by the running program (see `model.rs`).
    pub(crate) fn release(&mut self, o: MemOrder, ptrs: &[i64], mask: Option<&[i64]>, rmw: bool) {
        if self.model.is_none() {
            return;
        }
        let addrs = Self::active(ptrs, mask);
        let me = self.current - 1;
        if let Some(m) = &mut self.model {
            m.release(me, o, &addrs, rmw);
        }
    }

    /// Runs a per-lane read-modify-write: for every lane with the mask set,
    /// `update(lane, old_bytes)` returns the new bytes (or `None` to leave memory
    /// unchanged). Lanes run in order, so lanes hitting one address see each
    /// other's updates, as serialized atomics do. Returns the old bytes per lane
    /// (`None` for masked-off lanes).
    pub(crate) fn atomic(
        &mut self,
        acc: &Access<'_>,
        ptrs: &[i64],
        mask: Option<&[i64]>,
        mut update: impl FnMut(usize, &[u8]) -> Result<Option<[u8; 8]>, String>,
    ) -> Result<Vec<Option<[u8; 8]>>, String> {
        self.version += 1;
        let size = acc.dtype.size_bytes();
        let mut olds = Vec::with_capacity(ptrs.len());
        for (lane, &addr) in ptrs.iter().enumerate() {
            let on = mask.is_none_or(|m| m.get(lane).or(m.first()).is_some_and(|&x| x != 0));
            if !on {
                olds.push(None);
                continue;
            }
            let (b, off) = self.locate(addr, size, acc, lane, "atomic update")?;
            let mut old = [0u8; 8];
            old[..size].copy_from_slice(&self.bufs[b].as_bytes()[off..off + size]);
            if let Some(new) = update(lane, &old[..size])? {
                self.bufs[b].as_bytes_mut()[off..off + size].copy_from_slice(&new[..size]);
                if let Some(s) = self.shadow[b].get_mut(off..off + size) {
                    s.fill(0);
                }
            }
            olds.push(Some(old));
        }
        Ok(olds)
    }
}

/// The grid coordinates of a linear program id (row-major: axis 2 fastest).
pub(crate) fn coords(grid: [u32; 3], linear: u32) -> [u32; 3] {
    let (gy, gz) = (u64::from(grid[1].max(1)), u64::from(grid[2].max(1)));
    let l = u64::from(linear);
    [(l / (gy * gz)) as u32, ((l / gz) % gy) as u32, (l % gz) as u32]
}

/// Formats the little-endian bytes of one `dtype` element for messages.
fn fmt_bytes(dtype: DType, b: &[u8]) -> String {
    if b.len() != dtype.size_bytes() {
        return format!("{b:?}");
    }
    let v = super::buffer::read_f64(dtype, b);
    if dtype.is_float() { format!("{v:?}") } else { format!("{}", v as i64) }
}
