//! Token sampling on the GPU: greedy, temperature, min-p, top-k, top-p and a
//! seeded Philox draw ([`sample`]), vLLM's repetition/presence/frequency
//! penalties ([`penalties`]) and the token-count update that feeds them
//! ([`token_counts_add`]), and the grammar mask of constrained decoding
//! ([`apply_token_mask`]). Every per-row setting is data (device arrays), so
//! one launch serves a batch with mixed settings and the launches can be
//! captured in a CUDA graph: rows never branch on the host.
//!
//! # Math of [`sample`] (per row `r`, logits `x_i`, `i < vocab`)
//!
//! Settings: temperature `T`, `top_k` `k`, `top_p` `P`, `min_p` `M`, seed and
//! step. A row is *greedy* when `!(T >= 1e-5)` (zero, negative, tiny or NaN,
//! vLLM's epsilon) or `k == 1`; it returns the argmax (lowest index on ties).
//! Otherwise, all in f32:
//!
//! ```text
//! m     = max_i x_i                        (pass 1, with the argmax)
//! z_i   = x_i * (1 / T)                    (one reciprocal per row, then multiplies)
//! e_i   = exp(z_i - z_max)                 (z_max = m * (1 / T); e = 1 at the argmax)
//! w_i   = e_i if e_i >= min(M, 1) else 0   (min-p: p_i >= M * p_max  <=>  e_i >= M)
//! ```
//!
//! `w` is written to the workspace `ws` (pass 2); `e_i / sum(e)` is the
//! temperature-scaled softmax. The filters then apply in vLLM's order (min-p,
//! then top-k, then top-p on the top-k-renormalized distribution), each as a
//! threshold on `w`, so the kept set is always `{i : w_i >= tau}`:
//!
//! - top-k (when `0 < k < #{w > 0}`): `tau_k` = the k-th largest `w`
//!   (counting repeats). Tokens **tied** with the k-th are all kept (vLLM does
//!   the same: it masks `logits < kth_value`), so more than `k` may survive.
//! - top-p (when `P < 1`): with `S_k = sum_{w >= tau_k} w`, `tau_p` = the
//!   **largest** value `t` among the `w` such that `sum_{w_i >= t} w_i >= P *
//!   S_k`: the smallest prefix of the descending order whose mass reaches `P`
//!   (vLLM's "mass strictly above a token < P" rule). Tokens tied with the
//!   boundary token are all kept. `P <= 0` keeps the maximal tokens only.
//! - Otherwise the corresponding threshold is the previous one; with no filter
//!   at all `tau` is the smallest positive f32 (every `w > 0` is kept).
//!
//! Sums are f32 and a given set always sums to the same value (the same
//! lanes add the same terms in the same order; adding a skipped term's `0` is
//! exact), and f32 rounding is monotone, so `F(t) = sum_{w >= t}` is monotone
//! in `t` and the searches below are exact for the f32 values.
//!
//! The draw: one Philox-4x32-10 call (`randint`, i.e. word 0 of
//! `philox(key = seed, counter = (step, 0, 0, 0))`) per row and step gives
//! `u = (word >> 8) * 2^-24` in `[0, 1 - 2^-24]` (exactly representable, no
//! rounding up to 1). The token is the inverse CDF over the kept tokens in
//! vocabulary order: the smallest `i` with `sum_{j <= i, w_j >= tau} w_j > u *
//! S`, `S` the kept mass. This samples exactly from the renormalized kept
//! distribution, depends only on the row's own seed and step (not on the batch
//! or the launch grid), and needs one uniform per row instead of one per token
//! (a Gumbel-max draw would need a Philox call and two logarithms per token).
//! The walk's f32 prefix sums may round differently from `S` (a different
//! summation order); if they never pass `u * S` inside the tile that should
//! contain it, the tile's last kept token is taken, and if no tile does (only
//! possible for `u` within rounding of 1) the argmax is taken.
//!
//! Outputs per row: `ids[r]` (i32), `logprobs[r] = x_s - m - log(sum_i exp(x_i
//! - m))`, the log-probability of the chosen token under the softmax of the
//! logits as given to this kernel (after any penalties, before temperature and
//! the filters; vLLM's default "raw" logprobs), and `thresh[r] = tau`
//! (`+inf` for greedy rows, whose workspace row is not written). Rows must
//! hold at least one finite logit and no `+inf` or NaN; `-inf` masks a token.
//!
//! A greedy row's logprob sum `sum_i exp(x_i - m)` is exact in fixed point
//! ([`exp_units`]: each term, at most 1, truncated to a multiple of
//! `2^-40`, the integers summed in i64, the sum scaled back once), so it
//! depends on the row's logits only, not on the chunk, the warps, the
//! order or the programs that sum it; with the argmax (exact in any
//! order), a greedy row's outputs are the same bits in this kernel and in
//! the persistent decode step, which samples greedy rows itself over
//! slices of the row in several programs ([`crate::decode_step`]). A
//! sampled row's sum is an f32 sum (per-lane partials over the chunks,
//! then the chunk's lanes), which costs less per logit; sampled rows
//! always take this kernel.
//!
//! # Threshold search (no sorting)
//!
//! Every `w` lies in `[0, 1]`, where f32 values order like their bit patterns,
//! so a threshold is searched as an i32 key in `[lo, hi]`, `hi = bits(1.0)`
//! (the argmax) and `lo` the previous threshold (the smallest positive key
//! for the first search). Invariants: `F(lo) >= target`, the answer is in
//! `[lo, hi]` and `hi` is the bit pattern of some `w`. One pass over the
//! workspace row probes `t = lo + ceil((hi - lo) / 2)` and returns, in one
//! go, `count(w >= t)`, `mass(w >= t)`, `nxt = min{w >= t}` and `prv =
//! max{w < t}`; then `lo = nxt` if `F(t) >= target` else `hi = prv`. Snapping
//! both ends to actual values ends the search as soon as the interval holds a
//! single value, and `F(lo)` is carried along, which gives `S_k` and `S`
//! without extra passes. At most about 31 passes; a host simulation of this
//! search on LLM-like rows of 49152 tokens (a flat tail plus 0 to 1000 high
//! candidates, `k` 40..50, `P` 0.8..0.95) took 4 to 17 passes per search.
//!
//! Decisions are exact for the kernel's own f32 values; another backend (the
//! interpreter's correctly rounded `exp` against the GPU's `ex2.approx`, a
//! different reduction order) may decide differently only where a `w` lies
//! within a few ulps of a cut or a sum within a few 1e-6 of its target.
//!
//! # Tiling of [`sample`]
//!
//! One program per row (grid `[rows, 1, 1]`); the row is walked in `BLOCK`
//! chunks by runtime loops, so any `vocab` works with a fixed tile. Every
//! pass keeps per-lane accumulators (elementwise across chunks) and reduces
//! them once at its end. Passes: the argmax (1), then for greedy rows the
//! logprob sum (1); for sampled rows the exp/min-p/workspace pass (1), the
//! top-k and top-p searches (only when active), and the inverse-CDF walk
//! (one block sum per chunk, stopping at the chunk that holds the target,
//! then one `cumsum` of that chunk). After pass 1 the row is re-read from
//! L2 (a 49152-token f32 row is 192 KiB, bf16 half of it).
//!
//! # Layout contract
//!
//! - `logits`: `[rows, stride]` in `T` (f32, or the activation dtype, each
//!   value widened to f32 exactly as it is read), row-major, `stride >=
//!   vocab`; read only.
//! - `ws`: `[rows, stride]` f32 scratch, written for sampled rows (`w`
//!   above, `0` for filtered tokens, unnormalized); must not alias `logits`.
//! - Per-row settings, each `[rows]`: `temperature` f32, `top_k` i32 (`<= 0`
//!   or `>= #{w > 0}`, e.g. `vocab`: off), `top_p` f32 (`>= 1` or NaN: off),
//!   `min_p` f32 (`<= 0` or NaN: off, clamped to 1), `seed` i64 (the Philox
//!   key, all 64 bits), `step` i32 (the Philox counter, e.g. the sequence's
//!   output position; draws repeat after 2^32 steps).
//! - Outputs, each `[rows]`: `ids` i32, `logprobs` f32, `thresh` f32.
//! - Offsets are 32-bit: `rows * stride < 2^31`.
//!
//! # Penalties ([`penalties`]) and counts ([`token_counts_add`])
//!
//! vLLM's `apply_penalties`, in place on `logits` (f32, in this order):
//!
//! ```text
//! seen_i = prompt[s, i] > 0 || output[s, i] > 0
//! x_i    = x_i > 0 ? x_i / r : x_i * r       when seen_i (r = repetition penalty)
//! x_i    = x_i - f * output[s, i]            (frequency penalty, count as f32)
//! x_i    = x_i - p * (output[s, i] > 0)      (presence penalty)
//! ```
//!
//! `s = slot[b]` maps batch row `b` to its row of the count buffers (the
//! per-sequence state the runtime keeps across steps); a negative slot, or
//! `r = 1, f = 0, p = 0` (which change nothing), skips the row. The count
//! buffers are `[slots, vocab]` i32, contiguous: `prompt` counts the prompt's
//! tokens (only `> 0` matters), `output` the generated ones. Both are filled by
//! [`token_counts_add`] (`counts[slot[j], ids[j]] += 1` with atomics, so
//! repeated tokens of a prompt are fine; entries with a negative slot or an id
//! outside `[0, vocab)` are skipped): once with the prompt when a sequence
//! starts (after zeroing its rows) and once per decode step with the sampled
//! ids, so the host never reads the ids back. Grids: `penalties` `[rows,
//! cdiv(vocab, BLOCK)]`, `token_counts_add` `[cdiv(n, BLOCK)]`.
//!
//! # Constexprs
//!
//! - `BLOCK`: the chunk length (a power of two; [`block_for`]); for
//!   [`token_counts_add`] the entries per program.
//! - `num_warps`: [`warps_for`].

