//! The one error type of the crate, and its single conversion to a Python exception.

use std::fmt;

/// Everything that can go wrong before emission (the emitter itself cannot fail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A node the engine cannot handle: its op, name and target, and why.
    Node {
        op: String,
        name: String,
        target: String,
        reason: String,
    },
    /// A malformed serialized node list: the byte offset and why.
    Serial { offset: usize, reason: String },
    /// A problem with the request itself rather than one node (bad option, bad layout).
    Invalid(String),
}

/// The crate's result alias.
pub type Result<T> = std::result::Result<T, Error>;

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
            Error::Invalid(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(feature = "python")]
pyo3::create_exception!(
    fxcodegen,
    CodegenError,
    pyo3::exceptions::PyRuntimeError,
    "A graph (or serialized node list) fxcodegen cannot turn into code; the message names the node."
);

#[cfg(feature = "python")]
impl From<Error> for pyo3::PyErr {
    fn from(e: Error) -> pyo3::PyErr {
        CodegenError::new_err(e.to_string())
    }
}
