//! The weights of a GGUF Llama on a [`Device`], laid out for the library
//! kernels: projections repacked (still quantized, [`kernels::dequant::repack()`]),
//! Q, K and V concatenated into one fused QKV matrix (rows Q, then K, then V:
//! one product gives the row `kernels::rope::rope_kv_write` reads), gate and
//! up interleaved for the fused SiLU-mul product, norm weights converted to
//! the activation dtype `T`, a Q8_0 token embedding kept raw for
//! `kernels::embedding` (and repacked as the LM head when the head is
//! tied), a table in another format repacked for `embedding_repacked` (the
//! LM head's planes when tied).
//!
//! The architecture's vectors ([`ArchVectors`]: RoPE frequency factors, QKV
//! biases, Q/K head-norm weights) are kept in f32, as llama.cpp keeps them,
//! for `kernels::rope::rope_arch_kv_write`.
//!
//! Invariants: every matrix is validated by the repack (shape, whole blocks,
//! 32-bit offsets); the QKV rows are `(n_head + 2 n_head_kv) * head_dim` by
//! `n_embd`; gate/up has `2 n_ff` rows; no GGUF value reaches an index
//! without a check (errors, never panics).

use super::device::Device;
use crate::error::{Error, Result};
use crate::gguf::llama::{ROPE_FREQS, layer_tensor};
use crate::gguf::{GgmlType, Gguf, LlamaConfig, RopeStyle};
use crate::model::ActElem;
use dsl_core::half::f16;
use kernels::decode_step::STRIDE_ALIGN;
use kernels::dequant::{QuantFormat, Repacked, interleave_gate_up, q8_0_as_q5_1, repack};

/// A repacked quantized matrix `W[n, k]` on a device.
pub struct Matrix<D: Device> {
    /// The block format.
    pub format: QuantFormat,
    /// Rows (output features).
    pub n: usize,
    /// Columns (input features).
    pub k: usize,
    /// The quant plane.
    pub quants: D::Buf<u8>,
    /// The scale plane.
    pub scales: D::Buf<f16>,
}

impl<D: Device> Matrix<D> {
    /// Uploads a repacked matrix.
    pub fn upload(dev: &mut D, r: &Repacked) -> Result<Matrix<D>> {
        Ok(Matrix {
            format: r.format,
            n: r.n,
            k: r.k,
            quants: dev.upload(&r.quants)?,
            scales: dev.upload(&r.scales)?,
        })
    }
}

/// A view of a repacked matrix `W[n, k]` inside device planes: its quants
/// from byte `q_off` of `quants`, its scales from entry `s_off` of `scales`.
pub struct MatRef<'a, D: Device> {
    /// The block format.
    pub format: QuantFormat,
    /// Rows (output features).
    pub n: usize,
    /// Columns (input features).
    pub k: usize,
    /// The quant plane holding it.
    pub quants: &'a D::Buf<u8>,
    /// Its first byte there.
    pub q_off: usize,
    /// The scale plane holding it.
    pub scales: &'a D::Buf<f16>,
    /// Its first scale entry there.
    pub s_off: usize,
}

impl<D: Device> Clone for MatRef<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device> Copy for MatRef<'_, D> {}

impl<'a, D: Device + 'a> MatRef<'a, D> {
    /// The product's output columns: all `n` rows, or half of them under the
    /// fused SiLU-mul (gate and up rows interleaved, one output per pair).
    pub fn n_out(&self, silu: bool) -> usize {
        if silu { self.n / 2 } else { self.n }
    }

    /// Pointers to its first quant byte and its first scale, as a product
    /// kernel's `q_ptr` and `s_ptr` take them.
    pub fn planes(&self) -> Result<(D::Ptr<'a, u8>, D::Ptr<'a, f16>)> {
        Ok((D::ptr_at::<u8, u8>(self.quants, self.q_off)?, D::ptr_at::<f16, f16>(self.scales, self.s_off)?))
    }
}

impl<D: Device> Matrix<D> {
    /// The whole matrix as a view.
    pub fn view(&self) -> MatRef<'_, D> {
        MatRef {
            format: self.format,
            n: self.n,
            k: self.k,
            quants: &self.quants,
            q_off: 0,
            scales: &self.scales,
            s_off: 0,
        }
    }
}