use dsl_macros::{kernel, kernel_fn};

/// Bit pattern of `1.0f32`: the largest `w` (the argmax's), the search's upper end.
const ONE_BITS: i32 = 0x3F80_0000;

/// Greedy threshold on the temperature (vLLM's `_SAMPLING_EPS`).
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// One search pass over the workspace row at probe `t`: `(count(w >= t),
/// mass(w >= t), min{w >= t}, max{w < t})`; lanes past `vocab` read `0`.
#[kernel_fn]
fn probe(ws_row: Tensor, vocab: Tensor, t: Tensor, block: usize) -> (Tensor, Tensor, Tensor, Tensor) {
    let cols = arange(0, block);
    let mut cnt = zeros([block], i32);
    let mut mass = zeros([block], f32);
    let mut nxt = full([block], f32::INFINITY, f32);
    let mut prv = zeros([block], f32);
    for c0 in range(0, vocab, block) {
        let c = c0 + cols;
        let w = load(ws_row + c, mask = c < vocab, other = 0.0);
        let ge = w >= t;
        cnt += ge.to(i32);
        mass += where_(ge, w, 0.0);
        nxt = minimum(nxt, where_(ge, w, f32::INFINITY));
        prv = maximum(prv, where_(ge, 0.0, w));
    }
    (sum(cnt, 0), sum(mass, 0), min(nxt, 0), max(prv, 0))
}

