//! Reference for the sampling kernels (see `crate::sampling`): the same math
//! in plain Rust, with the kernel's f32 roundings where they decide something
//! exactly (the scaled logits `z`, the differences fed to `exp`, `w` itself,
//! the penalties) and f64 everywhere else (sums, the inverse CDF).
//!
//! The kept set is computed by sorting (descending, ties grouped) rather than
//! by the kernel's bisection, so it checks the search independently. The
//! uniform draw uses `dsl_core::lang::philox_reference`, the same Philox
//! 4x32-10 the kernel runs; the tests below also check that function against
//! an independent implementation of the full algorithm and the Random123
//! known-answer vectors.
//!
//! Because the kernel sums in f32 (and the GPU's `exp` is approximate), a
//! decision that lies within rounding of its boundary may go either way;
//! [`Sampled::margin`] reports how far the closest decision of a row is from
//! its boundary, relative to the quantity compared, so tests can require exact
//! agreement whenever the margin is comfortable.

use dsl_core::lang::philox_reference;

/// The settings of one row, as the kernel reads them from its per-row arrays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowParams {
    /// Temperature; greedy below `crate::sampling::MIN_TEMPERATURE` (or NaN).
    pub temperature: f32,
    /// Top-k; `<= 0` or `>= #{w > 0}` is off, `1` is greedy.
    pub top_k: i32,
    /// Top-p; `>= 1` (or NaN) is off.
    pub top_p: f32,
    /// Min-p; `<= 0` (or NaN) is off, clamped to 1.
    pub min_p: f32,
    /// Philox key (both halves).
    pub seed: u64,
    /// Philox counter word 0.
    pub step: i32,
}

impl RowParams {
    /// Pure temperature sampling (every filter off).
    pub fn temperature(t: f32, seed: u64, step: i32) -> RowParams {
        RowParams { temperature: t, top_k: 0, top_p: 1.0, min_p: 0.0, seed, step }
    }

    /// Whether the kernel treats the row as greedy.
    pub fn greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature < crate::sampling::MIN_TEMPERATURE || self.top_k == 1
    }
}

/// The reference outcome of one row.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The chosen token.
    pub id: usize,
    /// `x_id - max(x) - ln(sum exp(x - max(x)))`.
    pub logprob: f64,
    /// Whether the row was greedy (then `w`, `kept` and `probs` are empty).
    pub greedy: bool,
    /// `w_i = exp(z_i - z_max)` after the min-p cut (the kernel's workspace).
    pub w: Vec<f64>,
    /// The kept set.
    pub kept: Vec<bool>,
    /// The renormalized kept distribution the draw samples from.
    pub probs: Vec<f64>,
    /// The uniform draw `u`.
    pub u: f64,
    /// The smallest relative distance of any decision from its boundary (min-p
    /// cut, top-k gap, top-p mass, inverse-CDF position); `inf` if none.
    pub margin: f64,
}

/// `u = (word0 >> 8) * 2^-24` of Philox(key = seed, counter = (step, 0, 0, 0)).
pub fn uniform(seed: u64, step: i32) -> f64 {
    (philox_reference(seed, step as u32)[0] >> 8) as f64 / 16_777_216.0
}

/// The first index of the maximum (`-inf` counts; NaN never wins).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// The log-probability of token `id` under the softmax of the raw logits
/// `x` (what `sample` reports for the token it draws): `logprob` with `m =
/// max(x)`. For checking a kernel's logprob against the token the kernel
/// drew, which near a decision boundary may differ from the reference's.
pub fn logprob_of(x: &[f32], id: usize) -> f64 {
    logprob(x, x[argmax(x)], id)
}

/// `x_id - m - ln(sum exp(x - m))` with `x - m` rounded to f32 as in the kernel.
fn logprob(x: &[f32], m: f32, id: usize) -> f64 {
    let l: f64 = x.iter().map(|&v| ((v - m) as f64).exp()).sum();
    (x[id] - m) as f64 - l.ln()
}

/// The kept set `{w >= tau}` of a threshold search: the largest value `t`
/// among `w` (over `w >= floor`) whose `F(t) >= target`, where `F` sums `g(w)`
/// over `w >= t`. Returns `(tau, F_mass(tau), margin)` with the margin of the
/// decision relative to `scale`.
fn threshold(w: &[f64], floor: f64, target: f64, by_mass: bool, scale: f64) -> (f64, f64, f64) {
    let mut vals: Vec<f64> = w.iter().copied().filter(|&v| v > 0.0 && v >= floor).collect();
    vals.sort_by(|a, b| b.total_cmp(a));
    let mut f = 0.0;
    let mut mass = 0.0;
    let mut i = 0;
    while i < vals.len() {
        let (v, start, before) = (vals[i], i, f);
        while i < vals.len() && vals[i] == v {
            f += if by_mass { vals[i] } else { 1.0 };
            mass += vals[i];
            i += 1;
        }
        if f >= target {
            // The kernel's f32 `w` may reorder values within rounding of the
            // boundary value, and its f32 sums may move the mass boundary.
            let next = vals.get(i).copied().unwrap_or(0.0);
            let prev = if start > 0 { vals[start - 1] } else { f64::INFINITY };
            let mut margin = ((v - next) / v).min((prev - v) / prev);
            if by_mass {
                // F of the previous value must stay below the target (if any).
                let below = if start > 0 { (target - before).abs() } else { f64::INFINITY };
                margin = margin.min((f - target).abs().min(below) / scale);
            }
            return (v, mass, margin);
        }
    }
    (floor, mass, f64::INFINITY)
}

