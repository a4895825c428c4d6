//! Identifier allocation: every generated name is a valid identifier, unique in its function,
//! and never shadows a keyword, a builtin, `torch`, `operator` or a layout name.

use crate::helper::discard;
use crate::ir::{Graph, Node, Program, Span};
use crate::table::Table;

/// Python 3.11's keywords and soft keywords are all lower-case ASCII; `_` is excluded here.
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "match", "case",
];

/// `dir(builtins)` on CPython 3.11.
const BUILTINS: &[&str] = &[
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "BaseException",
    "BaseExceptionGroup",
    "BlockingIOError",
    "BrokenPipeError",
    "BufferError",
    "BytesWarning",
    "ChildProcessError",
    "ConnectionAbortedError",
    "ConnectionError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "DeprecationWarning",
    "EOFError",
    "Ellipsis",
    "EncodingWarning",
    "EnvironmentError",
    "Exception",
    "ExceptionGroup",
    "False",
    "FileExistsError",
    "FileNotFoundError",
    "FloatingPointError",
    "FutureWarning",
    "GeneratorExit",
    "IOError",
    "ImportError",
    "ImportWarning",
    "IndentationError",
    "IndexError",
    "InterruptedError",
    "IsADirectoryError",
    "KeyError",
    "KeyboardInterrupt",
    "LookupError",
    "MemoryError",
    "ModuleNotFoundError",
    "NameError",
    "None",
    "NotADirectoryError",
    "NotImplemented",
    "NotImplementedError",
    "OSError",
    "OverflowError",
    "PendingDeprecationWarning",
    "PermissionError",
    "ProcessLookupError",
    "RecursionError",
    "ReferenceError",
    "ResourceWarning",
    "RuntimeError",
    "RuntimeWarning",
    "StopAsyncIteration",
    "StopIteration",
    "SyntaxError",
    "SyntaxWarning",
    "SystemError",
    "SystemExit",
    "TabError",
    "TimeoutError",
    "True",
    "TypeError",
    "UnboundLocalError",
    "UnicodeDecodeError",
    "UnicodeEncodeError",
    "UnicodeError",
    "UnicodeTranslateError",
    "UnicodeWarning",
    "UserWarning",
    "ValueError",
    "Warning",
    "ZeroDivisionError",
    "__build_class__",
    "__debug__",
    "__doc__",
    "__import__",
    "__loader__",
    "__name__",
    "__package__",
    "__spec__",
    "abs",
    "aiter",
    "all",
    "anext",
    "any",
    "ascii",
    "bin",
    "bool",
    "breakpoint",
    "bytearray",
    "bytes",
    "callable",
    "chr",
    "classmethod",
    "compile",
    "complex",
    "copyright",
    "credits",
    "delattr",
    "dict",
    "dir",
    "divmod",
    "enumerate",
    "eval",
    "exec",
    "exit",
    "filter",
    "float",
    "format",
    "frozenset",
    "getattr",
    "globals",
    "hasattr",
    "hash",
    "help",
    "hex",
    "id",
    "input",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "license",
    "list",
    "locals",
    "map",
    "max",
    "memoryview",
    "min",
    "next",
    "object",
    "oct",
    "open",
    "ord",
    "pow",
    "print",
    "property",
    "quit",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "setattr",
    "slice",
    "sorted",
    "staticmethod",
    "str",
    "sum",
    "super",
    "tuple",
    "type",
    "vars",
    "zip",
];

/// Globals the generated module binds besides the builtins.
const MODULE_GLOBALS: &[&str] = &["torch", "operator", "__builtins__"];

/// Builtins a call target may never name: they run code or reach outside the graph.
const DENIED_CALLS: &[&str] = &[
    "eval",
    "exec",
    "compile",
    "__import__",
    "open",
    "breakpoint",
    "input",
    "globals",
    "locals",
    "vars",
    "exit",
    "quit",
    "help",
    "setattr",
    "delattr",
    "__build_class__",
    "__loader__",
];

pub fn is_keyword(s: &str) -> bool {
    // Most names share no first byte and length with any keyword: one table load rules them out.
    if !first_len_match(&KEYWORD_FIRST_LEN, s.as_bytes()) {
        return false;
    }
    matches!(
        s,
        "False"
            | "None"
            | "True"
            | "and"
            | "as"
            | "assert"
            | "async"
            | "await"
            | "break"
            | "class"
            | "continue"
            | "def"
            | "del"
            | "elif"
            | "else"
            | "except"
            | "finally"
            | "for"
            | "from"
            | "global"
            | "if"
            | "import"
            | "in"
            | "is"
            | "lambda"
            | "nonlocal"
            | "not"
            | "or"
            | "pass"
            | "raise"
            | "return"
            | "try"
            | "while"
            | "with"
            | "yield"
            | "match"
            | "case"
    )
}

