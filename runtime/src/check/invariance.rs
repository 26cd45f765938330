//! `tessera gpu-check --only invariance`: the batch-invariance guarantee
//! (README, "Batch invariance") on the GPU, from the kernels up. Every row
//! passes only when the compared values are bit-identical.
//!
//! - `linear` rows: the batch-invariant product's rows at every batch size
//!   (1, 7, 64 rows against the same rows of a 300-row product, each at the
//!   runtime's tiles for its size) for SmolLM2's shapes (Q4_1 QKV, gate/up
//!   with SiLU, down; the Q8_0 head); its fused RMSNorm prologue against
//!   the `rmsnorm` kernel followed by the plain product; its residual
//!   epilogue against the plain product followed by add+RMSNorm's add.
//! - `attention` rows: the decode kernel's row for position `p` against the
//!   prefill kernel's row `p` of one prompt, and of a second chunk after a
//!   cached prefix, for every position of contexts that cross several key
//!   blocks (SmolLM2's 9/3 heads of 64 and a 32/8 grouping of 128).
//! - `model` rows (the real model, `models/SmolLM2-135M-Instruct.Q4_1.gguf`
//!   from the current directory or the workspace, or the file
//!   `$TESSERA_MODEL` names): the matrix of
//!   [`crate::engine::invariance`] for the shared golden prompts (greedy)
//!   and a seeded sampled request, 64 tokens each, with CUDA graphs on, and
//!   off as one case.
//! - `server`: one seeded request served alone and as 64 concurrent copies
//!   on the real model: 65 identical texts and logprob lists.

use crate::app::{DEFAULT_MODEL, resolve_model};
use crate::check::dequant::gguf_weight;
use crate::check::{CheckRow, DevicePtr, Rng, Tol, compare};
use crate::cuda::Cuda;
use crate::engine::Request;
use crate::engine::invariance::{Matrix, Setup, engine, run_matrix};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, Vocab};
use crate::model::ActElem;
use crate::model::Device;
use crate::model::args::{decode_args, flash_args, norm_args, product_args};
use crate::model::attention::{invariant_decode, prefill_tiles};
use crate::model::products::linear_config;
use crate::model::sampler::SamplingParams;
use crate::server::ModelInfo;
use crate::server::api::Limits;
use crate::tokenizer::Tokenizer;
use dsl_core::DType;
use dsl_core::half::{bf16, f16};
use dsl_core::interp::Cpu;
use dsl_core::launch::AnyDType;
use kernels::decode_attention::paged_decode_tc;
use kernels::dequant::linear::linear;
use kernels::dequant::{
    LinearTiles, QuantFormat, Repacked, interleave_gate_up, linear_grid, linear_workspace, repack,
};
use kernels::flash_attention::{self as fa, flash_attention};
use kernels::rmsnorm::{add_rmsnorm, block_for, rmsnorm, warps_for};

/// The environment variable naming another model file for the model and
/// server rows (default: the bundled SmolLM2).
pub const MODEL_ENV: &str = "TESSERA_MODEL";

/// The golden file whose prompts the model rows use.
const GOLDEN: &str = include_str!("../../tests/data/smollm2-135m-q4_1.json");

fn row(what: String, dtype: DType, differing: usize, compared: usize, pass: bool) -> CheckRow {
    CheckRow {
        kernel: "invariance".into(),
        shape: format!("{what}: {differing} of {compared} differ"),
        dtype,
        max_abs: differing as f64,
        max_rel: 0.0,
        pass: pass && differing == 0 && compared > 0,
    }
}

/// Elements whose bits differ.
fn differing<T: ActElem>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x.to_f64().to_bits() != y.to_f64().to_bits()).count()
        + a.len().abs_diff(b.len())
}

