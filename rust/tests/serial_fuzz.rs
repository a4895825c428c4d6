//! The serialized node list as untrusted input: random valid programs round-trip exactly, and
//! mutated, truncated or random bytes never panic and never emit anything but the expected
//! statement shapes; every source an accepted input emits is checked to compile with CPython
//! (`python3`). `FXCODEGEN_FUZZ_ITERS` sets the mutation-loop length (`make fuzz`).

mod builder;

use builder::Build;
use fxcodegen::ir::{self, Arg, Op, Program, SubmodKind, Target};
use fxcodegen::{codegen, codegen_serialized, serial, Error, Layout, Reason, Style};
use proptest::prelude::*;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const NAMES: &[&str] = &[
    "x",
    "y",
    "torch",
    "operator",
    "len",
    "class",
    "__fx_c0",
    "__vllm_submods__",
    "execution_fn",
    "a b",
    "9lives",
    "",
    "é",
    "x); import os; (",
    "getitem",
    "submod_0",
];
const BIG: &[&str] = &[
    "-98765432109876543210987654321",
    "0",
    "-0",
    "10000000000000000000000",
];
const STRS: &[&str] = &[
    "",
    "it's",
    "\"q\"",
    "\\",
    "\n",
    "\u{0}",
    "é€😀",
    "x); import os; (",
];

fn arg(r: &mut Rng, p: &mut Program, nodes: u32, n_consts: u32, depth: u32) -> Arg {
    match r.below(if depth > 2 { 10 } else { 13 }) {
        0 if nodes > 0 => Arg::Node(r.below(nodes as u64) as u32),
        1 => Arg::None,
        2 => Arg::Bool(r.below(2) == 1),
        3 => p.int(r.next() as i64 >> r.below(63)),
        4 => p.big_int(BIG[r.below(BIG.len() as u64) as usize]),
        5 => p.float(f64::from_bits(r.next())),
        6 => p.str_arg(STRS[r.below(STRS.len() as u64) as usize]),
        7 => p.bytes(&r.next().to_le_bytes()[..r.below(8) as usize]),
        8 | 9 if n_consts > 0 => Arg::Const(r.below(n_consts as u64) as u32),
        10 => {
            let items: Vec<Arg> = (0..r.below(3))
                .map(|_| arg(r, p, nodes, n_consts, depth + 1))
                .collect();
            p.tuple(&items)
        }
        11 => {
            let items: Vec<Arg> = (0..r.below(3))
                .map(|_| arg(r, p, nodes, n_consts, depth + 1))
                .collect();
            p.list(&items)
        }
        12 => {
            let items: Vec<(Arg, Arg)> = (0..r.below(3))
                .map(|_| (p.str_arg("k"), arg(r, p, nodes, n_consts, depth + 1)))
                .collect();
            p.dict(&items)
        }
        _ => Arg::Int(0),
    }
}

/// A random program that passes validation: a root, up to two inlined children, opaque children.
fn program(seed: u64) -> Program {
    let mut r = Rng(seed | 1);
    let mut p = Program {
        n_consts: r.below(4) as u32,
        ..Program::default()
    };
    let n_graphs = 1 + r.below(3) as u32;
    for _ in 0..n_graphs {
        p.add_graph();
    }
    let mut inline = Vec::new();
    for g in 1..n_graphs {
        inline.push(p.add_submod(&format!("child_{g}"), SubmodKind::Inline(g)));
    }
    let opaque = p.add_submod("piece", SubmodKind::Opaque);
    let n_consts = p.n_consts;
    for g in (0..n_graphs).rev() {
        let n_params = r.below(3) as u32;
        for k in 0..n_params {
            let name = NAMES[r.below(NAMES.len() as u64) as usize];
            let param = p.push_str(name);
            let _ = k;
            p.add_node(g, Op::Placeholder, name, Target::Param(param), &[], &[]);
        }
        let body = r.below(8) as u32;
        for j in 0..body {
            let nodes = n_params + j;
            let name = NAMES[r.below(NAMES.len() as u64) as usize];
            let n_args = 1 + r.below(3);
            let args: Vec<Arg> = (0..n_args)
                .map(|_| arg(&mut r, &mut p, nodes, n_consts, 0))
                .collect();
            let kw_val = arg(&mut r, &mut p, nodes, n_consts, 0);
            let key = NAMES[r.below(NAMES.len() as u64) as usize];
            let kwargs = [(key, kw_val)];
            let (op, target) = match r.below(5) {
                0 if g == 0 => (Op::CallModule, Target::Submod(opaque)),
                1 if !inline.is_empty() && g == 0 => (
                    Op::CallModule,
                    Target::Submod(inline[r.below(inline.len() as u64) as usize]),
                ),
                2 => (Op::CallFunction, Target::Getitem),
                3 => (Op::CallMethod, Target::Method(p.push_str("add"))),
                _ => (
                    Op::CallFunction,
                    Target::Name(p.push_str("torch.ops.aten.add.Tensor")),
                ),
            };
            p.add_node(g, op, name, target, &args, &kwargs);
        }
        let nodes = n_params + body;
        let out = arg(&mut r, &mut p, nodes, n_consts, 0);
        p.add_output(g, out);
    }
    p
}