pub fn is_builtin(s: &str) -> bool {
    BUILTINS.binary_search(&s).is_ok()
}

/// Bit `n` of `first_len(lists)[c]` is set when a word of `lists` starts with byte `c` and is
/// `n` bytes long (all words are ASCII and shorter than 32 bytes).
const fn first_len(lists: &[&[&str]]) -> [u32; 128] {
    let mut table = [0u32; 128];
    let mut l = 0;
    while l < lists.len() {
        let mut i = 0;
        while i < lists[l].len() {
            let b = lists[l][i].as_bytes();
            assert!(b.len() < 32 && b[0] < 128);
            table[b[0] as usize] |= 1 << b.len();
            i += 1;
        }
        l += 1;
    }
    table
}

/// Whether some word of the table's lists has the first byte and length of `b`.
#[inline]
fn first_len_match(table: &[u32; 128], b: &[u8]) -> bool {
    matches!(b.first(), Some(&c) if c < 128 && b.len() < 32 && table[c as usize] >> b.len() & 1 != 0)
}

const KEYWORD_FIRST_LEN: [u32; 128] = first_len(&[KEYWORDS]);
const FIRST_LEN: [u32; 128] = first_len(&[KEYWORDS, BUILTINS, MODULE_GLOBALS]);

/// Whether `s` (whose [`hash_bytes`] is `h`) is a keyword, builtin or module global: first
/// byte and length filter, then a set of hashes, then the exact lists confirm.
fn taken_globally(h: u64, s: &str) -> bool {
    if !first_len_match(&FIRST_LEN, s.as_bytes()) {
        return false;
    }
    static SET: std::sync::OnceLock<rustc_hash::FxHashSet<u64>> = std::sync::OnceLock::new();
    SET.get_or_init(|| {
        KEYWORDS
            .iter()
            .chain(BUILTINS)
            .chain(MODULE_GLOBALS)
            .map(|k| hash_bytes(k.as_bytes()))
            .collect()
    })
    .contains(&h)
        && (is_keyword(s) || is_builtin(s) || MODULE_GLOBALS.contains(&s))
}

/// `IDENT[b]`: 2 if byte `b` may start an identifier, 1 if it may only continue one.
const IDENT: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphabetic() || c == b'_' {
            2
        } else if c.is_ascii_digit() {
            1
        } else {
            0
        };
        b += 1;
    }
    t
};

/// An ASCII Python identifier (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_identifier(s: &[u8]) -> bool {
    match s.split_first() {
        Some((&c, rest)) => IDENT[c as usize] == 2 && rest.iter().all(|&c| IDENT[c as usize] != 0),
        None => false,
    }
}

/// [`is_identifier`] for the `len` bytes at `text[at..]`, all 16 at once where 16 bytes of
/// `text` start there (most node names are shorter than 16 bytes).
#[inline]
fn is_identifier_at(text: &[u8], at: usize, len: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(block) = text.get(at..at + 16) {
        if (1..=16).contains(&len) {
            // SAFETY: SSE2 is part of x86_64; the load reads the 16 bytes of `block`.
            unsafe {
                use std::arch::x86_64::*;
                let v = _mm_loadu_si128(block.as_ptr() as *const __m128i);
                // Unsigned `x - lo < n` as a signed compare of bytes biased by 0x80.
                let below = |x: __m128i, lo: u8, n: u8| {
                    let biased = _mm_add_epi8(x, _mm_set1_epi8(0x80u8.wrapping_sub(lo) as i8));
                    _mm_cmplt_epi8(biased, _mm_set1_epi8(0x80u8.wrapping_add(n) as i8))
                };
                let letter = below(_mm_or_si128(v, _mm_set1_epi8(0x20)), b'a', 26);
                let digit = below(v, b'0', 10);
                let under = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'_' as i8));
                let ok = _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(letter, digit), under));
                let want = ((1u32 << len) - 1) as i32;
                return ok & want == want && _mm_movemask_epi8(digit) & 1 == 0;
            }
        }
    }
    text.get(at..at + len).is_some_and(is_identifier)
}