/// One launch of the batch-invariant product of `m` rows of `x` with `w`
/// (`fuse`: 0 plain, 1 RMSNorm prologue with weights `nw`, 2 residual into
/// `out0`) at the runtime's tiles, or at `tiles` (a configuration of the
/// kernel's autotune list) when given; returns the output.
#[allow(clippy::too_many_arguments)]
fn product<D: Device, T: ActElem>(
    dev: &mut D,
    w: &Repacked,
    silu: bool,
    fuse: u8,
    x: &[T],
    nw: &[T],
    out0: &[T],
    m: usize,
    tiles: Option<&linear::Config>,
) -> Result<Vec<T>> {
    let (k, rows) = (w.k, w.n);
    let n = if silu { rows / 2 } else { rows };
    let tc = dev.tensor_cores();
    let (mut config, mut grid, mut need) =
        linear_config(T::DEVICE_DTYPE, T::DEVICE_DTYPE, w.format, m, rows, k, silu, fuse == 1, fuse == 2, tc);
    if let Some(t) = tiles {
        config = t.clone();
        let lt =
            LinearTiles { block_m: t.BLOCK_M, block_n: t.BLOCK_N, num_warps: t.num_warps, split: t.SPLIT };
        grid = linear_grid(m, n, k, silu, &lt);
        need = linear_workspace(grid, &lt);
    }
    let (xd, qd, sd, nd) = (dev.upload(x)?, dev.upload(&w.quants)?, dev.upload(&w.scales)?, dev.upload(nw)?);
    let od = dev.upload(&out0[..m * n])?;
    let (wsd, cntd) = (dev.zeros::<f32>(need.0.max(16))?, dev.zeros::<i32>(need.1.max(16))?);
    let planes =
        (D::ptr_at::<u8, u8>(&qd, 0)?, D::ptr_at::<f16, f16>(&sd, 0)?, D::ptr_at::<T, AnyDType>(&od, 0)?);
    let args = product_args!(
        linear,
        planes,
        (m, n, k),
        x_ptr: D::ptr_at::<T, AnyDType>(&xd, 0)?,
        nw_ptr: D::ptr_at::<T, AnyDType>(&nd, 0)?,
        ws_ptr: D::ptr_at::<f32, f32>(&wsd, 0)?,
        cnt_ptr: D::ptr_at::<i32, i32>(&cntd, 0)?,
        ldo: n as i32,
        eps: 1e-5,
    );
    dev.run::<linear::Kernel>(grid, &config, &args)?;
    dev.download(&od)
}

/// `rmsnorm` (add+RMSNorm's rounding) or add+RMSNorm of one row: returns
/// `(normed, h)` (`h` only with a residual `r`).
fn norm_row<D: Device, T: ActElem>(
    dev: &mut D,
    x: &[T],
    r: Option<&[T]>,
    w: &[T],
) -> Result<(Vec<T>, Vec<T>)> {
    let k = x.len();
    let block = block_for(k);
    let (xd, wd, od) = (dev.upload(x)?, dev.upload(w)?, dev.zeros::<T>(k)?);
    let p = |b| D::ptr_at::<T, AnyDType>(b, 0);
    match r {
        None => {
            let args = norm_args!(rmsnorm, (p(&xd)?, p(&wd)?), (k, k, 1e-5), out_ptr: p(&od)?);
            let config = rmsnorm::Config::new(T::DEVICE_DTYPE, block, true).with_warps(warps_for(block));
            dev.run::<rmsnorm::Kernel>([1, 1, 1], &config, &args)?;
            Ok((dev.download(&od)?, Vec::new()))
        }
        Some(r) => {
            let (rd, hd) = (dev.upload(r)?, dev.zeros::<T>(k)?);
            let xw = (p(&xd)?, p(&wd)?);
            let args =
                norm_args!(add_rmsnorm, xw, (k, k, 1e-5), r_ptr: p(&rd)?, out_ptr: p(&od)?, h_ptr: p(&hd)?);
            let config = add_rmsnorm::Config::new(T::DEVICE_DTYPE, block).with_warps(warps_for(block));
            dev.run::<add_rmsnorm::Kernel>([1, 1, 1], &config, &args)?;
            Ok((dev.download(&od)?, dev.download(&hd)?))
        }
    }
}