/// The largest key `t` in `[lo, bits(1.0)]` that is a `w` and has `F(t) >=
/// target` (`F` = count, or mass when `by_mass`), given `F(lo) >= target` and
/// `lo_mass = mass(w >= lo)`. Returns the key and its mass.
#[kernel_fn]
fn search(
    ws_row: Tensor,
    vocab: Tensor,
    lo: Tensor,
    lo_mass: Tensor,
    target: Tensor,
    by_mass: bool,
    block: usize,
) -> (Tensor, Tensor) {
    let mut lo = lo;
    let mut lo_mass = lo_mass;
    let mut hi = ONE_BITS;
    while lo < hi {
        let t = lo + (hi - lo + 1) / 2;
        let (cnt, mass, nxt, prv) = probe(ws_row, vocab, bitcast(t, f32), block);
        let f = if by_mass { mass } else { cnt.to(f32) };
        if f >= target {
            lo = bitcast(nxt, i32);
            lo_mass = mass;
        } else {
            hi = bitcast(prv, i32);
        }
    }
    (lo, lo_mass)
}

/// The units of [`exp_units`] in one: `2^40`.
const EXP_UNITS_LOG2: i32 = 40;

/// One unit of [`exp_units`]: `2^-40`.
const EXP_UNIT: f32 = 1.0 / (1u64 << EXP_UNITS_LOG2) as f32;