/// Whether a dotted call-target name is safe to write: identifiers only, rooted at `torch`,
/// `operator` or an allowed builtin.
pub fn check_call_name(name: &str) -> Result<(), String> {
    let mut parts = name.split('.');
    let root = parts.next().unwrap_or("");
    for p in name.split('.') {
        if !is_identifier(p.as_bytes()) || is_keyword(p) {
            return Err(format!("call target {name:?} is not a dotted identifier"));
        }
    }
    let rooted =
        root == "torch" || root == "operator" || (is_builtin(root) && parts.next().is_none());
    if !rooted || DENIED_CALLS.contains(&root) {
        return Err(format!("call target {name:?} is not allowed by name"));
    }
    Ok(())
}

/// `operator` functions an untrusted program may call: pure arithmetic, comparison and
/// container operations (never `attrgetter`, `methodcaller`, `call`, … which reach attributes or
/// call values).
const SAFE_OPERATOR: &[&str] = &[
    "abs",
    "add",
    "and_",
    "concat",
    "contains",
    "countOf",
    "eq",
    "floordiv",
    "ge",
    "getitem",
    "gt",
    "iadd",
    "iand",
    "iconcat",
    "ifloordiv",
    "ilshift",
    "imatmul",
    "imod",
    "imul",
    "index",
    "indexOf",
    "inv",
    "invert",
    "ior",
    "ipow",
    "irshift",
    "is_",
    "is_not",
    "isub",
    "itruediv",
    "ixor",
    "le",
    "lshift",
    "lt",
    "matmul",
    "mod",
    "mul",
    "ne",
    "neg",
    "not_",
    "or_",
    "pos",
    "pow",
    "rshift",
    "sub",
    "truediv",
    "truth",
    "xor",
];

/// Builtins an untrusted program may call: value constructors and pure functions.
const SAFE_BUILTINS: &[&str] = &[
    "abs",
    "all",
    "any",
    "bool",
    "bytes",
    "complex",
    "dict",
    "divmod",
    "float",
    "frozenset",
    "int",
    "isinstance",
    "len",
    "list",
    "max",
    "min",
    "pow",
    "range",
    "round",
    "set",
    "slice",
    "sorted",
    "str",
    "sum",
    "tuple",
];

/// The stricter rule for untrusted (serialized) input: besides [`check_call_name`], only
/// `torch.ops.<namespace>.<op>[.<overload>]`, safe `operator` functions and safe builtins.
/// Anything else a graph calls travels through the constant pool, which untrusted input cannot
/// fill.
pub fn check_untrusted_call_name(name: &str) -> Result<(), String> {
    check_call_name(name)?;
    let parts: Vec<&str> = name.split('.').collect();
    let ok = match parts.as_slice() {
        ["torch", "ops", rest @ ..] => {
            (2..=3).contains(&rest.len()) && rest.iter().all(|p| !p.starts_with("__"))
        }
        ["operator", f] => SAFE_OPERATOR.contains(f),
        [b] => SAFE_BUILTINS.contains(b),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "call target {name:?} is not allowed in untrusted input"
        ))
    }
}

/// What a name must avoid besides keywords, builtins and the module globals: the layout's
/// reserved prefix (pool, submodules, inlined functions) and the entry function's name.
#[derive(Clone, Copy, Debug)]
pub struct Reserved<'a> {
    pub prefix: &'a str,
    pub fn_name: &'a str,
}

impl Reserved<'_> {
    pub fn is_reserved(&self, s: &str) -> bool {
        self.is_reserved_h(hash_bytes(s.as_bytes()), s)
    }

    /// [`Reserved::is_reserved`] for a name whose [`hash_bytes`] is already known.
    fn is_reserved_h(&self, h: u64, s: &str) -> bool {
        // Layout prefixes start with `_`, which few names do: test one byte before the whole.
        let has_prefix = match self.prefix.as_bytes().first() {
            Some(c) => s.as_bytes().first() == Some(c) && s.starts_with(self.prefix),
            None => true,
        };
        has_prefix || s == self.fn_name || taken_globally(h, s)
    }

    /// Whether `raw` (of hash `h`), found at `at` in `text`, may name its node as it is, if no
    /// earlier node has it: an identifier, shorter than [`EXTRA`], not reserved.
    #[inline(always)]
    fn allows(&self, text: &str, at: u32, raw: &str, h: u64) -> bool {
        is_identifier_at(text.as_bytes(), at as usize, raw.len())
            && raw.len() < EXTRA as usize
            && !self.is_reserved_h(h, raw)
    }
}

/// Identifiers of one function's nodes. Most are the node's own name, pointed to in the
/// program's text; renamed ones live in [`NameParts::extra`]. When every node keeps its own
/// name, the names are read from the nodes themselves (no table).
#[derive(Debug, Default)]
pub struct Names<'a> {
    base: &'a str,
    parts: NameParts,
    /// The nodes, when each one's name is a span of `base` short of [`EXTRA`] and is its
    /// identifier (`parts` is then empty).
    own: Option<&'a [Node]>,
}