/// The `linear` rows (see the module doc). `sizes` are the batch sizes
/// compared with the same rows of a `total`-row product; on tensor cores
/// every configuration of the kernel's autotune list runs the `total` rows
/// too (the tiles must not change a row's bits either).
pub fn linear_rows<D: Device, T: ActElem>(
    dev: &mut D,
    seed: u64,
    sizes: &[usize],
    total: usize,
    head_rows: usize,
) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let weight = |rng: &mut Rng, f: QuantFormat, n: usize, k: usize| -> Result<Repacked> {
        repack(f, &gguf_weight(rng, f, n, k), n, k).map_err(|e| Error::Usage(e.to_string()))
    };
    let head = format!("head Q8_0 576->{head_rows}");
    for (name, format, rows, k, silu) in [
        ("qkv Q4_1 576->960", QuantFormat::Q4_1, 960, 576, false),
        ("gate/up Q4_1 576->2x1536 SiLU", QuantFormat::Q4_1, 3072, 576, true),
        ("down Q4_1 1536->576", QuantFormat::Q4_1, 576, 1536, false),
        (head.as_str(), QuantFormat::Q8_0, head_rows, 576, false),
        ("Q4_K 512->200", QuantFormat::Q4_K, 200, 512, false),
        ("Q6_K 512->2x100 SiLU", QuantFormat::Q6_K, 200, 512, true),
    ] {
        let w = if silu {
            let (g, u) = (weight(&mut rng, format, rows / 2, k)?, weight(&mut rng, format, rows / 2, k)?);
            interleave_gate_up(&g, &u).map_err(|e| Error::Usage(e.to_string()))?
        } else {
            weight(&mut rng, format, rows, k)?
        };
        let n = if silu { rows / 2 } else { rows };
        let x = rng.values::<T>(total * k, 2.0);
        let zeros = vec![T::from_f64(0.0); total * n];
        let full = product::<D, T>(dev, &w, silu, 0, &x, &x[..k], &zeros, total, None)?;
        if format.is_k_quant() && dev.tensor_cores() {
            // The formats whose weights `linear` forms itself: the device's
            // values against the interpreter's (f32 operands there, f16 on
            // tensor cores here).
            let want = product::<Cpu, T>(&mut Cpu::new(), &w, silu, 0, &x, &x[..k], &zeros, total, None)?;
            let f = |v: &[T]| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
            let (got, want) = (f(&full), f(&want));
            let scale = want.iter().fold(1.0, |a: f64, v| a.max(v.abs()));
            let tol = Tol { atol: 1e-2 * scale, rtol: 0.0 };
            let shape = format!("{name}: {total} rows, device vs interpreter (1% of max |y|)");
            out.push(compare("linear", shape, T::DEVICE_DTYPE, &got, &want, tol));
        }
        for &m in sizes {
            let part = product::<D, T>(dev, &w, silu, 0, &x[..m * k], &x[..k], &zeros, m, None)?;
            let d = differing(&part, &full[..m * n]);
            out.push(row(
                format!("linear {name}: {m} rows vs the same rows of {total}"),
                T::DEVICE_DTYPE,
                d,
                m * n,
                true,
            ));
        }
        let dt = T::DEVICE_DTYPE;
        let base = |tc| linear_config(dt, dt, format, total, rows, k, silu, false, false, tc).0;
        if dev.tensor_cores() {
            let base = base(true);
            for split in [false, true] {
                for mut c in linear::autotune_configs(&base) {
                    c.SPLIT = split;
                    let got = product::<D, T>(dev, &w, silu, 0, &x, &x[..k], &zeros, total, Some(&c))?;
                    let what = format!(
                        "linear {name}: {total} rows at {}x{}/{}w{} vs the runtime tiles",
                        c.BLOCK_M,
                        c.BLOCK_N,
                        c.num_warps,
                        if split { " split" } else { "" }
                    );
                    out.push(row(what, T::DEVICE_DTYPE, differing(&got, &full), full.len(), true));
                }
            }
        } else {
            // The interpreter: the split form against the loop.
            let t = LinearTiles { block_m: 16, block_n: 64, num_warps: 4, split: true };
            let mut c = base(false);
            (c.BLOCK_M, c.BLOCK_N, c.SPLIT) = (t.block_m, t.block_n, t.split);
            let got = product::<D, T>(dev, &w, silu, 0, &x[..7 * k], &x[..k], &zeros, 7, Some(&c))?;
            let what = format!("linear {name}: 7 rows split vs the same rows of {total}");
            out.push(row(what, T::DEVICE_DTYPE, differing(&got, &full[..7 * n]), 7 * n, true));
        }
        if silu {
            continue;
        }
        // Fusions on one row.
        let (h, nw, r) = (&x[k..2 * k], rng.values::<T>(k, 2.0), rng.values::<T>(n, 2.0));
        let (normed, _) = norm_row(dev, h, None, &nw)?;
        let plain = product::<D, T>(dev, &w, false, 0, &normed, &nw, &zeros, 1, None)?;
        let fused = product::<D, T>(dev, &w, false, 1, h, &nw, &zeros, 1, None)?;
        let d = differing(&fused, &plain);
        out.push(row(
            format!("linear {name}: RMSNorm prologue vs rmsnorm + product"),
            T::DEVICE_DTYPE,
            d,
            n,
            true,
        ));
        let y = product::<D, T>(dev, &w, false, 0, h, &nw, &zeros, 1, None)?;
        let fused = product::<D, T>(dev, &w, false, 2, h, &nw, &r, 1, None)?;
        let ones = vec![T::from_f64(1.0); n];
        let (_, added) = norm_row(dev, &y, Some(&r), &ones)?;
        let d = differing(&fused, &added);
        out.push(row(
            format!("linear {name}: residual epilogue vs product + add"),
            T::DEVICE_DTYPE,
            d,
            n,
            true,
        ));
    }
    // add+RMSNorm's normed output with a zero residual equals `rmsnorm`'s.
    let k = 576;
    let (x, w) = (rng.values::<T>(k, 2.0), rng.values::<T>(k, 2.0));
    let (a, _) = norm_row(dev, &x, None, &w)?;
    let (b, _) = norm_row(dev, &x, Some(&vec![T::from_f64(0.0); k]), &w)?;
    out.push(row(
        "rmsnorm vs add+RMSNorm with r = 0 (576)".into(),
        T::DEVICE_DTYPE,
        differing(&a, &b),
        k,
        true,
    ));
    Ok(out)
}

