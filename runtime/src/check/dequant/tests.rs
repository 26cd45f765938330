//! Tests of the dequant checks' launches, runners and judgement on the
//! interpreter (no GPU needed).

use super::fused::{Fuse, FusedInputs, FusedKernels, VARIANTS, fused_expected, run_fused};
use super::*;

/// The GPU check's stream-K path on the interpreter: the launch the
/// runtime picks at M 256 x N 4096 is stream-K on an H100's 132 SMs
/// (and not at N 14336, without `wgmma`, at 64 rows, short K or with
/// more than half the SMs busy), and the
/// check's stream-K runner (workspace of NaNs, flags zero after) agrees
/// with the exact product on a ragged six-tile case.
#[test]
fn stream_k_launches() {
    let q41 = QuantFormat::Q4_1;
    let sk = Launch::runtime_for(Path::Gemm, q41, false, (256, 4096, 4096), true, 132);
    assert_eq!((sk.stream_k, sk.tiles, sk.swap), (Some(132), (256, 128, 64), true));
    assert_eq!(sk.grid(256, 4096), [132, 1, 1]);
    // SiLU doubles the weight rows: 64 tiles still leave half of 132 SMs idle.
    let silu = Launch::runtime_for(Path::Gemm, q41, true, (256, 4096, 4096), true, 132);
    assert_eq!(silu.stream_k, Some(132));
    for (m, n, k, swap_ok, sms, why) in [
        (256, 14336, 4096, true, 132, "112 tiles: the tiled grid wins"),
        (256, 4096, 4096, false, 132, "no wgmma"),
        (64, 4096, 4096, true, 132, "64 rows in a 256-row tile"),
        (256, 4096, 1024, true, 132, "short K"),
        (256, 4096, 4096, true, 63, "more than half the SMs busy"),
    ] {
        let l = Launch::runtime_for(Path::Gemm, q41, false, (m, n, k), swap_ok, sms);
        assert_eq!(l.stream_k, None, "{why}");
    }
    assert!(stream_k(QuantFormat::Q8_0, 256, 4096, 4096, true, 132).is_none(), "Q8_0 is never swapped");
    let mut rng = Rng::new(5);
    let (m, n, k) = (300, 150, 1024);
    let x = rng.values::<bf16>(m * k, 2.0);
    let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let raw = gguf_weight(&mut rng, QuantFormat::Q4_1, n, k);
    let w = repacked(QuantFormat::Q4_1, &raw, n, k).unwrap();
    let l = Launch {
        path: Path::Gemm,
        format: QuantFormat::Q4_1,
        silu: false,
        tiles: (256, 128, 64),
        warps: 8,
        swap: true,
        stages: 3,
        stream_k: Some(9),
    };
    let got = run(&mut Cpu::new(), l, &x, &w, m, n).unwrap();
    let cols: Vec<usize> = (0..n).collect();
    let e = expected(l, DType::BF16, &xf, (&raw, None), m, k, &cols);
    assert!(compare_each("sk", String::new(), DType::BF16, &got, &e.want, &e.tol).pass);
}

/// The declared autotune configs are valid SiLU launches (even
/// `BLOCK_N`, power-of-two `BLOCK_K >= 32`) whose grid covers the
/// output, and the untuned GEMV grid is one program row per column tile.
#[test]
fn launches_are_consistent() {
    for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
        for path in [Path::Gemv, Path::Gemm] {
            let base = Launch::default_for(path, format, true, 3, 45, 608, false);
            let tuned = tuned_launches(base);
            assert!(tuned.len() >= 4, "{format:?} {path:?}");
            for l in tuned {
                let (a, bn, bk) = l.tiles;
                assert!(bn % 2 == 0 && bk.is_power_of_two() && bk >= 32, "{l:?}");
                let g = l.grid(3, 45);
                let (rows, ms) = if path == Path::Gemv { (g[0], g[1]) } else { (g[1], g[0]) };
                assert!(rows as usize * bn >= 90 && ms as usize * a >= 3, "{l:?}: {g:?}");
            }
        }
    }
    let g = Launch::default_for(Path::Gemv, QuantFormat::Q4_1, false, 1, 14336, 4096, false);
    assert_eq!(g.grid(1, 14336), [14336 / g.tiles.1 as u32, 1, 1]);
}