/// One row of `sample` (see `crate::sampling` for the math and tie rules).
pub fn sample(x: &[f32], p: &RowParams) -> Sampled {
    let amax = argmax(x);
    let m = x[amax];
    if p.greedy() {
        return Sampled {
            id: amax,
            logprob: logprob(x, m, amax),
            greedy: true,
            w: Vec::new(),
            kept: Vec::new(),
            probs: Vec::new(),
            u: 0.0,
            margin: f64::INFINITY,
        };
    }
    let inv_t = 1.0 / p.temperature;
    let z_max = m * inv_t;
    let min_p = if p.min_p > 0.0 { p.min_p.min(1.0) as f64 } else { 0.0 };
    // `exp` of the kernel's f32 difference, rounded to f32 as the kernel stores
    // it (so values that underflow in f32 are 0 here too).
    let e: Vec<f64> = x.iter().map(|&v| ((v * inv_t - z_max) as f64).exp() as f32 as f64).collect();
    let w: Vec<f64> = e.iter().map(|&v| if v >= min_p { v } else { 0.0 }).collect();
    let mut margin = f64::INFINITY;
    if min_p > 0.0 {
        // The maxima have `e = exp(0) = 1` exactly, in the kernel too.
        for &v in e.iter().filter(|&&v| v != 1.0) {
            margin = margin.min((v - min_p).abs() / min_p);
        }
    }
    let total: f64 = w.iter().sum();
    let n_pos = w.iter().filter(|&&v| v > 0.0).count();
    let (mut tau, mut mass) = (0.0, total);
    if p.top_k > 0 && (p.top_k as usize) < n_pos {
        let (t, s, mg) = threshold(&w, 0.0, p.top_k as f64, false, 1.0);
        (tau, mass) = (t, s);
        margin = margin.min(mg);
    }
    if p.top_p < 1.0 {
        let target = p.top_p as f64 * mass;
        let (t, s, mg) = threshold(&w, tau, target, true, mass);
        (tau, mass) = (t, s);
        margin = margin.min(mg);
    }
    let kept: Vec<bool> = w.iter().map(|&v| v > 0.0 && v >= tau).collect();
    let probs: Vec<f64> = w.iter().zip(&kept).map(|(&v, &k)| if k { v / mass } else { 0.0 }).collect();
    let u = uniform(p.seed, p.step);
    let target = u * mass;
    let mut prefix = 0.0;
    let mut id = amax;
    for (i, (&v, &k)) in w.iter().zip(&kept).enumerate() {
        if !k {
            continue;
        }
        let next = prefix + v;
        if next > target {
            id = i;
            margin = margin.min((target - prefix).min(next - target) / mass);
            break;
        }
        prefix = next;
    }
    Sampled { id, logprob: logprob(x, m, id), greedy: false, w, kept, probs, u, margin }
}

/// The grammar mask on one row: `-inf` where bit `c % 32` of word `c / 32`
/// of `mask` is clear, the logit unchanged otherwise.
pub fn apply_token_mask(x: &[f32], mask: &[u32]) -> Vec<f32> {
    x.iter()
        .enumerate()
        .map(|(c, &v)| if mask[c / 32] >> (c % 32) & 1 == 1 { v } else { f32::NEG_INFINITY })
        .collect()
}

/// vLLM's penalties on one row, in f32 exactly as the kernel computes them:
/// repetition on tokens seen in the prompt or the output, then frequency, then
/// presence. `prompt` and `output` are the row's counts.
pub fn penalties(x: &[f32], prompt: &[i32], output: &[i32], rep: f32, pres: f32, freq: f32) -> Vec<f32> {
    x.iter()
        .zip(prompt.iter().zip(output))
        .map(|(&v, (&pc, &oc))| {
            let r = if pc > 0 || oc > 0 { rep } else { 1.0 };
            let v = if v > 0.0 { v / r } else { v * r };
            let v = v - freq * oc as f32;
            v - pres * if oc > 0 { 1.0 } else { 0.0 }
        })
        .collect()
}