/// The `attention` rows (see the module doc) for one head configuration
/// over pages of `page` tokens and a context of `len` tokens.
#[allow(clippy::too_many_arguments)]
pub fn attention_rows<D: Device, T: ActElem>(
    dev: &mut D,
    seed: u64,
    hq: usize,
    hkv: usize,
    hd: usize,
    page: usize,
    len: usize,
) -> Result<Vec<CheckRow>> {
    let mut rng = Rng::new(seed);
    let dtype = T::DEVICE_DTYPE;
    let pages = len.div_ceil(page);
    let num_blocks = pages + 3;
    let mut table: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    table.truncate(pages);
    let cache = num_blocks * page * hkv * hd;
    let (k, v) = (rng.values::<T>(cache, 2.0), rng.values::<T>(cache, 2.0));
    let q = rng.values::<T>(len * hq * hd, 2.0);
    let (kd, vd) = (dev.upload(&k)?, dev.upload(&v)?);
    let scale = 1.0 / (hd as f32).sqrt();
    let width = hq * hd;
    let wgmma = dev.wgmma();
    let t = prefill_tiles(hd, dtype, wgmma, page, true);
    // Prefill of rows `[first, len)` with the rows before cached.
    let prefill = |dev: &mut D, first: usize| -> Result<Vec<T>> {
        let q_len = len - first;
        let (qd, od) = (dev.upload(&q[first * width..])?, dev.zeros::<T>(q_len * width)?);
        let (bd, sd, cd) = (dev.upload(&table)?, dev.upload(&[len as i32])?, dev.upload(&[0, q_len as i32])?);
        let (qkvo, lens) =
            ((dev.ptr(&qd)?, dev.ptr(&kd)?, dev.ptr(&vd)?, dev.ptr(&od)?), (dev.ptr(&sd)?, dev.ptr(&cd)?));
        let args = flash_args!(flash_attention, qkvo, (dev.ptr(&bd)?, pages), lens, scale);
        let config = t.config(dtype, hq, hkv, hd, page, true);
        dev.run::<flash_attention::Kernel>(fa::grid(q_len, 1, hq, t.block_m), &config, &args)?;
        dev.download(&od)
    };
    let full = prefill(dev, 0)?;
    let first = len / 3 + 5;
    let chunk = prefill(dev, first)?;
    // Every position decoded at once: sequence `p` is the prompt's first
    // `p + 1` tokens (same table), its query row `p`.
    let tables: Vec<i32> = (0..len).flat_map(|_| table.iter().copied()).collect();
    let ctx: Vec<i32> = (1..=len as i32).collect();
    let (qd, od) = (dev.upload(&q)?, dev.zeros::<T>(len * width)?);
    let (bd, sd) = (dev.upload(&tables)?, dev.upload(&ctx)?);
    let part = dev.zeros::<f32>(1)?;
    let (qkvo, part) = ((dev.ptr(&qd)?, dev.ptr(&kd)?, dev.ptr(&vd)?, dev.ptr(&od)?), dev.ptr(&part)?);
    let parts = ((part, part, part), 1 << 30);
    let args = decode_args!(paged_decode_tc, qkvo, (dev.ptr(&bd)?, pages), dev.ptr(&sd)?, parts, scale);
    let config = invariant_decode(dtype, wgmma, hkv, hq / hkv, hd, page);
    dev.run::<paged_decode_tc::Kernel>([len as u32, hkv as u32, 1], &config, &args)?;
    let decode = dev.download(&od)?;
    let what = format!("attention {hq}q/{hkv}kv hd{hd}, pages of {page}, block {}", t.block_n);
    Ok(vec![
        row(
            format!("{what}: decode rows vs prefill rows (0..{len})"),
            dtype,
            differing(&decode, &full),
            full.len(),
            true,
        ),
        row(
            format!("{what}: prefill chunk {first}..{len} after a cached prefix vs one prefill"),
            dtype,
            differing(&chunk, &full[first * width..]),
            chunk.len(),
            true,
        ),
    ])
}