/// The weights `e` (f32, each in `[0, 1]`, the `exp(x - m)` of a row whose
/// maximum is `m`) as i64 multiples of `2^-40`, truncated: `e * 2^40` is
/// exact in f32 (a power-of-two scale of a value at most 1, subnormals
/// included, lands on a normal number below `2^41`) and its conversion to
/// i64 truncates, so each term is exactly `floor(e * 2^40)`. A row of up
/// to `2^23` tokens sums below `2^63`; each term loses less than `2^-40`,
/// so a row's sum (at least 1, the maximum's term) is off by at most
/// `vocab * 2^-40` before its one rounding to f32 ([`units_to_f32`]).
#[kernel_fn]
pub fn exp_units(e: Tensor) -> Tensor {
    (e * (1u64 << EXP_UNITS_LOG2) as f32).to(i64)
}

/// The f32 value of a sum of [`exp_units`] (rounded once, to nearest even).
#[kernel_fn]
pub fn units_to_f32(total: Tensor) -> Tensor {
    total.to(f32) * EXP_UNIT
}

/// The maximum of row `x_row` (`vocab` f32 logits, or `T` widened) and the
/// lowest index reaching it, walked in chunks of `block` (per lane the
/// first strictly larger value wins, so each lane keeps its lowest index;
/// the result does not depend on `block` or the warps).
#[kernel_fn]
pub fn row_argmax(x_row: Tensor, vocab: Tensor, block: usize) -> (Tensor, Tensor) {
    let cols = arange(0, block);
    let mut best = full([block], f32::NEG_INFINITY, f32);
    let mut best_i = zeros([block], i32);
    for c0 in range(0, vocab, block) {
        let c = c0 + cols;
        let x = load(x_row + c, mask = c < vocab, other = f32::NEG_INFINITY).to(f32);
        let better = x > best;
        best = where_(better, x, best);
        best_i = where_(better, c, best_i);
    }
    let m = max(best, 0);
    (m, min(where_(best == m, best_i, vocab), 0))
}

/// `sum_i exp(x_i - m)` over row `x_row` in fixed point ([`exp_units`]),
/// walked in chunks of `block`; the same bits for any `block` and warps.
#[kernel_fn]
pub fn row_exp_sum(x_row: Tensor, vocab: Tensor, m: Tensor, block: usize) -> Tensor {
    let cols = arange(0, block);
    let mut l_acc = zeros([block], i64);
    for c0 in range(0, vocab, block) {
        let c = c0 + cols;
        let x = load(x_row + c, mask = c < vocab, other = f32::NEG_INFINITY).to(f32);
        l_acc += exp_units(exp(x - m));
    }
    units_to_f32(sum(l_acc, 0))
}