/// `counts[slot[j] * vocab + ids[j]] += 1`, skipping negative slots and ids
/// outside `[0, vocab)`.
pub fn token_counts_add(counts: &mut [i32], slots: &[i32], ids: &[i32], vocab: usize) {
    for (&s, &id) in slots.iter().zip(ids) {
        if s >= 0 && id >= 0 && (id as usize) < vocab {
            counts[s as usize * vocab + id as usize] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Philox4x32-10 from the Random123 specification, with a full counter.
    fn philox_full(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
        let (mut c, mut k) = (ctr, key);
        for _ in 0..10 {
            let p0 = 0xD251_1F53u64 * c[0] as u64;
            let p1 = 0xCD9E_8D57u64 * c[2] as u64;
            c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
            k = [k[0].wrapping_add(0x9E37_79B9), k[1].wrapping_add(0xBB67_AE85)];
        }
        c
    }

    #[test]
    fn philox_known_answers_and_dsl_core_agree() {
        // Random123's kat_vectors: counter, key, expected.
        let kat = [
            ([0u32; 4], [0u32; 2], [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]),
            ([u32::MAX; 4], [u32::MAX; 2], [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (ctr, key, want) in kat {
            assert_eq!(philox_full(ctr, key), want);
        }
        for (seed, step) in [(0u64, 0u32), (0x1234_5678_9abc_def0, 7), (u64::MAX, u32::MAX), (42, 123_456)] {
            let want = philox_full([step, 0, 0, 0], [seed as u32, (seed >> 32) as u32]);
            assert_eq!(philox_reference(seed, step), want);
        }
        let u = uniform(42, 3);
        assert!((0.0..1.0).contains(&u) && u * 16_777_216.0 == (u * 16_777_216.0).floor());
    }

    #[test]
    fn greedy_ties_pick_the_lowest_index() {
        let x = [1.0, 3.0, -2.0, 3.0];
        let s = sample(&x, &RowParams::temperature(0.0, 1, 0));
        assert!(s.greedy);
        assert_eq!(s.id, 1);
        let l = (1.0f64 - 3.0).exp() + 1.0 + (-5.0f64).exp() + 1.0;
        assert!((s.logprob + l.ln()).abs() < 1e-12);
        // top_k == 1 is greedy at any temperature.
        let p = RowParams { top_k: 1, ..RowParams::temperature(2.0, 1, 0) };
        assert_eq!(sample(&x, &p).id, 1);
    }

    #[test]
    fn filters_keep_ties_and_follow_vllm_order() {
        // w (T = 1): e^0, e^-1, e^-1, e^-2, e^-4.
        let x = [5.0, 4.0, 4.0, 3.0, 1.0];
        let base = RowParams::temperature(1.0, 9, 0);
        // top-k 2 keeps the tie at the 2nd value: 3 tokens.
        let s = sample(&x, &RowParams { top_k: 2, ..base });
        assert_eq!(s.kept, vec![true, true, true, false, false]);
        // top-p: the first token alone has mass 1/(1 + 2/e + e^-2 + e^-4) ~ 0.52.
        let s = sample(&x, &RowParams { top_p: 0.5, ..base });
        assert_eq!(s.kept, vec![true, false, false, false, false]);
        let s = sample(&x, &RowParams { top_p: 0.6, ..base });
        assert_eq!(s.kept, vec![true, true, true, false, false]);
        // min-p 0.2 cuts e^-2 (0.135) and e^-4.
        let s = sample(&x, &RowParams { min_p: 0.2, ..base });
        assert_eq!(s.kept, vec![true, true, true, false, false]);
        // top-p after top-k renormalizes: with k = 4 the mass of {5} is
        // 1/(1 + 2/e + e^-2) ~ 0.53, so p = 0.53 keeps one token.
        let s = sample(&x, &RowParams { top_k: 4, top_p: 0.53, ..base });
        assert_eq!(s.kept, vec![true, false, false, false, false]);
        // p <= 0 keeps the maximum only.
        let s = sample(&x, &RowParams { top_p: 0.0, ..base });
        assert_eq!(s.id, 0);
        let total: f64 = s.probs.iter().sum();
        assert!((total - 1.0).abs() < 1e-12);
    }

    #[test]
    fn inverse_cdf_follows_the_uniform() {
        let x = [0.0f32; 4];
        for step in 0..64 {
            let s = sample(&x, &RowParams::temperature(1.0, 5, step));
            assert_eq!(s.id, (s.u * 4.0).floor() as usize);
        }
    }

    #[test]
    fn penalties_follow_vllm() {
        let x = [2.0, -2.0, 2.0, 0.5];
        let out = penalties(&x, &[1, 0, 0, 0], &[0, 2, 0, 1], 2.0, 0.5, 0.25);
        assert_eq!(out, vec![1.0, -4.0 - 0.5 - 0.5, 2.0, 0.25 - 0.25 - 0.5]);
        let mut counts = vec![0; 6];
        token_counts_add(&mut counts, &[0, 1, 1, -1, 0], &[2, 0, 0, 1, 3], 3);
        assert_eq!(counts, vec![0, 0, 1, 2, 0, 0]);
    }
}