/// Every untuned GEMM tile choice the runtime can make (any batch the
/// GEMV does not take, prefill chunks, SmolLM2's and the bench's
/// weights) and every declared config fits whole `mma.sync`
/// instructions, so the GEMM's dots run on tensor cores.
#[test]
fn gemm_tiles_fit_tensor_cores() {
    use codegen::fragment::MmaLayout;
    for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
        let width = |bk: usize| if format == QuantFormat::Q8_0 { bk } else { bk / 2 };
        let fits = |(bm, bn, bk): (usize, usize, usize), warps: u32| {
            MmaLayout::choose(bm, bn, width(bk), warps as usize).is_some()
        };
        for m in (1..=300).chain([512, 2048, 8192]) {
            for rows in [576, 960, 1152, 3072, 4096, 14336, 28672, 49152] {
                for (swap_ok, k) in [(false, 576), (true, 576), (true, 4096)] {
                    let t = gemm_tiles(format, m, rows, k, swap_ok);
                    // The swapped product is `[BLOCK_N, BLOCK_K] x [BLOCK_K, BLOCK_M]`.
                    let tiles = if t.swap {
                        (t.block_n, t.block_m, t.block_k)
                    } else {
                        (t.block_m, t.block_n, t.block_k)
                    };
                    assert!(fits(tiles, t.num_warps), "{format:?} m {m} rows {rows}: {t:?}");
                    assert!(!t.swap || (swap_ok && format != QuantFormat::Q8_0), "{t:?}");
                }
            }
        }
        // The bench shape swaps on sm_90a (Q4), SmolLM2's K never does.
        let q4 = format != QuantFormat::Q8_0;
        assert_eq!(gemm_tiles(format, 256, 14336, 4096, true).swap, q4);
        assert!(!gemm_tiles(format, 256, 14336, 4096, false).swap);
        assert!(!gemm_tiles(format, 8192, 3072, 576, true).swap);
        // Smaller products with enough 64 x 64 programs swap on that tile.
        let t = gemm_tiles(format, 64, 14336, 4096, true);
        assert_eq!(t.swap, q4);
        if q4 {
            assert_eq!((t.block_m, t.block_n, t.num_stages), (64, 64, 4));
        }
        assert!(!gemm_tiles(format, 64, 4096, 4096, true).swap);
        for l in tuned_launches(Launch::default_for(Path::Gemm, format, false, 70, 90, 608, false)) {
            let (a, b, c) = l.tiles;
            assert!(fits(if l.swap { (b, a, c) } else { l.tiles }, l.warps), "{l:?}");
        }
    }
}

/// The fused check's interpreter path and expectations agree on every
/// variant (the judgement the GPU rows use), and a skipped fusion fails it.
#[test]
fn fused_interpreter_matches_reference() {
    let mut rng = Rng::new(2);
    let (m, n, k) = (3, 10, 96);
    for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
        for (silu, fuse) in VARIANTS {
            let l = Launch::default_for(Path::Gemv, format, silu, m, n, k, false);
            let (x, nw, out0) =
                (rng.values::<f32>(m * k, 2.0), rng.values::<f32>(k, 2.0), rng.values::<f32>(m * n, 2.0));
            let w = Weight::random(&mut rng, format, silu, n, k).unwrap();
            let inp = FusedInputs { x: &x, nw: &nw, out0: &out0, w: &w.repacked };
            let got = run_fused(&mut Cpu::new(), FusedKernels::Dequant, l, fuse, &inp, (m, n)).unwrap();
            let (xf, nf, of) = (to_f64(&x), to_f64(&nw), to_f64(&out0));
            let cols: Vec<usize> = (0..n).collect();
            let ins = (xf.as_slice(), nf.as_slice(), of.as_slice());
            let e = fused_expected(l, fuse, DType::F32, ins, w.raws(), (m, n, k), &cols);
            assert!(
                compare_each("t", String::new(), DType::F32, &got, &e.want, &e.tol).pass,
                "{format:?} {fuse:?}"
            );
            // The other fusion's expectation must not pass.
            let other = if fuse == Fuse::Norm { Fuse::Residual } else { Fuse::Norm };
            let e = fused_expected(l, other, DType::F32, ins, w.raws(), (m, n, k), &cols);
            assert!(
                !compare_each("t", String::new(), DType::F32, &got, &e.want, &e.tol).pass,
                "{format:?} {fuse:?}"
            );
        }
    }
}

/// The interpreter path of a case runs without a GPU and matches the
/// reference (the same judgement the GPU rows use).
#[test]
fn interpreter_matches_reference() {
    let mut rng = Rng::new(1);
    for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
        let (m, n, k) = (3, 10, 96);
        let l = Launch::default_for(Path::Gemv, format, true, m, n, k, false);
        let x = rng.values::<f32>(m * k, 2.0);
        let w = Weight::random(&mut rng, format, true, n, k).unwrap();
        let got = run(&mut Cpu::new(), l, &x, &w.repacked, m, n).unwrap();
        let cols: Vec<usize> = (0..n).collect();
        let e = expected(l, DType::F32, &to_f64(&x), w.raws(), m, k, &cols);
        assert!(compare_each("t", String::new(), DType::F32, &got, &e.want, &e.tol).pass, "{format:?}");
    }
}