/// Where one layer's matrix of a [`Kind`] lies in that kind's stacked planes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The block format.
    pub format: QuantFormat,
    /// Rows.
    pub n: usize,
    /// Columns.
    pub k: usize,
    /// First byte of its quants.
    pub q_off: usize,
    /// First entry of its scales.
    pub s_off: usize,
}

/// The projection kinds of a block, each stored for all layers in one pair
/// of planes (layer after layer), so a persistent kernel reaches layer `l`'s
/// matrix at a fixed stride from layer 0's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Fused QKV.
    Qkv = 0,
    /// Attention output.
    O = 1,
    /// Interleaved gate/up.
    GateUp = 2,
    /// Down.
    Down = 3,
}

impl Kind {
    /// Every kind, in the order of their planes.
    pub const ALL: [Kind; 4] = [Kind::Qkv, Kind::O, Kind::GateUp, Kind::Down];
}

/// The weights of one transformer block: where its matrices lie in the
/// stacked planes ([`Weights::mat`]); its norm weights are at `l * n_embd`
/// of [`Weights::attn_norm`] and [`Weights::ffn_norm`].
pub struct Layer {
    /// Fused QKV projection, `[(n_head + 2 n_head_kv) * head_dim, n_embd]`,
    /// or its first rows when Q, K and V differ in format
    /// ([`Weights::qkv_parts`]).
    pub qkv: Slot,
    /// The further runs of QKV rows, each of one format, in row order (empty
    /// when the QKV matrix is one format).
    pub qkv_rest: Vec<Slot>,
    /// Attention output projection, `[n_embd, n_head * head_dim]`.
    pub o: Slot,
    /// Interleaved gate/up, `[2 n_ff, n_embd]` (row `2j` gate `j`, `2j + 1` up `j`).
    pub gate_up: Slot,
    /// Down projection, `[n_embd, n_ff]`.
    pub down: Slot,
}

impl Layer {
    /// The slot of its matrix of `kind` (the first run of QKV rows).
    pub fn slot(&self, kind: Kind) -> &Slot {
        match kind {
            Kind::Qkv => &self.qkv,
            Kind::O => &self.o,
            Kind::GateUp => &self.gate_up,
            Kind::Down => &self.down,
        }
    }

    /// [`Layer::slot`], to move it.
    fn slot_mut(&mut self, kind: Kind) -> &mut Slot {
        match kind {
            Kind::Qkv => &mut self.qkv,
            Kind::O => &mut self.o,
            Kind::GateUp => &mut self.gate_up,
            Kind::Down => &mut self.down,
        }
    }
}

/// The f32 vectors of an architecture's RoPE step, in one buffer: where
/// each part starts (`None`: the model has none).
pub struct ArchVectors<D: Device> {
    /// The values (at least one element, so it can always be passed).
    pub buf: D::Buf<f32>,
    /// RoPE frequency divisors, `[head_dim / 2]`: `rope_freqs.weight` times
    /// the linear scaling factor.
    pub factors: Option<usize>,
    /// Per layer the fused QKV row's bias, `[n_layers, (n_head + 2 n_head_kv) * head_dim]`.
    pub bias: Option<usize>,
    /// Per layer the Q then K head-norm weights, `[n_layers, 2 head_dim]`.
    pub qk_norm: Option<usize>,
}

impl<D: Device> ArchVectors<D> {
    /// Whether the plain `rope_kv_write` computes this model's RoPE step
    /// (adjacent pairs, nothing else).
    pub fn plain(&self, c: &LlamaConfig) -> bool {
        c.arch.rope == RopeStyle::Norm
            && self.factors.is_none()
            && self.bias.is_none()
            && self.qk_norm.is_none()
    }
}

