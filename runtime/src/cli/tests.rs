//! Tests of the command line: parsing, usage errors, the commands that
//! need no GPU.

use super::*;
use clap::CommandFactory;
use std::path::PathBuf;

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

/// A block size the cache cannot page by, and sizes whose products would
/// overflow, end a command with a usage error naming the flag (before the
/// model is read), never a panic or a wrapped number.
#[test]
fn bad_engine_sizes_are_usage_errors() {
    let huge = "18446744073709551615";
    let cases: [(&[&str], &str); 9] = [
        (&["--block-size", "0"], "--block-size"),
        (&["--block-size", "48"], "--block-size"),
        (&["--block-size", huge], "--block-size"),
        (&["--max-num-seqs", "0"], "--max-num-seqs"),
        (&["--max-num-seqs", huge], "--max-num-seqs"),
        (&["--max-model-len", huge], "--max-model-len"),
        (&["--max-num-batched-tokens", huge], "--max-num-batched-tokens"),
        (&["--kv-blocks", "0"], "--kv-blocks"),
        (&["--kv-blocks", huge], "--kv-blocks"),
    ];
    for (flags, name) in cases {
        for cmd in ["generate", "profile"] {
            let mut argv = vec!["tessera", cmd, "--model", "/nonexistent.gguf"];
            if cmd == "generate" {
                argv.extend(["--prompt", "hi"]);
            }
            argv.extend(flags);
            let cli = Cli::try_parse_from(&argv).unwrap();
            match run(cli) {
                Err(Error::Usage(m)) => assert!(m.contains(name), "{argv:?}: {m}"),
                other => panic!("{argv:?}: {other:?}"),
            }
        }
    }
    let sizes = |f: &[&str]| {
        let mut argv = vec!["tessera", "generate", "--prompt", "hi"];
        argv.extend(f);
        match Cli::try_parse_from(&argv).unwrap().command {
            Command::Generate(a) => a.model.load_options().validate(),
            other => panic!("{other:?}"),
        }
    };
    assert!(sizes(&["--block-size", "64", "--max-num-seqs", "256", "--max-model-len", "8192"]).is_ok());
    assert!(sizes(&["--max-num-batched-tokens", "99999999999"]).is_err());
}

#[test]
fn decode_paths_parse() {
    let path = |p: &str| {
        let argv = ["tessera", "generate", "--prompt", "hi", "--decode-path", p];
        Cli::try_parse_from(argv).map(|c| match c.command {
            Command::Generate(a) => a.model.load_options().decode_path,
            other => panic!("{other:?}"),
        })
    };
    assert_eq!(path("mega").unwrap(), DecodePath::Mega);
    assert_eq!(path("graphs").unwrap(), DecodePath::Graphs);
    assert_eq!(path("auto").unwrap(), DecodePath::Auto);
    let err = path("persistent").unwrap_err().to_string();
    assert!(err.contains("expected mega, graphs or auto"), "{err}");
}

#[test]
fn parses_the_subcommands() {
    let c = Cli::try_parse_from(["tessera", "kernels", "dump", "softmax", "--ptx", "--target", "sm_90a"])
        .unwrap();
    match c.command {
        Command::Kernels { action: KernelsAction::Dump(d) } => {
            assert_eq!(d.name, "softmax");
            assert!(d.ptx && !d.ir && !d.llvm);
            assert_eq!(d.target, TargetArg::Sm90a);
        }
        other => panic!("{other:?}"),
    }
    let c = Cli::try_parse_from(["tessera", "bench", "--peers", "p.json", "--json", "o.json", "--runs", "3"])
        .unwrap();
    match c.command {
        Command::Bench(b) => {
            assert_eq!(b.runs, 3);
            assert_eq!(b.peers, Some(PathBuf::from("p.json")));
            assert_eq!(b.shapes, "8192x1024,4096x16384");
            assert!(!b.autotune);
        }
        other => panic!("{other:?}"),
    }
    match Cli::try_parse_from(["tessera", "bench", "--autotune"]).unwrap().command {
        Command::Bench(b) => assert!(b.autotune),
        other => panic!("{other:?}"),
    }
    let c = Cli::try_parse_from(["tessera", "gpu-check", "--only", "softmax,copy"]).unwrap();
    assert!(matches!(c.command, Command::GpuCheck(ref g) if g.only == ["softmax", "copy"]));
    assert!(Cli::try_parse_from(["tessera", "kernels", "dump", "x", "--target", "sm_70"]).is_err());
    assert!(Cli::try_parse_from(["tessera", "frobnicate"]).is_err());
}

