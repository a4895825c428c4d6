//! The crate's one error type: where the problem is and a typed reason, turned into the Python
//! `CodegenError` in exactly one place (the `From` impl at the bottom).

use std::fmt;

/// Where a problem was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A node that cannot become code: its op, name and target, and why.
    Node {
        op: &'static str,
        name: String,
        target: String,
        reason: Reason,
    },
    /// Malformed serialized bytes: the byte offset, and why.
    Serial { offset: usize, reason: Reason },
    /// A problem with the request or the program as a whole.
    Invalid(Reason),
}

/// Why something cannot become code; each reason's message (`Display`, below) says what it
/// means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    UnknownOp(String),
    NameNotStr,
    TargetNotStr,
    StringCallTarget(String),
    ArgsNotTuple,
    KwargsNotDict,
    KeyNotStr,
    DuplicateKeyword(String),
    TooManyKwargs,
    NotEarlierNode(String),
    TooDeep,
    MissingChild(String),
    MissingAttr(String),
    Variadic,
    PlaceholderArity,
    DefaultIsNode(String),
    DefaultOrder,
    OutputNotLast,
    OutputArity,
    GetAttrArgs,
    MethodWithoutObject,
    BadMethodName,
    TargetMismatch,
    CallName(String, crate::pyident::CallRule),
    ChildOrder,
    Index { what: &'static str, index: u64 },
    BadInt,
    BadSpan,
    BadFnName(String),
    UnknownStyle(String),
    CallModuleNotAllowed { target: String, inlined: bool },
    TooLarge { bound: u64, limit: u64 },
    BadMagic,
    Version(u8, u8),
    UnexpectedEnd,
    VarintOverflow,
    Exceeds(u64),
    NotUtf8,
    UnknownTag(&'static str, u8),
    Trailing(usize),
    NoGraph,
    BrokenNodeList,
}

impl Reason {
    pub fn index(what: &'static str, index: impl Into<u64>) -> Reason {
        let index = index.into();
        Reason::Index { what, index }
    }
}

/// The crate's result alias.
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::pyident::CallRule;
        use Reason::*;
        match self {
            UnknownOp(op) => write!(f, "unknown op {op:?}"),
            NameNotStr => f.write_str("the name is not a str"),
            TargetNotStr => f.write_str("the target is not a str"),
            StringCallTarget(t) => write!(
                f,
                "call_function target is the str {t:?}, not a callable (torch.fx calls the target \
                 object; use the function itself)"
            ),
            ArgsNotTuple => f.write_str("args is not a tuple"),
            KwargsNotDict => f.write_str("kwargs is not a dict"),
            KeyNotStr => f.write_str("a keyword argument's key is not a str"),
            DuplicateKeyword(k) => write!(f, "keyword argument {k:?} is given twice"),
            TooManyKwargs => f.write_str("more than 65535 keyword arguments"),
            NotEarlierNode(n) => write!(
                f,
                "argument {n:?} is not a node defined earlier in this graph"
            ),
            TooDeep => f.write_str("arguments or graphs nest too deeply"),
            MissingChild(c) => write!(f, "missing child: no submodule named {c:?}"),
            MissingAttr(a) => write!(f, "get_attr target {a:?} does not exist"),
            Variadic => f.write_str("variadic placeholders are not supported"),
            PlaceholderArity => f.write_str("a placeholder takes at most one default"),
            DefaultIsNode(n) => write!(
                f,
                "the placeholder's default refers to node {n:?}; a default must be a value"
            ),
            DefaultOrder => f.write_str("a placeholder without default follows one with a default"),
            OutputNotLast => f.write_str("the output node must be the last node"),
            OutputArity => f.write_str("the output node takes one argument"),
            GetAttrArgs => f.write_str("get_attr takes no arguments"),
            MethodWithoutObject => f.write_str("call_method needs the object as first argument"),
            BadMethodName => f.write_str("the method name is not an allowed Python identifier"),
            TargetMismatch => f.write_str("the target kind does not fit the op"),
            CallName(name, rule) => match rule {
                CallRule::NotDotted => write!(f, "call target {name:?} is not a dotted identifier"),
                CallRule::NotAllowed => write!(f, "call target {name:?} is not allowed by name"),
                CallRule::NotAllowedUntrusted => {
                    write!(f, "call target {name:?} is not allowed in untrusted input")
                }
            },
            ChildOrder => f.write_str("an inlined child must come after its caller"),
            Index { what, index } => write!(f, "{what} index {index} is out of range"),
            BadInt => f.write_str(
                "malformed integer text (digits without leading zeros, at most 4300 of them)",
            ),
            BadSpan => f.write_str("a text, bytes or argument span is out of range"),
            BadFnName(n) => write!(f, "function name {n:?} is not a usable identifier"),
            UnknownStyle(s) => write!(f, "unknown style {s:?}"),
            CallModuleNotAllowed { target, inlined } => {
                write!(f, "call_module is not allowed for codegen target {target}")?;
                if *inlined {
                    f.write_str(
                        " inside an inlined child (vLLM layout passes submodules to the entry \
                         function only)",
                    )?;
                }
                Ok(())
            }
            TooLarge { bound, limit } => write!(
                f,
                "the source could take {bound} bytes, more than the {limit} allowed for this input"
            ),
            BadMagic => f.write_str("not a serialized node list (bad magic)"),
            Version(v, want) => {
                write!(f, "unsupported format version {v} (this reads {want})")
            }
            UnexpectedEnd => f.write_str("unexpected end of data"),
            VarintOverflow => f.write_str("varint overflows 64 bits"),
            Exceeds(n) => write!(f, "count or length {n} exceeds the data left"),
            NotUtf8 => f.write_str("string is not valid UTF-8"),
            UnknownTag(what, t) => write!(f, "unknown {what} {t}"),
            Trailing(n) => write!(f, "{n} trailing bytes"),
            NoGraph => f.write_str("the program has no graph"),
            BrokenNodeList => f.write_str("the graph's node list is broken"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Node {
                op,
                name,
                target,
                reason,
            } => write!(
                f,
                "cannot generate code for node {name:?} (op={op}, target={target}): {reason}"
            ),
            Error::Serial { offset, reason } => {
                write!(f, "invalid serialized node list at byte {offset}: {reason}")
            }
            Error::Invalid(reason) => reason.fmt(f),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(feature = "python")]
pyo3::create_exception!(
    fxcodegen,
    CodegenError,
    pyo3::exceptions::PyRuntimeError,
    "A graph (or serialized node list) fxcodegen cannot turn into code. When one node is the \
     cause, `node`, `op` and `target` are its name, op and target as text (else None), and the \
     message names them too."
);

/// The attributes of `CodegenError` that name the node at fault; the class holds None for each.
#[cfg(feature = "python")]
pub const NODE_ATTRS: [&str; 3] = ["node", "op", "target"];

#[cfg(feature = "python")]
impl From<Error> for pyo3::PyErr {
    fn from(e: Error) -> pyo3::PyErr {
        use pyo3::types::PyAnyMethods;
        let err = CodegenError::new_err(e.to_string());
        let attrs = match &e {
            Error::Node {
                op, name, target, ..
            } => [name.as_str(), *op, target.as_str()],
            _ => return err,
        };
        pyo3::Python::attach(|py| {
            let value = err.value(py);
            let mut pairs = NODE_ATTRS.into_iter().zip(attrs);
            let set = pairs.try_for_each(|(attr, v)| value.setattr(attr, v));
            // Setting them fails only when Python is out of memory: raise that instead.
            set.err().unwrap_or(err)
        })
    }
}

impl Error {
    /// The error naming `node` of `p`.
    pub fn node(p: &crate::ir::Program, node: &crate::ir::Node, reason: Reason) -> Error {
        Error::Node {
            op: node.op.as_str(),
            name: p.str(node.name).into(),
            target: p.target_text(node.target),
            reason,
        }
    }
}