/// A Llama's weights on a device, in activation dtype `T`.
pub struct Weights<D: Device, T: ActElem> {
    /// The hyperparameters.
    pub config: LlamaConfig,
    /// The raw token embedding table, Q8_0 (`vocab * n_embd / 32 * 34`
    /// bytes); one unused byte when the table is repacked.
    pub embedding: D::Buf<u8>,
    /// The embedding table's format.
    pub embedding_format: QuantFormat,
    /// The embedding table repacked (`[vocab, n_embd]`) when its format is
    /// not Q8_0 (llama.cpp's K-quant files store it in Q4_K or Q6_K, F16
    /// files in F16) and it is not the LM head's
    /// ([`Weights::embedding_table`]).
    pub embedding_repacked: Option<Matrix<D>>,
    /// The blocks.
    pub layers: Vec<Layer>,
    /// Every layer's matrices of each [`Kind`] (indexed by it): quants, scales.
    pub planes: Vec<(D::Buf<u8>, D::Buf<f16>)>,
    /// The RMSNorm weights before attention, `[n_layers, n_embd]`.
    pub attn_norm: D::Buf<T>,
    /// The RMSNorm weights before the MLP, `[n_layers, n_embd]`.
    pub ffn_norm: D::Buf<T>,
    /// The final RMSNorm weight, `[n_embd]`.
    pub output_norm: D::Buf<T>,
    /// The LM head, `[vocab, n_embd]` (the embedding repacked when tied).
    pub lm_head: Matrix<D>,
    /// The architecture's RoPE-step vectors.
    pub arch: ArchVectors<D>,
    /// Per layer, bit `j` set where the layer's matrix of [`Kind`] `j` is
    /// in the kind's second format ([`Weights::stride`]; llama.cpp's mixed
    /// quantizations pick some matrices' formats per layer).
    pub layer_alt: D::Buf<i32>,
}

/// How a [`Kind`]'s matrices lie in its planes when the persistent step can
/// reach them all from layer 0's ([`Weights::stride`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindStride {
    /// Layer 0's format and the other layers' other one (the same when the
    /// layers agree).
    pub formats: [QuantFormat; 2],
    /// Quant bytes from one layer's matrix to the next.
    pub qs: usize,
    /// Scale entries from one layer's matrix to the next.
    pub ss: usize,
}

/// Whether the gather kernels read `format`'s GGUF table as stored (Q8_0,
/// SmolLM2's) rather than repacked.
fn raw_embedding(format: QuantFormat) -> bool {
    format == QuantFormat::Q8_0
}

impl<D: Device, T: ActElem> Weights<D, T> {
    /// The repacked embedding table (`None` for the raw formats: see
    /// [`Weights::embedding_repacked`]): its own, or the tied LM head.
    pub fn embedding_table(&self) -> Option<&Matrix<D>> {
        (!raw_embedding(self.embedding_format))
            .then(|| self.embedding_repacked.as_ref().unwrap_or(&self.lm_head))
    }

    /// Layer `l`'s matrix of `kind`.
    pub fn mat(&self, l: usize, kind: Kind) -> MatRef<'_, D> {
        self.slot_ref(kind, self.layers[l].slot(kind))
    }

    /// The view of `slot` in `kind`'s planes.
    fn slot_ref(&self, kind: Kind, slot: &Slot) -> MatRef<'_, D> {
        let (quants, scales) = &self.planes[kind as usize];
        MatRef {
            format: slot.format,
            n: slot.n,
            k: slot.k,
            quants,
            q_off: slot.q_off,
            scales,
            s_off: slot.s_off,
        }
    }

    /// Layer `l`'s QKV product as matrices of one format each, with the
    /// output column each one starts at: one matrix unless Q, K and V
    /// differ in format (see [`fuse_rows`]).
    pub fn qkv_parts(&self, l: usize) -> Vec<(MatRef<'_, D>, usize)> {
        let layer = &self.layers[l];
        let mut col = 0;
        std::iter::once(&layer.qkv)
            .chain(&layer.qkv_rest)
            .map(|s| {
                col += s.n;
                (self.slot_ref(Kind::Qkv, s), col - s.n)
            })
            .collect()
    }

    /// Layer `l`'s attention norm weights: buffer and element offset.
    pub fn attn_norm(&self, l: usize) -> (&D::Buf<T>, usize) {
        (&self.attn_norm, l * self.config.n_embd)
    }

    /// Layer `l`'s MLP norm weights: buffer and element offset.
    pub fn ffn_norm(&self, l: usize) -> (&D::Buf<T>, usize) {
        (&self.ffn_norm, l * self.config.n_embd)
    }

    /// The formats and per-layer strides of `kind`'s planes, when every
    /// layer's matrix of that kind has the same shape, one of at most two
    /// formats, and lies at a fixed stride from layer 0's (the loader pads
    /// matrices of two formats to one stride); `None` otherwise, and for a
    /// QKV product split into runs of formats ([`Weights::qkv_parts`]).
    pub fn stride(&self, kind: Kind) -> Option<KindStride> {
        if self.layers.is_empty() || (kind == Kind::Qkv && self.layers.iter().any(|l| !l.qkv_rest.is_empty()))
        {
            return None;
        }
        let first = self.mat(0, kind);
        let (qs, ss) = match self.layers.len() {
            1 => (0, 0),
            _ => {
                let b = self.mat(1, kind);
                (b.q_off - first.q_off, b.s_off - first.s_off)
            }
        };
        let other = (0..self.layers.len()).map(|l| self.mat(l, kind).format).find(|&f| f != first.format);
        let formats = [first.format, other.unwrap_or(first.format)];
        let regular = (0..self.layers.len()).all(|l| {
            let m = self.mat(l, kind);
            formats.contains(&m.format)
                && m.n == first.n
                && m.k == first.k
                && m.q_off == l * qs
                && m.s_off == l * ss
        });
        regular.then_some(KindStride { formats, qs, ss })
    }
}