/// Every line of emitted code has one of the shapes the emitter writes: no statement can have
/// been smuggled in through a name or a string.
fn assert_shapes(code: &str) {
    for line in code.lines() {
        let ok = line.is_empty()
            || line == "import torch"
            || line == "import operator"
            || (line.starts_with("def ") && line.ends_with("):"))
            || line.starts_with("    del ")
            || line.starts_with("    return ")
            || line
                .strip_prefix("    ")
                .and_then(|l| l.split_once(" = "))
                .is_some_and(|(lhs, _)| {
                    lhs.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
                });
        assert!(ok, "unexpected line {line:?} in\n{code}");
        assert_one_statement(line);
    }
}

/// Outside string literals a line has no `;` or `#` and its brackets balance: it is exactly one
/// statement, so nothing can have been appended to it.
fn assert_one_statement(line: &str) {
    let b = line.as_bytes();
    let mut depth = 0i32;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                assert!(i < b.len(), "unterminated string in {line:?}");
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                assert!(depth >= 0, "unbalanced brackets in {line:?}");
            }
            b';' | b'#' => panic!("statement separator or comment outside a string in {line:?}"),
            _ => {}
        }
        i += 1;
    }
    assert_eq!(depth, 0, "unbalanced brackets in {line:?}");
}

#[test]
fn random_programs_round_trip() {
    for seed in 0..3000u64 {
        let p = program(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        fxcodegen::validate::validate(&p, true)
            .unwrap_or_else(|e| panic!("seed {seed}: generator made an invalid program: {e}"));
        let data = serial::write(&p);
        let q = serial::read(&data).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for style in [Style::Native, Style::Vllm] {
            let layout = Layout {
                style,
                ..Layout::native()
            };
            let a = codegen(&p, &layout);
            let b = codegen(&q, &layout);
            assert_eq!(a, b, "seed {seed}");
            if let Ok(code) = a {
                assert_shapes(&code);
            }
        }
        assert_eq!(
            serial::write(&q),
            data,
            "seed {seed}: re-serialization differs"
        );
    }
}

fn mutate(r: &mut Rng, data: &mut Vec<u8>) {
    for _ in 0..1 + r.below(4) {
        if data.is_empty() {
            data.push(r.next() as u8);
            continue;
        }
        let at = r.below(data.len() as u64) as usize;
        match r.below(6) {
            0 => data[at] ^= 1 << r.below(8),
            1 => data[at] = r.next() as u8,
            2 => data.truncate(at),
            3 => data.insert(at, r.next() as u8),
            4 => {
                data.remove(at);
            }
            _ => {
                // A huge varint where a count may be.
                let tail = data.split_off(at);
                data.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
                data.extend_from_slice(&tail);
            }
        }
    }
}

/// Emits `data` in both layouts; every accepted source has the expected shapes and is kept in
/// `accepted` (when given) to be compiled.
fn check_untrusted(data: &[u8], mut accepted: Option<&mut Vec<String>>) -> bool {
    let mut ok = false;
    for style in [Style::Native, Style::Vllm] {
        let layout = Layout {
            style,
            ..Layout::native()
        };
        if let Ok((code, _)) = codegen_serialized(data, &layout) {
            assert_shapes(&code);
            if let Some(list) = accepted.as_deref_mut() {
                list.push(code);
            }
            ok = true;
        }
    }
    ok
}

/// Compiles every source with CPython's `compile()` in one `python3` process; returns how many
/// compiled, and panics naming the first that does not.
fn compile_all(sources: &[String]) -> usize {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let script = "import sys\n\
        data = sys.stdin.buffer.read().split(b'\\0')[:-1]\n\
        for i, src in enumerate(data):\n\
        \x20   try:\n\
        \x20       compile(src.decode(), f'<fuzz {i}>', 'exec')\n\
        \x20   except Exception as e:\n\
        \x20       print(i, repr(e)); sys.exit(1)\n\
        print(len(data))\n";
    let mut child = Command::new("python3")
        .args(["-W", "error", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 is needed to check that accepted inputs compile");
    let mut stdin = child.stdin.take().expect("stdin");
    for s in sources {
        stdin.write_all(s.as_bytes()).expect("write");
        stdin.write_all(b"\0").expect("write");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("python3 ran");
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let i: usize = text
            .split(' ')
            .next()
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        panic!("{text}\n{}", sources.get(i).map_or("", String::as_str));
    }
    text.trim().parse().expect("a count")
}

#[test]
fn mutated_input_never_panics_and_what_is_accepted_compiles() {
    let iters: u64 = std::env::var("FXCODEGEN_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let seeds: Vec<Vec<u8>> = (0..64u64)
        .map(|s| serial::write(&program(s * 7919 + 1)))
        .collect();
    let mut r = Rng(0x1234_5678_9abc_def1);
    let (mut accepted, mut sources) = (0u64, Vec::new());
    let mut seen = std::collections::HashSet::new();
    for _ in 0..iters {
        let mut data = seeds[r.below(seeds.len() as u64) as usize].clone();
        mutate(&mut r, &mut data);
        let mut emitted = Vec::new();
        accepted += check_untrusted(&data, Some(&mut emitted)) as u64;
        sources.extend(emitted.into_iter().filter(|s| seen.insert(s.clone())));
    }
    for seed in &seeds {
        check_untrusted(seed, Some(&mut sources));
    }
    let compiled = compile_all(&sources);
    assert_eq!(compiled, sources.len());
    eprintln!(
        "fuzz loop: {iters} mutated inputs, {accepted} accepted; {} distinct sources \
         (both layouts, seeds included), {compiled} of them compile",
        sources.len()
    );
}

/// One graph inlined by many submodules is defined once: the source grows with the input.
#[test]
fn a_graph_inlined_many_times_is_written_once() {
    let mut p = Program::default();
    let root = p.add_graph();
    let child = p.add_graph();
    let mut prev = p.add_placeholder(child, "x", None);
    let neg = p.push_str("operator.neg");
    for k in 0..200 {
        let args = [Arg::Node(prev)];
        let name = format!("n{k}");
        prev = p.add_node(
            child,
            Op::CallFunction,
            &name,
            Target::Name(neg),
            &args,
            &[],
        );
    }
    p.add_output(child, Arg::Node(prev));
    let mut prev = p.add_placeholder(root, "x", None);
    for k in 0..2000 {
        let sm = p.add_submod(&format!("s{k}"), SubmodKind::Inline(child));
        let name = format!("c{k}");
        prev = p.add_node(
            root,
            Op::CallModule,
            &name,
            Target::Submod(sm),
            &[Arg::Node(prev)],
            &[],
        );
    }
    p.add_output(root, Arg::Node(prev));
    let data = serial::write(&p);
    let (code, names) = codegen_serialized(&data, &Layout::native()).expect("accepted");
    assert_eq!(names.len(), 2000);
    assert_eq!(code.matches("def __fx_f").count(), 1);
    assert!(
        code.len() < 4 * data.len(),
        "{} bytes from {}",
        code.len(),
        data.len()
    );
}

/// A long name used many times could make a source far larger than its input: that is refused
/// before the source is written.
#[test]
fn output_far_larger_than_the_input_is_refused() {
    let mut p = Program::default();
    let g = p.add_graph();
    let long = "x".repeat(4000);
    let x = p.add_placeholder(g, &long, None);
    let refs = vec![Arg::Node(x); 100_000];
    let t = p.tuple(&refs);
    p.add_output(g, t);
    let data = serial::write(&p);
    match codegen_serialized(&data, &Layout::native()) {
        Err(Error::Invalid(Reason::TooLarge { bound, limit })) => assert!(bound > limit),
        other => panic!("accepted: {:?}", other.map(|(c, _)| c.len())),
    }
    // The same program is fine from the trusted side.
    assert!(codegen(&p, &Layout::native()).is_ok());
}

#[test]
fn every_truncation_is_an_error() {
    let data = serial::write(&program(42));
    for cut in 0..data.len() {
        assert!(serial::read(&data[..cut]).is_err(), "cut at {cut} accepted");
    }
}

#[test]
fn injection_attempts_are_rejected_or_escaped() {
    let mut p = Program::default();
    let g = p.add_graph();
    let x = p.add_placeholder(g, "x); import os; (", None);
    let s = p.str_arg("'); import os; ('");
    let m = p.push_str("torch.ops.aten.add.Tensor");
    let n = p.add_node(
        g,
        Op::CallFunction,
        "y\nimport os",
        Target::Name(m),
        &[Arg::Node(x), s],
        &[("a); import os; (", Arg::None)],
    );
    p.add_output(g, Arg::Node(n));
    let code = codegen(&p, &Layout::native()).unwrap();
    assert_shapes(&code);
    for bad in [
        "os.system",
        "eval",
        "torch.x;y",
        "__import__",
        "exec",
        "torch.os.system",
        "torch.load",
        "getattr",
        "operator.attrgetter",
        "operator.call",
        "torch.ops.aten.__class__",
    ] {
        let mut q = Program::default();
        let g = q.add_graph();
        let m = q.push_str(bad);
        q.add_node(g, Op::CallFunction, "f", Target::Name(m), &[], &[]);
        assert!(serial::read(&serial::write(&q)).is_err(), "{bad} accepted");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_untrusted(&data, None);
    }

    #[test]
    fn arbitrary_bodies_after_a_valid_header_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut data = b"FXCG\x01".to_vec();
        data.extend_from_slice(&body);
        check_untrusted(&data, None);
    }
}