/// The golden prompts (greedy) and a seeded sampled request on the first
/// prompt, `tokens` new tokens each.
pub fn golden_targets(tokens: usize) -> Result<Vec<Request>> {
    let v: serde_json::Value =
        serde_json::from_str(GOLDEN).map_err(|e| Error::Usage(format!("the golden file: {e}")))?;
    let cases = v["cases"].as_array().ok_or_else(|| Error::Usage("the golden file has no cases".into()))?;
    let mut out = Vec::new();
    for c in cases {
        let prompt: Vec<u32> = c["prompt_ids"]
            .as_array()
            .ok_or_else(|| Error::Usage("a golden case has no prompt ids".into()))?
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect();
        out.push(Request::greedy(prompt, tokens));
    }
    let sampled = SamplingParams { temperature: 0.8, top_p: 0.95, seed: 2026, ..SamplingParams::default() };
    let first = out.first().map(|r| r.prompt.clone()).unwrap_or_default();
    out.push(Request::new(first, sampled, tokens));
    Ok(out)
}

/// The `model` rows: the matrix on the real model in bf16.
fn model_rows(cuda: &mut Cuda, gguf: &Gguf) -> Result<Vec<CheckRow>> {
    let targets = golden_targets(64)?;
    let base = Setup::roomy(256);
    let results = run_matrix::<Cuda, bf16>(cuda, gguf, &targets, base, &Matrix::default())?;
    Ok(results
        .into_iter()
        .map(|r| {
            let what = match &r.missing {
                Some(m) => format!("model: {} ({m})", r.name),
                None => format!("model: {} (targets differing at {:?})", r.name, r.differ),
            };
            row(what, DType::BF16, r.differ.len(), targets.len(), r.missing.is_none())
        })
        .collect())
}