const EXTRA: u32 = 1 << 31;

impl<'a> Names<'a> {
    /// Names given in full (loose values of vLLM's `_node_ref`), node `i` named `list[i]`.
    pub fn from_list<S: AsRef<str>>(list: &[S]) -> Names<'static> {
        let mut parts = NameParts::default();
        for s in list {
            parts.push_extra(s.as_ref());
        }
        parts.over("")
    }

    /// Every node of `g` named by its own name: what [`assign`] returns for a graph none of
    /// whose names needs changing, and so a guess to use before `assign` has finished (and to
    /// drop unless its result is [`Names::all_own`]). A name that is not a span of the program
    /// text is guessed empty.
    pub fn own(p: &'a Program, g: &'a Graph) -> Names<'a> {
        let whole = |node: &Node| p.text.get(node.name.range()).is_some() && node.name.len < EXTRA;
        if g.nodes.iter().all(whole) {
            return Names::of_nodes(p, g);
        }
        let spans = g
            .nodes
            .iter()
            .map(|node| match p.text.get(node.name.range()) {
                Some(_) if node.name.len < EXTRA => (node.name.start, node.name.len),
                _ => (0, 0),
            })
            .collect();
        NameParts {
            extra: String::new(),
            spans,
        }
        .over(&p.text)
    }

    /// Every node of `g` named by its own name, read from the node. Each name must be a span
    /// of the program text shorter than [`EXTRA`] (as every kept name is).
    fn of_nodes(p: &'a Program, g: &'a Graph) -> Names<'a> {
        Names {
            base: &p.text,
            parts: NameParts::default(),
            own: Some(&g.nodes),
        }
    }

    /// The names without the text they point into.
    pub fn into_parts(self) -> NameParts {
        match self.own {
            Some(nodes) => NameParts {
                extra: String::new(),
                spans: nodes.iter().map(|n| (n.name.start, n.name.len)).collect(),
            },
            None => self.parts,
        }
    }

    /// Whether every node kept its own name (true for a result of [`assign`] exactly when it
    /// equals [`Names::own`]).
    pub fn all_own(&self) -> bool {
        self.parts.extra.is_empty()
    }

    /// `(start, len)` of node `i`'s identifier, as in [`NameParts::spans`].
    #[inline(always)]
    fn span(&self, i: u32) -> (u32, u32) {
        match self.own {
            Some(nodes) => {
                let s = nodes[i as usize].name;
                (s.start, s.len)
            }
            None => self.parts.spans[i as usize],
        }
    }

    #[inline]
    pub fn get(&self, i: u32) -> &str {
        match self.own {
            // SAFETY: the name is a span of `base` (`of_nodes`).
            Some(nodes) => unsafe { self.base.get_unchecked(nodes[i as usize].name.range()) },
            None => self.parts.get(self.base, i),
        }
    }

    /// Node `i`'s identifier as `Ok((16 bytes of the text from its start, its length))` when it
    /// is a name of the program text at most 16 bytes long with 16 bytes of text from its
    /// start (so it can be copied as one move, see [`crate::out::Out::name`]), else as
    /// `Err(identifier)`.
    #[inline(always)]
    pub fn sixteen(&self, i: u32) -> std::result::Result<(u128, usize), &str> {
        let (s, l) = self.span(i);
        if l <= 16 && s as usize + 16 <= self.base.len() {
            // SAFETY: the 16 bytes read stay inside `base` (a span marked EXTRA is longer than
            // 16 and never gets here).
            let bytes =
                unsafe { (self.base.as_ptr().add(s as usize) as *const u128).read_unaligned() };
            Ok((bytes, l as usize))
        } else {
            Err(self.get(i))
        }
    }
}

/// [`Names`] without the text most of them point into: what [`Namer::finish`] returns.
#[derive(Debug, Default)]
pub struct NameParts {
    /// Identifiers that are not a node's own name.
    extra: String,
    /// `(start, len)` of node `i`'s identifier; `len & EXTRA` marks one in `extra`.
    spans: Vec<(u32, u32)>,
}