/// Samples one token per row from `logits` with per-row temperature, min-p,
/// top-k, top-p, seed and step; writes the id, its logprob and the kept
/// threshold. See the module doc for the exact math, ties and layout.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn sample<T: Float>(
    logits_ptr: Ptr<T>,
    ws_ptr: Ptr<f32>,
    temperature_ptr: Ptr<f32>,
    top_k_ptr: Ptr<i32>,
    top_p_ptr: Ptr<f32>,
    min_p_ptr: Ptr<f32>,
    seed_ptr: Ptr<i64>,
    step_ptr: Ptr<i32>,
    ids_ptr: Ptr<i32>,
    logprobs_ptr: Ptr<f32>,
    thresh_ptr: Ptr<f32>,
    vocab: i32,
    stride: i32,
    #[constexpr] BLOCK: usize,
) {
    // Programmatic dependent launch (sm_90): every input may come from the
    // previous kernel, so wait first; then let the next kernel start early.
    gdc_wait();
    gdc_launch_dependents();
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let x_row = logits_ptr + row * stride;
    let ws_row = ws_ptr + row * stride;

    // Pass 1: the maximum and the lowest index reaching it.
    let (m, amax) = row_argmax(x_row, vocab, BLOCK);

    let temp = load(temperature_ptr + row);
    let top_k = load(top_k_ptr + row);
    let greedy = !(temp >= MIN_TEMPERATURE) || top_k == 1;
    let mut id = amax;
    let mut thresh = f32::INFINITY;
    let mut lsum = 0.0;
    if greedy {
        lsum = row_exp_sum(x_row, vocab, m, BLOCK);
    } else {
        // Pass 2: w = exp(z - z_max) with the min-p cut, into the workspace.
        let inv_t = 1.0 / temp;
        let z_max = m * inv_t;
        // In [0, 1]; off (0) when <= 0 or NaN.
        let min_p_in = load(min_p_ptr + row);
        let min_p = where_(min_p_in > 0.0, minimum(min_p_in, 1.0), 0.0);
        let mut s_acc = zeros([BLOCK], f32);
        let mut n_acc = zeros([BLOCK], i32);
        let mut l_acc = zeros([BLOCK], f32);
        for c0 in range(0, vocab, BLOCK) {
            let c = c0 + cols;
            let valid = c < vocab;
            let x = load(x_row + c, mask = valid, other = f32::NEG_INFINITY).to(f32);
            let e = exp(x * inv_t - z_max);
            let w = where_(e >= min_p, e, 0.0);
            store(ws_row + c, w, mask = valid);
            s_acc += w;
            n_acc += (w > 0.0).to(i32);
            l_acc += exp(x - m);
        }
        lsum = sum(l_acc, 0);
        let n_pos = sum(n_acc, 0);

        // Threshold searches on the workspace (keys of non-negative f32).
        let mut lo = 1;
        let mut lo_mass = sum(s_acc, 0);
        if top_k > 0 && top_k < n_pos {
            let (k_lo, k_mass) = search(ws_row, vocab, lo, lo_mass, top_k.to(f32), false, BLOCK);
            lo = k_lo;
            lo_mass = k_mass;
        }
        let top_p = load(top_p_ptr + row);
        if top_p < 1.0 {
            let (p_lo, p_mass) = search(ws_row, vocab, lo, lo_mass, top_p * lo_mass, true, BLOCK);
            lo = p_lo;
            lo_mass = p_mass;
        }
        let tau = bitcast(lo, f32);
        thresh = tau;

        // The draw: inverse CDF over the kept tokens in vocabulary order.
        let word = randint(load(seed_ptr + row), load(step_ptr + row));
        let u = (word >> 8).to(f32) * (1.0 / 16_777_216.0);
        let target = u * lo_mass;
        let mut base = 0.0;
        let mut pick = -1;
        let mut c0 = 0;
        while c0 < vocab && pick < 0 {
            let c = c0 + cols;
            let w = load(ws_row + c, mask = c < vocab, other = 0.0);
            let wk = where_(w >= tau, w, 0.0);
            let ts = sum(wk, 0);
            if base + ts > target {
                let cs = base + cumsum(wk, 0);
                let first = min(where_(cs > target && wk > 0.0, c, vocab), 0);
                let last = max(where_(wk > 0.0, c, -1), 0);
                pick = where_(first < vocab, first, last);
            }
            base += ts;
            c0 += BLOCK;
        }
        id = where_(pick >= 0, pick, amax);
    }
    let x_id = load(x_row + id).to(f32);
    store(ids_ptr + row, id);
    store(logprobs_ptr + row, x_id - m - log(lsum));
    store(thresh_ptr + row, thresh);
}

