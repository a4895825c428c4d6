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

/// Why something cannot become code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The node's `op` is no torch.fx op.
    UnknownOp(String),
    /// The node's name is not a str.
    NameNotStr,
    /// A placeholder's, call_method's, call_module's or get_attr's target is not a str.
    TargetNotStr,
    /// A call_function target is a str: torch.fx calls objects, so it would fail when called.
    StringCallTarget(String),
    /// The node's `args` is not a tuple.
    ArgsNotTuple,
    /// The node's `kwargs` is not a dict.
    KwargsNotDict,
    /// A keyword key is neither a str nor a pooled object.
    KeyNotStr,
    /// The same keyword twice on one call.
    DuplicateKeyword(String),
    /// More keyword arguments than a node may have.
    TooManyKwargs,
    /// An argument is a node that is not an earlier value of the same graph.
    NotEarlierNode(String),
    /// Arguments (or graph modules) nest deeper than [`crate::ir::MAX_DEPTH`].
    TooDeep,
    /// call_module names no child.
    MissingChild(String),
    /// get_attr names no attribute.
    MissingAttr(String),
    /// A `*args` placeholder.
    Variadic,
    /// A placeholder with more than one default.
    PlaceholderArity,
    /// A placeholder default that refers to a node (it would be evaluated at definition time).
    DefaultIsNode(String),
    /// A placeholder without default after one with a default.
    DefaultOrder,
    /// The output node is not the last node.
    OutputNotLast,
    /// The output node has more than one argument.
    OutputArity,
    /// get_attr with arguments.
    GetAttrArgs,
    /// call_method without the object to call it on.
    MethodWithoutObject,
    /// A method name that is not an identifier, or one starting with `_` in untrusted input.
    BadMethodName,
    /// A target of the wrong kind for the op.
    TargetMismatch,
    /// A call name generated code may not write.
    CallName(String, crate::pyident::CallRule),
    /// An inlined child's graph that does not come after its caller's.
    ChildOrder,
    /// An index past the end of what it indexes.
    Index { what: &'static str, index: u64 },
    /// Integer text that Python would not read back (`-007`, over 4,300 digits).
    BadInt,
    /// A reference into the program's arenas that is out of range.
    BadSpan,
    /// The entry function's name is not a usable identifier.
    BadFnName(String),
    /// The style is neither "native" nor "vllm".
    UnknownStyle(String),
    /// call_module where the layout has no submodules.
    CallModuleNotAllowed { target: String, inlined: bool },
    /// The source would be larger than the bound for this input.
    TooLarge { bound: u64, limit: u64 },
    /// The serialized bytes do not start with the magic.
    BadMagic,
    /// A format version this reader does not know: found, and the one it reads.
    Version(u8, u8),
    /// The bytes end early.
    UnexpectedEnd,
    /// A varint of more than 64 bits.
    VarintOverflow,
    /// A count or length larger than the bytes left.
    Exceeds(u64),
    /// Text that is not UTF-8.
    NotUtf8,
    /// An unknown tag byte: what it tags, and the byte.
    UnknownTag(&'static str, u8),
    /// Bytes left over after the program.
    Trailing(usize),
    /// A program with no graph.
    NoGraph,
    /// The graph's node list does not lead back to its start.
    BrokenNodeList,
}

/// The crate's result alias.
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::pyident::CallRule;
        match self {
            Reason::UnknownOp(op) => write!(f, "unknown op {op:?}"),
            Reason::NameNotStr => f.write_str("the name is not a str"),
            Reason::TargetNotStr => f.write_str("the target is not a str"),
            Reason::StringCallTarget(t) => write!(
                f,
                "call_function target is the str {t:?}, not a callable (torch.fx calls the target \
                 object; use the function itself)"
            ),
            Reason::ArgsNotTuple => f.write_str("args is not a tuple"),
            Reason::KwargsNotDict => f.write_str("kwargs is not a dict"),
            Reason::KeyNotStr => f.write_str("a keyword argument's key is not a str"),
            Reason::DuplicateKeyword(k) => write!(f, "keyword argument {k:?} is given twice"),
            Reason::TooManyKwargs => f.write_str("more than 65535 keyword arguments"),
            Reason::NotEarlierNode(n) => write!(
                f,
                "argument {n:?} is not a node defined earlier in this graph"
            ),
            Reason::TooDeep => f.write_str("arguments or graphs nest too deeply"),
            Reason::MissingChild(c) => write!(f, "missing child: no submodule named {c:?}"),
            Reason::MissingAttr(a) => write!(f, "get_attr target {a:?} does not exist"),
            Reason::Variadic => f.write_str("variadic placeholders are not supported"),
            Reason::PlaceholderArity => f.write_str("a placeholder takes at most one default"),
            Reason::DefaultIsNode(n) => write!(
                f,
                "the placeholder's default refers to node {n:?}; a default must be a value"
            ),
            Reason::DefaultOrder => {
                f.write_str("a placeholder without default follows one with a default")
            }
            Reason::OutputNotLast => f.write_str("the output node must be the last node"),
            Reason::OutputArity => f.write_str("the output node takes one argument"),
            Reason::GetAttrArgs => f.write_str("get_attr takes no arguments"),
            Reason::MethodWithoutObject => {
                f.write_str("call_method needs the object as first argument")
            }
            Reason::BadMethodName => {
                f.write_str("the method name is not an allowed Python identifier")
            }
            Reason::TargetMismatch => f.write_str("the target kind does not fit the op"),
            Reason::CallName(name, rule) => match rule {
                CallRule::NotDotted => write!(f, "call target {name:?} is not a dotted identifier"),
                CallRule::NotAllowed => write!(f, "call target {name:?} is not allowed by name"),
                CallRule::NotAllowedUntrusted => {
                    write!(f, "call target {name:?} is not allowed in untrusted input")
                }
            },
            Reason::ChildOrder => f.write_str("an inlined child must come after its caller"),
            Reason::Index { what, index } => write!(f, "{what} index {index} is out of range"),
            Reason::BadInt => f.write_str(
                "malformed integer text (digits without leading zeros, at most 4300 of them)",
            ),
            Reason::BadSpan => f.write_str("a text, bytes or argument span is out of range"),
            Reason::BadFnName(n) => write!(f, "function name {n:?} is not a usable identifier"),
            Reason::UnknownStyle(s) => write!(f, "unknown style {s:?}"),
            Reason::CallModuleNotAllowed { target, inlined } => {
                write!(f, "call_module is not allowed for codegen target {target}")?;
                if *inlined {
                    f.write_str(
                        " inside an inlined child (vLLM layout passes submodules to the entry \
                         function only)",
                    )?;
                }
                Ok(())
            }
            Reason::TooLarge { bound, limit } => write!(
                f,
                "the source could take {bound} bytes, more than the {limit} allowed for this input"
            ),
            Reason::BadMagic => f.write_str("not a serialized node list (bad magic)"),
            Reason::Version(v, want) => {
                write!(f, "unsupported format version {v} (this reads {want})")
            }
            Reason::UnexpectedEnd => f.write_str("unexpected end of data"),
            Reason::VarintOverflow => f.write_str("varint overflows 64 bits"),
            Reason::Exceeds(n) => write!(f, "count or length {n} exceeds the data left"),
            Reason::NotUtf8 => f.write_str("string is not valid UTF-8"),
            Reason::UnknownTag(what, t) => write!(f, "unknown {what} {t}"),
            Reason::Trailing(n) => write!(f, "{n} trailing bytes"),
            Reason::NoGraph => f.write_str("the program has no graph"),
            Reason::BrokenNodeList => f.write_str("the graph's node list is broken"),
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