impl NameParts {
    /// The names, over `base`: the program text the spans were taken from.
    pub fn over(self, base: &str) -> Names<'_> {
        Names {
            base,
            parts: self,
            own: None,
        }
    }

    /// Node `i`'s identifier, its span read over `base` or, marked [`EXTRA`], over `extra`.
    #[inline]
    fn get<'s>(&'s self, base: &'s str, i: u32) -> &'s str {
        let (s, l) = self.spans[i as usize];
        let (text, l) = match l & EXTRA {
            0 => (base, l),
            _ => (self.extra.as_str(), l & !EXTRA),
        };
        // SAFETY: every span covers a whole `&str` inside `base` (a node name that
        // `Program::str` returned checked, or its copy, kept only when shorter than `EXTRA`)
        // or `extra`, so it is in bounds and on char boundaries.
        unsafe { text.get_unchecked(s as usize..(s + l) as usize) }
    }

    fn push_extra(&mut self, s: &str) {
        let start = self.extra.len() as u32;
        self.extra.push_str(s);
        self.spans.push((start, s.len() as u32 | EXTRA));
    }
}

/// The hash every name table of the crate uses.
pub(crate) fn hash_bytes(b: &[u8]) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = rustc_hash::FxBuildHasher.build_hasher();
    h.write(b);
    h.finish()
}

/// The identifiers chosen so far for one function, in node order, without the text they point
/// into, which each call passes.
struct Assigner {
    parts: NameParts,
    /// Name hash -> indices of the chosen names with that hash.
    used: Table<u32>,
    scratch: String,
}

impl Assigner {
    fn new(n: usize) -> Self {
        Assigner {
            parts: NameParts {
                extra: String::new(),
                spans: Vec::with_capacity(n),
            },
            used: Table::with_capacity(n),
            scratch: String::new(),
        }
    }

    /// Whether `s` (hash `h`) is taken; if not, records it as node `idx`'s name.
    fn claim(&mut self, base: &str, h: u64, s: &str, idx: u32) -> bool {
        let parts = &self.parts;
        self.used
            .claim(h, idx, |i| parts.get(base, i) == s)
            .is_some()
    }