/// vLLM's repetition, frequency and presence penalties, in place on `logits`
/// (see the module doc). Grid `[rows, cdiv(vocab, BLOCK)]`.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn penalties(
    logits_ptr: Ptr<f32>,
    slot_ptr: Ptr<i32>,
    prompt_ptr: Ptr<i32>,
    output_ptr: Ptr<i32>,
    repetition_ptr: Ptr<f32>,
    presence_ptr: Ptr<f32>,
    frequency_ptr: Ptr<f32>,
    vocab: i32,
    stride: i32,
    #[constexpr] BLOCK: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let row = program_id(0);
    let slot = load(slot_ptr + row);
    let rep = load(repetition_ptr + row);
    let pres = load(presence_ptr + row);
    let freq = load(frequency_ptr + row);
    let active = slot >= 0 && (rep != 1.0 || pres != 0.0 || freq != 0.0);
    if active {
        let c = program_id(1) * BLOCK + arange(0, BLOCK);
        let valid = c < vocab;
        let x = load(logits_ptr + row * stride + c, mask = valid, other = 0.0);
        let in_prompt = load(prompt_ptr + slot * vocab + c, mask = valid, other = 0);
        let count = load(output_ptr + slot * vocab + c, mask = valid, other = 0);
        let r = where_(in_prompt > 0 || count > 0, rep, 1.0);
        let x = where_(x > 0.0, x / r, x * r);
        let x = x - freq * count.to(f32);
        let x = x - pres * (count > 0).to(f32);
        store(logits_ptr + row * stride + c, x, mask = valid);
    }
}

/// Grammar masks (constrained decoding): for program `p` (one per masked
/// row), `logits[rows[p], c] = -inf` for every `c < vocab` whose bit is clear
/// in the row's bitmask, `mask[p * words + c / 32]` bit `c % 32` (one bit per
/// token, least significant first, u32 words stored as i32). Allowed tokens
/// keep their logits bit for bit, and rows not listed in `rows` are never
/// read or written, so unconstrained rows are untouched. Run after the
/// penalties and before [`sample`]: the sampled distribution and its
/// logprobs are then those of the constrained (renormalized) distribution.
/// Grid `[masked rows, cdiv(vocab, BLOCK)]`.
#[kernel]
pub fn apply_token_mask(
    logits_ptr: Ptr<f32>,
    rows_ptr: Ptr<i32>,
    mask_ptr: Ptr<i32>,
    vocab: i32,
    stride: i32,
    words: i32,
    #[constexpr] BLOCK: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let p = program_id(0);
    let row = load(rows_ptr + p);
    let c = program_id(1) * BLOCK + arange(0, BLOCK);
    let valid = c < vocab;
    let word = load(mask_ptr + p * words + (c >> 5), mask = valid, other = 0);
    let bit = (word >> (c & 31)) & 1;
    let blocked = valid && bit == 0;
    store(logits_ptr + row * stride + c, full([BLOCK], f32::NEG_INFINITY, f32), mask = blocked);
}

/// `counts[slot[j], ids[j]] += 1` for `j < n` (atomics; entries with a
/// negative slot or an id outside `[0, vocab)` are skipped). `counts` is
/// `[slots, vocab]` i32, contiguous. Grid `[cdiv(n, BLOCK)]`.
#[kernel]
pub fn token_counts_add(
    counts_ptr: Ptr<i32>,
    slot_ptr: Ptr<i32>,
    ids_ptr: Ptr<i32>,
    n: i32,
    vocab: i32,
    #[constexpr] BLOCK: usize,
) {
    gdc_wait();
    gdc_launch_dependents();
    let j = program_id(0) * BLOCK + arange(0, BLOCK);
    let in_range = j < n;
    let slot = load(slot_ptr + j, mask = in_range, other = -1);
    let id = load(ids_ptr + j, mask = in_range, other = -1);
    let valid = slot >= 0 && id >= 0 && id < vocab;
    // Clamped so that even masked-off addresses stay inside the buffer.
    let at = where_(valid, slot * vocab + id, 0);
    atomic_add(counts_ptr + at, 1, mask = valid);
}

/// The chunk for rows of `vocab` tokens: the next power of two up to 4096.
pub fn block_for(vocab: usize) -> usize {
    vocab.next_power_of_two().min(4096)
}

/// Warps for a chunk of `block` elements: 4 up to 1024, 8 up to 2048, 16 beyond
/// (one program per row: more warps keep more loads in flight).
pub fn warps_for(block: usize) -> u32 {
    crate::warps_by_tile(block, 1024, 2048)
}