/// The `server` row on the real model.
fn server_row(cuda: &mut Cuda, gguf: &Gguf) -> Result<CheckRow> {
    let mut e = engine::<Cuda, bf16>(cuda, gguf, Setup::roomy(256))?;
    let vocab = Vocab::from_metadata(gguf.metadata())?;
    let tokenizer = Tokenizer::from_vocab(&vocab)?;
    let vocab_size = e.model().weights.config.vocab_size;
    let info = ModelInfo {
        name: "smollm2".into(),
        eog: tokenizer.eog_tokens().to_vec(),
        tokenizer,
        template: None,
        limits: Limits { max_model_len: 256, vocab_size },
    };
    let body = serde_json::json!({"model": "smollm2", "prompt": "Once upon a time, in a small village by the sea,",
        "max_tokens": 64, "temperature": 0.8, "seed": 7, "logprobs": 1, "ignore_eos": true});
    let answers = crate::server::copies::serve_copies(cuda, &mut e, info, body, 64)?;
    let d = answers.iter().filter(|a| **a != answers[0]).count();
    let full = answers[0].1.len() == 64;
    Ok(row("server: one request alone vs 64 concurrent copies".into(), DType::BF16, d, answers.len(), full))
}

/// Every invariance row (see the module doc). The model and server rows
/// need the real model; without it they are one failed row saying so.
pub fn invariance_checks(cuda: &mut Cuda, seed: u64) -> Result<Vec<CheckRow>> {
    let mut rows = linear_rows::<Cuda, bf16>(cuda, seed, &[1, 7, 16, 17, 33, 64, 65, 128], 300, 49152)?;
    rows.extend(attention_rows::<Cuda, bf16>(cuda, seed, 9, 3, 64, 16, 300)?);
    rows.extend(attention_rows::<Cuda, bf16>(cuda, seed + 1, 32, 8, 128, 16, 200)?);
    let model = std::env::var(MODEL_ENV).unwrap_or_else(|_| DEFAULT_MODEL.to_string());
    let path = resolve_model(std::path::Path::new(&model));
    if !path.is_file() {
        rows.push(row(format!("model: {} not found", path.display()), DType::BF16, 0, 0, false));
        return Ok(rows);
    }
    let gguf = Gguf::open(&path)?;
    rows.extend(model_rows(cuda, &gguf)?);
    rows.push(server_row(cuda, &gguf)?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel rows on the interpreter (f32 and bf16 storage): the same
    /// bitwise properties hold with the interpreter's arithmetic.
    #[test]
    fn kernel_rows_hold_on_the_interpreter() {
        let mut cpu = Cpu::new();
        let mut rows = linear_rows::<Cpu, f32>(&mut cpu, 1, &[1, 7, 64], 300, 4096).unwrap();
        rows.extend(attention_rows::<Cpu, f32>(&mut cpu, 2, 9, 3, 64, 16, 90).unwrap());
        rows.extend(attention_rows::<Cpu, bf16>(&mut cpu, 3, 4, 2, 64, 32, 70).unwrap());
        assert!(rows.len() >= 17);
        for r in &rows {
            assert!(r.pass, "{r:?}");
        }
    }

    #[test]
    fn golden_targets_are_the_shared_prompts() {
        let t = golden_targets(64).unwrap();
        assert_eq!(t.len(), 5);
        assert_eq!(t[0].prompt, vec![504, 3575, 282, 4649, 314]);
        assert!(!t[4].params.is_greedy() && t.iter().all(|r| r.max_tokens == 64));
    }
}