    /// Names the next node, whose own name `raw` (hash `h`) is `base[at..at + raw.len()]`: that
    /// name when it is allowed and free, else a sanitized form with the first free `_N` suffix.
    fn add(&mut self, base: &str, h: u64, raw: &str, at: u32, reserved: &Reserved) {
        let idx = self.parts.spans.len() as u32;
        if reserved.allows(base, at, raw, h) && !self.claim(base, h, raw, idx) {
            self.parts.spans.push((at, raw.len() as u32));
            return;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        for (k, c) in raw.chars().enumerate() {
            if c.is_ascii_alphanumeric() || c == '_' {
                if k == 0 && c.is_ascii_digit() {
                    scratch.push('_');
                }
                scratch.push(c);
            } else {
                scratch.push('_');
            }
        }
        // A suffix cannot un-reserve a name that starts with the layout prefix.
        if scratch.is_empty() || scratch.starts_with(reserved.prefix) {
            scratch.insert(0, 'v');
        }
        let base_len = scratch.len();
        let mut k = 0u64;
        // The candidate is pushed first so `claim` can compare against it by index.
        loop {
            let h = hash_bytes(scratch.as_bytes());
            self.parts.push_extra(&scratch);
            if !reserved.is_reserved_h(h, &scratch) && !self.claim(base, h, &scratch, idx) {
                break;
            }
            self.parts.spans.pop();
            let extra = &mut self.parts.extra;
            extra.truncate(extra.len() - scratch.len());
            k += 1;
            scratch.truncate(base_len);
            scratch.push('_');
            scratch.push_str(itoa::Buffer::new().format(k));
        }
        self.scratch = scratch;
    }
}

/// From this many nodes, [`assign`] checks whether every name stays as it is by buckets
/// ([`own_names`]) rather than in one table ([`own_names_small`]).
pub const BUCKETED_MIN_NODES: usize = 1 << 15;

/// [`Names::own`] when every node of `g` keeps its own name under [`assign`] (each is an
/// identifier, not reserved, and no two are equal), else None. Where `claim_each`'s uniqueness
/// table is read at random (and outgrows the caches on large graphs), this reads and writes
/// memory in order: the names' hashes are bucketed by their top bits, then each bucket is
/// searched for a repeat in a table small enough for the caches. A repeated hash answers None
/// (equal names, or a 64-bit collision of different ones, which `claim_each` then tells apart).
pub fn own_names<'a>(p: &'a Program, g: &'a Graph, reserved: &Reserved) -> Option<Names<'a>> {
    let n = g.nodes.len();
    // About 2,048 hashes (16 KiB) a bucket, searched in a table of at least twice as many slots.
    let bits = (n / 2048).max(2).next_power_of_two().trailing_zeros();
    let bucket = |h: u64| (h >> (64 - bits)) as usize;
    let mut hashes = Vec::with_capacity(n);
    let mut starts = vec![0usize; (1 << bits) + 1];
    for node in &g.nodes {
        let raw = p.str(node.name);
        let h = hash_bytes(raw.as_bytes());
        if !reserved.allows(&p.text, node.name.start, raw, h) {
            return None;
        }
        starts[bucket(h) + 1] += 1;
        hashes.push(h);
    }
    let largest = starts.iter().copied().max().unwrap_or(0);
    for b in 1..starts.len() {
        starts[b] += starts[b - 1];
    }
    // Placing bucket `b`'s hashes moves `starts[b]` to where they end, which is where bucket
    // `b + 1` begins.
    let mut sorted = vec![0u64; n];
    for &h in &hashes {
        let b = bucket(h);
        sorted[starts[b]] = h;
        starts[b] += 1;
    }
    drop(hashes);
    // Slot `i` holds a hash of the bucket `stamp[i] - 1` (none if 0): a stale slot from an
    // earlier bucket is empty for this one, so the table is never cleared.
    let size = (2 * largest).max(8).next_power_of_two();
    let (mut slots, mut stamp) = (vec![0u64; size], vec![0u64; size]);
    let mut begin = 0;
    for (b, &end) in starts[..1 << bits].iter().enumerate() {
        let now = b as u64 + 1;
        for &h in &sorted[begin..end] {
            let mut i = h as usize & (size - 1);
            while stamp[i] == now {
                if slots[i] == h {
                    return None;
                }
                i = (i + 1) & (size - 1);
            }
            (slots[i], stamp[i]) = (h, now);
        }
        begin = end;
    }
    Some(Names::of_nodes(p, g))
}

/// [`own_names`] for functions under [`BUCKETED_MIN_NODES`] nodes: claims each name in a
/// uniqueness table as [`claim_each`] does, comparing with the nodes' own names, so that no
/// name is recorded.
fn own_names_small<'a>(p: &'a Program, g: &'a Graph, reserved: &Reserved) -> Option<Names<'a>> {
    let mut used: Table<u32> = Table::with_capacity(g.nodes.len());
    let name_of = |i: u32| p.str(g.nodes[i as usize].name);
    for (idx, node) in g.nodes.iter().enumerate() {
        let raw = p.str(node.name);
        let h = hash_bytes(raw.as_bytes());
        if !reserved.allows(&p.text, node.name.start, raw, h)
            || used.claim(h, idx as u32, |i| name_of(i) == raw).is_some()
        {
            return None;
        }
    }
    Some(Names::of_nodes(p, g))
}

/// Assigns every node of `g` a unique identifier (see [`Assigner::add`]): the nodes' own names
/// when [`own_names`] (from [`BUCKETED_MIN_NODES`] nodes) or [`own_names_small`] finds that
/// every node keeps its own, else [`claim_each`].
pub fn assign<'a>(p: &'a Program, g: &'a Graph, reserved: &Reserved) -> Names<'a> {
    let own = match g.nodes.len() >= BUCKETED_MIN_NODES {
        true => own_names(p, g, reserved),
        false => own_names_small(p, g, reserved),
    };
    own.unwrap_or_else(|| claim_each(p, g, reserved))
}

/// Assigns every node of `g` a unique identifier (see [`Assigner::add`]), claiming the names
/// one by one in the uniqueness table.
pub fn claim_each<'a>(p: &'a Program, g: &'a Graph, reserved: &Reserved) -> Names<'a> {
    /// How far ahead the uniqueness table's slots are prefetched.
    const AHEAD: usize = 8;
    let mut a = Assigner::new(g.nodes.len());
    let hash_of = |j: usize| {
        g.nodes
            .get(j)
            .map_or(0, |node| hash_bytes(p.str(node.name).as_bytes()))
    };
    // Hashes of the names `AHEAD` nodes on, by index modulo `AHEAD`.
    let mut ahead: [u64; AHEAD] = std::array::from_fn(hash_of);
    for (idx, node) in g.nodes.iter().enumerate() {
        let h = ahead[idx % AHEAD];
        ahead[idx % AHEAD] = hash_of(idx + AHEAD);
        a.used.prefetch(ahead[idx % AHEAD]);
        a.add(&p.text, h, p.str(node.name), node.name.start, reserved);
    }
    a.parts.over(&p.text)
}

/// [`claim_each`] for nodes handed over one at a time while the graph is still being read, from
/// copies of their names: the result ([`Namer::finish`]) names kept names by their spans in the
/// program text, exactly as `claim_each` would.
pub struct Namer {
    /// The copies, in node order.
    text: String,
    a: Assigner,
    /// Per node, where its name starts in the program text.
    at: Vec<u32>,
}

impl Namer {
    /// A namer for a function of about `n` nodes.
    pub fn new(n: usize) -> Namer {
        Namer {
            text: String::with_capacity(n * 16),
            a: Assigner::new(n),
            at: Vec::with_capacity(n),
        }
    }