#[test]
fn list_and_unknown_names() {
    assert!(run(Cli::try_parse_from(["tessera", "kernels", "list"]).unwrap()).unwrap());
    let e = run(Cli::try_parse_from(["tessera", "kernels", "dump", "nope"]).unwrap()).unwrap_err();
    assert!(matches!(e, Error::Usage(ref m) if m.contains("no kernel named `nope`")), "{e}");
    let e = run(Cli::try_parse_from(["tessera", "gpu-check", "--only", "nope"]).unwrap()).unwrap_err();
    assert!(matches!(e, Error::Usage(_)), "{e}");
}

#[test]
fn dump_compiles_every_kernel() {
    for e in registry::ENTRIES {
        for target in ["sm_80", "sm_90a"] {
            let cli = Cli::try_parse_from([
                "tessera", "kernels", "dump", e.name, "--plan", "--ptx", "--target", target,
            ]);
            run(cli.unwrap()).unwrap_or_else(|err| panic!("{} for {target}: {err}", e.name));
        }
    }
}

#[test]
fn an_aligned_dump_shows_the_launched_specialization() {
    let ptx = |aligned: bool| {
        let mut argv = vec!["tessera", "kernels", "dump", "copy", "--ptx", "--target", "sm_90a"];
        if aligned {
            argv.push("--aligned");
        }
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Kernels { action: KernelsAction::Dump(d) } => {
                assert_eq!(d.aligned, aligned);
                super::dump_text(&d).unwrap()
            }
            other => panic!("{other:?}"),
        }
    };
    // Aligned arguments let the copy move 16 bytes per access; without the
    // promise every element is its own access.
    let (plain, aligned) = (ptx(false), ptx(true));
    assert!(!plain.contains(".v4."), "{plain}");
    assert!(aligned.contains("ld.global.v4.") && aligned.contains("st.global.v4."), "{aligned}");
}

/// `--sass` assembles the dumped PTX with ptxas and disassembles it: the
/// report names the kernel's registers and the code ends in `EXIT`; without
/// the tools it is a usage error that says how to get them.
#[test]
fn a_sass_dump_shows_the_machine_code_and_its_registers() {
    let dump = |name: &str| {
        let argv = ["tessera", "kernels", "dump", name, "--sass", "--target", "sm_90a"];
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Kernels { action: KernelsAction::Dump(d) } => super::dump_text(&d),
            other => panic!("{other:?}"),
        }
    };
    let text = dump("vector_add").unwrap();
    assert!(text.contains("// ---- vector_add: SASS for sm_90a ----"), "{text}");
    assert!(text.contains("Used") && text.contains("registers"), "{text}");
    assert!(text.contains("EXIT"), "{text}");
    // Only the SASS section was asked for.
    assert!(!text.contains(".version"), "{text}");
    // A missing tool is a usage error naming it.
    // (An empty module, which ptxas assembles.)
    let ptx = ".version 8.0\n.target sm_90a\n.address_size 64\n";
    let tools =
        super::sass::Tools { nvdisasm: "/nonexistent/nvdisasm".into(), ..super::sass::Tools::from_env() };
    let e = super::sass::sass(ptx, "sm_90a", &std::env::temp_dir(), &tools).unwrap_err();
    assert!(matches!(&e, Error::Usage(m) if m.contains("nvdisasm") && m.contains("NVDISASM")), "{e}");
}