/// The quant bytes and scale entries of a matrix in `slot`'s format and shape.
fn plane_lens(slot: &Slot) -> (usize, usize) {
    slot.format.kernel_format().plane_lens(slot.n, slot.k)
}

/// Lays a kind's matrices out again, layer `l`'s at `l` times one stride,
/// when they share a shape and come in exactly two formats (llama.cpp's
/// mixed quantizations: down in Q4_K or Q6_K by layer): each is padded to
/// the larger, in whole lines of [`STRIDE_ALIGN`] bytes, so the persistent
/// step reaches every layer's matrix from layer 0's ([`Weights::stride`]).
/// `slots` are the kind's slots in layer order, one per layer; other
/// planes are left as they are.
fn pad_to_one_stride(plane: &mut Repacked, slots: &mut [&mut Slot]) {
    let Some(first) = slots.first().map(|s| **s) else { return };
    let mut formats: Vec<QuantFormat> = slots.iter().map(|s| s.format).collect();
    formats.sort_by_key(|f| f.name());
    formats.dedup();
    if formats.len() != 2 || slots.iter().any(|s| (s.n, s.k) != (first.n, first.k)) {
        return;
    }
    let (q_max, s_max) =
        slots.iter().map(|s| plane_lens(s)).fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let (qs, ss) = (q_max.next_multiple_of(STRIDE_ALIGN), s_max.next_multiple_of(STRIDE_ALIGN / 2));
    let mut quants = vec![0u8; qs * slots.len()];
    let mut scales = vec![f16::ZERO; ss * slots.len()];
    for (l, slot) in slots.iter_mut().enumerate() {
        let (q, s) = plane_lens(slot);
        quants[l * qs..][..q].copy_from_slice(&plane.quants[slot.q_off..][..q]);
        scales[l * ss..][..s].copy_from_slice(&plane.scales[slot.s_off..][..s]);
        (slot.q_off, slot.s_off) = (l * qs, l * ss);
    }
    (plane.quants, plane.scales) = (quants, scales);
}

/// The kernels' format of a GGUF type, or an error naming the tensor.
fn format_of(name: &str, ty: GgmlType) -> Result<QuantFormat> {
    ty.quant_format().ok_or_else(|| {
        Error::Unsupported(format!(
            "{name} is {}; the matrix kernels take Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16 or BF16",
            ty.name()
        ))
    })
}

fn repack_error(name: &str, e: kernels::dequant::RepackError) -> Error {
    Error::Usage(format!("{name}: {e}"))
}

/// Repacks the GGUF matrix `name`, checking that it is `[n, k]`.
pub fn repack_tensor(gguf: &Gguf, name: &str, n: usize, k: usize) -> Result<Repacked> {
    let view = gguf.tensor(name)?;
    let dims = view.dims();
    if dims.len() != 2 || dims[0] != k as u64 || dims[1] != n as u64 {
        return Err(Error::Usage(format!("{name} has shape {dims:?}; expected [{k}, {n}] (ggml order)")));
    }
    let format = format_of(name, view.ty())?;
    repack(format, gguf.tensor_bytes(name)?, n, k).map_err(|e| repack_error(name, e))
}