    /// Names the next node, whose name is `name` (of [`hash_bytes`] `h`), found at `at` in the
    /// program text.
    pub fn add(&mut self, name: &str, h: u64, at: u32, reserved: &Reserved) {
        let local = self.text.len() as u32;
        self.text.push_str(name);
        self.at.push(at);
        self.a.add(&self.text, h, name, local, reserved);
    }

    /// A namer over a copy of the whole program text, which [`Namer::extend`] keeps up to
    /// date and [`Namer::add_at`] takes names from: its names are spans of that copy, which
    /// [`Namer::take_text`] hands over.
    pub fn mirrored(n: usize) -> Namer {
        Namer {
            text: String::with_capacity(n * 24),
            a: Assigner::new(n),
            at: Vec::new(),
        }
    }

    /// Appends the program text added since the last call (mirrored namers).
    pub fn extend(&mut self, added: &str) {
        self.text.push_str(added);
    }

    /// The program text so far (mirrored namers).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Names the next node, whose name (of [`hash_bytes`] `h`) is `name` of the copy.
    pub fn add_at(&mut self, name: Span, h: u64, reserved: &Reserved) {
        let raw = self.text.get(name.range()).unwrap_or("");
        self.a.add(&self.text, h, raw, name.start, reserved);
    }

    /// Runs `f` on the names so far, over the program text copy, which it may borrow through
    /// a program built around it: `f` gets the copy and hands it back (mirrored namers).
    pub fn lend<R>(&mut self, f: impl FnOnce(String, NameParts) -> (String, NameParts, R)) -> R {
        let text = std::mem::take(&mut self.text);
        let parts = std::mem::take(&mut self.a.parts);
        let (text, parts, r) = f(text, parts);
        (self.text, self.a.parts) = (text, parts);
        r
    }

    /// The program text copy, which the names of a mirrored namer point into.
    pub fn take_text(&mut self) -> String {
        std::mem::take(&mut self.text)
    }

    /// Asks the CPU to start loading the uniqueness-table slot of a name hashing to `h`.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        self.a.used.prefetch(h);
    }

    /// The names, with kept ones moved from the copies to the program text. What remains in
    /// the namer is scratch: [`Namer::discard`] it.
    pub fn finish(&mut self) -> NameParts {
        let mut parts = std::mem::take(&mut self.a.parts);
        for (span, &at) in parts.spans.iter_mut().zip(&self.at) {
            if span.1 & EXTRA == 0 {
                span.0 = at;
            }
        }
        parts
    }