#[test]
fn gpu_commands_fail_cleanly_without_a_gpu() {
    if crate::cuda::Gpu::new(0).is_ok() {
        return;
    }
    let e = run(Cli::try_parse_from(["tessera", "gpu-check"]).unwrap()).unwrap_err();
    assert!(matches!(e, Error::NoDriver(_) | Error::NoDevice(_)), "{e}");
    let e = run(Cli::try_parse_from(["tessera", "bench", "--no-copy"]).unwrap()).unwrap_err();
    assert!(matches!(e, Error::NoDriver(_) | Error::NoDevice(_)), "{e}");
}

/// `--grammar` reads Lark as it is and GBNF into Lark; `--json-schema`
/// wants a JSON object; every failure names the file and the reason.
#[test]
fn grammar_files_are_read_as_lark_gbnf_or_json_schema() {
    use crate::grammar::GrammarSpec;
    let dir = std::env::temp_dir().join(format!("tessera-grammar-of-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let lark = file("g.lark", "start: \"a\"+\n");
    let gbnf = file("g.gbnf", "# digits\nroot ::= [0-9]+\n");
    let bad = file("bad.gbnf", "root ::= digit\n");
    let schema = file("s.json", "{\"type\": \"integer\"}");
    let not_json = file("s2.json", "{type: integer}");
    assert_eq!(grammar_of(None, Some(&lark)).unwrap(), Some(GrammarSpec::Lark("start: \"a\"+\n".into())));
    assert_eq!(
        grammar_of(None, Some(&gbnf)).unwrap(),
        Some(GrammarSpec::Lark("start: g_root\ng_root: /[0-9]/+\n".into()))
    );
    let e = grammar_of(None, Some(&bad)).unwrap_err().to_string();
    assert!(e.contains("bad.gbnf (GBNF)") && e.contains("rule `digit` is used but never defined"), "{e}");
    assert!(matches!(grammar_of(Some(&schema), None).unwrap(), Some(GrammarSpec::JsonSchema(_))));
    let e = grammar_of(Some(&not_json), None).unwrap_err().to_string();
    assert!(e.contains("s2.json: the file is not valid JSON"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `synth --mix q4_k_m` gives the shape Q4_K_M's types (SmolLM2's: Q5_0
/// projections, V in Q8_0 in layer 0, down in Q4_K in layer 3, a Q8_0
/// table); any other mix is a usage error naming the accepted ones, before
/// anything is read or written.
#[test]
fn synth_mix_is_q4_k_m_or_a_usage_error() {
    let cli = |mix: &str| {
        let argv =
            ["tessera", "synth", "--shape", "smollm2-135m", "--out", "/nonexistent/x.gguf", "--mix", mix];
        Cli::try_parse_from(argv).unwrap()
    };
    let Command::Synth(a) = cli("q4_k_m").command else { panic!("not synth") };
    let t = synth_model(&a).unwrap();
    let types: Vec<(String, crate::gguf::GgmlType)> =
        t.config.tensors().iter().map(|s| (s.name.clone(), t.tensor_type(s))).collect();
    let ty = |name: &str| types.iter().find(|(n, _)| n == name).unwrap().1;
    use crate::gguf::GgmlType::{Q4_K, Q5_0, Q8_0};
    assert_eq!(ty("blk.0.attn_q.weight"), Q5_0);
    assert_eq!(ty("blk.0.attn_v.weight"), Q8_0);
    assert_eq!(ty("blk.3.ffn_down.weight"), Q4_K);
    assert_eq!(ty("token_embd.weight"), Q8_0);
    let e = run(cli("q4_k_s")).unwrap_err();
    assert!(matches!(e, Error::Usage(ref m) if m.contains("\"q4_k_s\"") && m.contains("q4_k_m")), "{e}");
}