/// Concatenates the rows of matrices of one width into runs of one format
/// each, in order: one matrix when every part has the same format (after
/// Q8_0 parts beside Q5_1 ones, as in llama.cpp's Q5_K_M files of small
/// models, are converted exactly to Q5_1 planes by [`q8_0_as_q5_1`]),
/// otherwise one per run of equal formats (Q4_K_M files: Q and K in Q4_K,
/// V in Q6_K), which the model multiplies one after the other into column
/// ranges of one output.
///
/// Errors: no parts, parts of different widths, a malformed part.
pub fn fuse_rows(name: &str, parts: &[Repacked]) -> Result<Vec<Repacked>> {
    if let (Some(first), Some(p)) = (parts.first(), parts.iter().find(|p| p.k != parts[0].k)) {
        return Err(Error::Unsupported(format!(
            "{name}: cannot fuse {} with {}",
            first.describe(),
            p.describe()
        )));
    }
    match concat_rows(name, parts) {
        Ok(one) => Ok(vec![one]),
        Err(Error::Unsupported(_)) => {
            parts.chunk_by(|a, b| a.format == b.format).map(|run| concat_rows(name, run)).collect()
        }
        Err(e) => Err(e),
    }
}

/// Concatenates the rows of matrices of one format and width. Q8_0 parts
/// beside Q5_1 ones are converted exactly to Q5_1 planes first
/// ([`q8_0_as_q5_1`]).
///
/// Errors: parts whose formats or widths differ ([`Error::Unsupported`]).
pub fn concat_rows(name: &str, parts: &[Repacked]) -> Result<Repacked> {
    let converted: Vec<Repacked>;
    let parts = if parts.iter().any(|p| p.format == QuantFormat::Q5_1)
        && parts.iter().any(|p| p.format == QuantFormat::Q8_0)
    {
        converted = parts.iter().map(|p| q8_0_as_q5_1(p).unwrap_or_else(|| p.clone())).collect();
        &converted[..]
    } else {
        parts
    };
    let first = parts.first().ok_or_else(|| Error::Usage(format!("{name}: nothing to concatenate")))?;
    let mut out = Repacked { format: first.format, n: 0, k: first.k, quants: Vec::new(), scales: Vec::new() };
    for p in parts {
        if p.format != first.format || p.k != first.k {
            return Err(Error::Unsupported(format!(
                "{name}: cannot fuse {} with {}",
                first.describe(),
                p.describe()
            )));
        }
        out.n += p.n;
        out.quants.extend_from_slice(&p.quants);
        out.scales.extend_from_slice(&p.scales);
    }
    out.validate().map_err(|e| repack_error(name, e))?;
    Ok(out)
}

/// Reads the F32 (or other dequantizable) vector `name` of `len` values, in `T`.
fn norm_weight<T: ActElem>(gguf: &Gguf, name: &str, len: usize) -> Result<Vec<T>> {
    Ok(vector(gguf, name, len)?.into_iter().map(|v| T::from_f64(v as f64)).collect())
}

/// Reads the F32 (or other dequantizable) vector `name` of `len` values.
fn vector(gguf: &Gguf, name: &str, len: usize) -> Result<Vec<f32>> {
    let view = gguf.tensor(name)?;
    if view.dims() != [len as u64] {
        return Err(Error::Usage(format!("{name} has shape {:?}; expected [{len}]", view.dims())));
    }
    Ok(view.to_f32())
}