    /// Drops the copies and the uniqueness table, handing their pages back to the system
    /// first.
    pub fn discard(self) {
        discard(self.text.into_bytes());
        discard(self.at);
        self.a.used.discard();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_sorted_for_binary_search() {
        let mut v = BUILTINS.to_vec();
        v.sort_unstable();
        assert_eq!(v, BUILTINS);
    }

    /// `own_names` answers exactly when claiming the names one by one keeps every node's own
    /// name, with the same spans: on graphs of unique names, and with one repeat, reserved
    /// name or non-identifier placed first, in the middle or last.
    #[test]
    fn own_names_agrees_with_claiming_each() {
        use crate::ir::{Op, Program, Target};
        let r = Reserved {
            prefix: "__fx_",
            fn_name: "f",
        };
        // Both sides of BUCKETED_MIN_NODES: `own_names` and `own_names_small`.
        let cases = |n: usize| {
            [
                (n, None, 0),
                (n, Some("v_17"), 0),
                (n, Some("v_17"), n / 2),
                (n, Some("v_0"), n - 1),
                (n, Some("len"), n / 3),
                (n, Some("__fx_c0"), n - 1),
                (n, Some("f"), 5),
                (n, Some("1x"), n / 2),
                (n, Some("a.b"), 0),
            ]
        };
        for (n, bad, at) in cases(40_000).into_iter().chain(cases(1_000)) {
            let mut p = Program::default();
            let g = p.add_graph();
            for i in 0..n {
                let name = match bad {
                    Some(b) if i == at => b.to_string(),
                    _ => format!("v_{i}"),
                };
                let t = p.push_str(&name);
                p.add_node(g, Op::Placeholder, &name, Target::Param(t), &[], &[]);
            }
            let g = &p.graphs[0];
            let each = claim_each(&p, g, &r);
            let own = match n >= BUCKETED_MIN_NODES {
                true => own_names(&p, g, &r),
                false => own_names_small(&p, g, &r),
            };
            assert_eq!(own.is_some(), each.all_own(), "{bad:?} at {at} of {n}");
            let got = assign(&p, g, &r);
            for i in 0..n as u32 {
                assert_eq!(got.get(i), each.get(i));
                if let Some(own) = &own {
                    assert_eq!(own.get(i), each.get(i));
                }
            }
        }
    }

    #[test]
    fn reserved_prefixes_are_renamed_without_looping() {
        use crate::ir::{Op, Program, Target};
        let mut p = Program::default();
        let g = p.add_graph();
        for n in [
            "__fx_c0", "__fx_c0", "v__fx_c0", "torch", "torch_1", "", "9x", "class", "f",
        ] {
            let t = p.push_str(n);
            p.add_node(g, Op::Placeholder, n, Target::Param(t), &[], &[]);
        }
        let r = Reserved {
            prefix: "__fx_",
            fn_name: "f",
        };
        let names = assign(&p, &p.graphs[0], &r);
        let got: Vec<&str> = (0..9).map(|i| names.get(i)).collect();
        assert_eq!(
            got,
            [
                "v__fx_c0",
                "v__fx_c0_1",
                "v__fx_c0_2",
                "torch_1",
                "torch_1_1",
                "v",
                "_9x",
                "class_1",
                "f_1"
            ]
        );
    }

    #[test]
    fn every_global_name_is_taken_and_others_are_not() {
        for s in KEYWORDS.iter().chain(BUILTINS).chain(MODULE_GLOBALS) {
            assert!(taken_globally(hash_bytes(s.as_bytes()), s), "{s}");
        }
        for s in ["getitem_1", "x", "submod_0", "lens", "Len", ""] {
            assert!(!taken_globally(hash_bytes(s.as_bytes()), s), "{s}");
        }
    }

    #[test]
    fn keywords_and_only_keywords() {
        for k in KEYWORDS {
            assert!(is_keyword(k), "{k}");
        }
        for s in [
            "if_", "iff", "Non", "scale", "sizes", "classes", "", "_", "é",
        ] {
            assert!(!is_keyword(s), "{s}");
        }
    }

    #[test]
    fn identifiers_checked_sixteen_bytes_at_a_time_agree() {
        // Every byte value at every position of names of 1 to 16 bytes, followed by more text.
        let mut text = Vec::new();
        let mut cases = Vec::new();
        for len in 1..=16usize {
            for pos in 0..len {
                for b in 0..=255u8 {
                    let mut name = vec![b'a'; len];
                    name[pos] = b;
                    cases.push((text.len(), len));
                    text.extend_from_slice(&name);
                }
            }
        }
        text.extend_from_slice(b"tail_of_sixteen_");
        for &(at, len) in &cases {
            let want = is_identifier(&text[at..at + len]);
            assert_eq!(
                is_identifier_at(&text, at, len),
                want,
                "{:?}",
                &text[at..at + len]
            );
        }
        let long = b"tail_of_sixteen_xx";
        assert!(is_identifier_at(long, 0, 4) && is_identifier_at(long, 2, 16));
        assert!(!is_identifier_at(b"1ail_of_sixteen_xx", 0, 4) && !is_identifier_at(b"1abc", 0, 4));
        assert!(!is_identifier_at(b"", 0, 0) && !is_identifier_at(long, 0, 0));
    }

    #[test]
    fn identifiers() {
        for s in ["_", "a", "a1", "_9", "Z_z"] {
            assert!(is_identifier(s.as_bytes()), "{s}");
        }
        for s in ["", "1a", "a-b", "a.b", "é", "a b", "a\0"] {
            assert!(!is_identifier(s.as_bytes()), "{s}");
        }
    }

    #[test]
    fn call_names() {
        assert!(check_call_name("torch.ops.aten.add.Tensor").is_ok());
        assert!(check_call_name("operator.add").is_ok());
        assert!(check_call_name("len").is_ok());
        assert!(check_call_name("eval").is_err());
        assert!(check_call_name("os.system").is_err());
        assert!(check_call_name("len.x").is_err());
        assert!(check_call_name("torch.x); import os; (").is_err());
        assert!(check_call_name("torch..x").is_err());
        assert!(check_call_name("").is_err());
    }
}