/// The architecture's RoPE-step vectors of `gguf` on `dev` (see
/// [`ArchVectors`]); errors name a missing or mis-shaped tensor.
fn arch_vectors<D: Device>(dev: &mut D, gguf: &Gguf, c: &LlamaConfig) -> Result<ArchVectors<D>> {
    let mut host = Vec::new();
    let divisor = c.rope_scaling.divisor();
    let file_factors = match gguf.tensor_info(ROPE_FREQS) {
        Ok(_) => Some(vector(gguf, ROPE_FREQS, c.head_dim / 2)?),
        Err(_) => None,
    };
    let factors = match file_factors {
        Some(f) => Some(f.into_iter().map(|x| x * divisor).collect::<Vec<f32>>()),
        None if divisor != 1.0 => Some(vec![divisor; c.head_dim / 2]),
        None => None,
    };
    if let Some(f) = &factors
        && let Some(bad) = f.iter().find(|x| !(x.is_finite() && **x > 0.0))
    {
        return Err(Error::Usage(format!("{ROPE_FREQS}: factor {bad} is not finite and positive")));
    }
    let mut put = |v: Vec<f32>| {
        let at = host.len();
        host.extend(v);
        at
    };
    let factors = factors.map(&mut put);
    let (q, kv) = (c.n_embd_q(), c.n_embd_kv());
    let bias = if c.arch.qkv_bias {
        let mut all = Vec::with_capacity(c.n_layers * (q + 2 * kv));
        for l in 0..c.n_layers {
            for (name, n) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                all.extend(vector(gguf, &format!("blk.{l}.{name}.bias"), n)?);
            }
        }
        Some(put(all))
    } else {
        None
    };
    let qk_norm = if c.arch.qk_norm {
        let mut all = Vec::with_capacity(c.n_layers * 2 * c.head_dim);
        for l in 0..c.n_layers {
            for name in ["attn_q_norm", "attn_k_norm"] {
                all.extend(vector(gguf, &layer_tensor(l, name), c.head_dim)?);
            }
        }
        Some(put(all))
    } else {
        None
    };
    if host.is_empty() {
        host.push(0.0);
    }
    Ok(ArchVectors { buf: dev.upload(&host)?, factors, bias, qk_norm })
}

impl<D: Device, T: ActElem> Weights<D, T> {
    /// Loads and repacks a GGUF Llama onto `dev`.
    ///
    /// Errors: a missing or mis-shaped tensor, a matrix type the kernels do
    /// not take, a token embedding other than Q8_0, or a device error.
    pub fn load(dev: &mut D, gguf: &Gguf) -> Result<Weights<D, T>> {
        Weights::load_with_progress(dev, gguf, &mut |_, _| {})
    }

    /// [`Weights::load`], calling `progress(done, total)` after each of the
    /// `total` = layers + 1 upload units (the embedding and LM head first,
    /// then one per layer), so callers can draw a progress bar.
    pub fn load_with_progress(
        dev: &mut D,
        gguf: &Gguf,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Weights<D, T>> {
        let config = LlamaConfig::from_metadata(gguf.metadata())?;
        let c = &config;
        if c.rope_dim != c.head_dim {
            return Err(Error::Unsupported(format!(
                "partial RoPE ({} of {} dimensions)",
                c.rope_dim, c.head_dim
            )));
        }
        let (e, q_rows, kv_rows) = (c.n_embd, c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let arch = arch_vectors(dev, gguf, c)?;
        let emb = gguf.tensor("token_embd.weight")?;
        let embedding_format = format_of("token_embd.weight", emb.ty())?;
        if emb.dims() != [e as u64, c.vocab_size as u64] || e * c.vocab_size >= 1 << 30 {
            return Err(Error::Unsupported(format!(
                "token_embd.weight is {} {:?}; the embedding kernels take [{e}, {}] tables of fewer than 2^30 values",
                emb.ty().name(),
                emb.dims(),
                c.vocab_size
            )));
        }
        let head_name =
            if gguf.tensor_info("output.weight").is_ok() { "output.weight" } else { "token_embd.weight" };
        // A repacked table tied to the LM head is the head's planes.
        let (embedding, embedding_repacked) = if raw_embedding(embedding_format) {
            (dev.upload(gguf.tensor_bytes("token_embd.weight")?)?, None)
        } else if head_name == "token_embd.weight" {
            (dev.upload(&[0u8])?, None)
        } else {
            let table = repack_tensor(gguf, "token_embd.weight", c.vocab_size, e)?;
            (dev.upload(&[0u8])?, Some(Matrix::upload(dev, &table)?))
        };
        let head = repack_tensor(gguf, head_name, c.vocab_size, e)?;
        let lm_head = Matrix::upload(dev, &head)?;
        let output_norm = dev.upload(&norm_weight::<T>(gguf, "output_norm.weight", e)?)?;
        let total = c.n_layers + 1;
        progress(1, total);

        let mut layers = Vec::with_capacity(c.n_layers);
        let mut host: Vec<Repacked> = (0..4)
            .map(|_| Repacked { format: QuantFormat::Q8_0, n: 0, k: 0, quants: vec![], scales: vec![] })
            .collect();
        let (mut attn_norm, mut ffn_norm) =
            (Vec::with_capacity(c.n_layers * e), Vec::with_capacity(c.n_layers * e));
        // Appends a layer's matrix to its kind's planes and returns its slot.
        let mut put = |kind: Kind, r: Repacked| -> Slot {
            let plane = &mut host[kind as usize];
            let slot = Slot {
                format: r.format,
                n: r.n,
                k: r.k,
                q_off: plane.quants.len(),
                s_off: plane.scales.len(),
            };
            plane.quants.extend_from_slice(&r.quants);
            plane.scales.extend_from_slice(&r.scales);
            slot
        };
        for l in 0..c.n_layers {
            let name = |t: &str| layer_tensor(l, t);
            let q = repack_tensor(gguf, &name("attn_q"), q_rows, e)?;
            let k = repack_tensor(gguf, &name("attn_k"), kv_rows, e)?;
            let v = repack_tensor(gguf, &name("attn_v"), kv_rows, e)?;
            let mut qkv = fuse_rows(&format!("blk.{l}.qkv"), &[q, k, v])?.into_iter();
            let o = repack_tensor(gguf, &name("attn_output"), e, q_rows)?;
            let gate = repack_tensor(gguf, &name("ffn_gate"), c.n_ff, e)?;
            let up = repack_tensor(gguf, &name("ffn_up"), c.n_ff, e)?;
            let gate_up =
                interleave_gate_up(&gate, &up).map_err(|err| repack_error(&name("ffn_gate"), err))?;
            let down = repack_tensor(gguf, &name("ffn_down"), e, c.n_ff)?;
            attn_norm.extend(norm_weight::<T>(gguf, &name("attn_norm"), e)?);
            ffn_norm.extend(norm_weight::<T>(gguf, &name("ffn_norm"), e)?);
            let first = qkv.next().ok_or_else(|| Error::Usage(format!("blk.{l}: no QKV rows")))?;
            layers.push(Layer {
                qkv: put(Kind::Qkv, first),
                qkv_rest: qkv.map(|r| put(Kind::Qkv, r)).collect(),
                o: put(Kind::O, o),
                gate_up: put(Kind::GateUp, gate_up),
                down: put(Kind::Down, down),
            });
            progress(l + 2, total);
        }
        let single_qkv = layers.iter().all(|l| l.qkv_rest.is_empty());
        for kind in Kind::ALL {
            if kind == Kind::Qkv && !single_qkv {
                continue;
            }
            let mut slots: Vec<&mut Slot> = layers.iter_mut().map(|l| l.slot_mut(kind)).collect();
            pad_to_one_stride(&mut host[kind as usize], &mut slots);
        }
        // Bit `j` of layer `l`: its matrix of kind `j` differs in format
        // from layer 0's.
        let layer_alt: Vec<i32> = layers
            .iter()
            .map(|l| {
                Kind::ALL
                    .iter()
                    .map(|&kind| i32::from(l.slot(kind).format != layers[0].slot(kind).format) << kind as i32)
                    .sum()
            })
            .collect();
        let layer_alt = dev.upload(if layer_alt.is_empty() { &[0] } else { &layer_alt[..] })?;
        let mut planes = Vec::with_capacity(4);
        for p in &host {
            planes.push((dev.upload(&p.quants)?, dev.upload(&p.scales)?));
        }
        let attn_norm = dev.upload(&attn_norm)?;
        let ffn_norm = dev.upload(&ffn_norm)?;
        Ok(Weights {
            config,
            embedding,
            embedding_format,
            embedding_repacked,
            layers,
            planes,
            attn_norm,
            ffn_norm,
            output_norm,
            lm_head,
            arch,
            layer_alt,
        })
    }
}
