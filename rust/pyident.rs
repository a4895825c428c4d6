//! Python's identifier rules, keywords and builtins, and which call names generated code may
//! write: data and pure functions.

/// Globals the generated module binds besides the builtins.
pub const MODULE_GLOBALS: &[&str] = &["torch", "operator", "__builtins__"];

/// Builtins a call target may never name: they run code or reach outside the graph.
#[rustfmt::skip]
const DENIED_CALLS: &[&str] = &[
    "eval", "exec", "compile", "__import__", "open", "breakpoint", "input", "globals", "locals",
    "vars", "exit", "quit", "help", "setattr", "delattr", "__build_class__", "__loader__",
];

/// `operator` functions untrusted input may call: pure arithmetic, comparison and container
/// operations (never `attrgetter`, `methodcaller`, `call`, which reach attributes or call values).
#[rustfmt::skip]
const SAFE_OPERATOR: &[&str] = &[
    "abs", "add", "and_", "concat", "contains", "countOf", "eq", "floordiv", "ge", "getitem",
    "gt", "iadd", "iand", "iconcat", "ifloordiv", "ilshift", "imatmul", "imod", "imul", "index",
    "indexOf", "inv", "invert", "ior", "ipow", "irshift", "is_", "is_not", "isub", "itruediv",
    "ixor", "le", "lshift", "lt", "matmul", "mod", "mul", "ne", "neg", "not_", "or_", "pos",
    "pow", "rshift", "sub", "truediv", "truth", "xor",
];

/// Builtins untrusted input may call: value constructors and pure functions.
#[rustfmt::skip]
const SAFE_BUILTINS: &[&str] = &[
    "abs", "all", "any", "bool", "bytes", "complex", "dict", "divmod", "float", "frozenset",
    "int", "isinstance", "len", "list", "max", "min", "pow", "range", "round", "set", "slice",
    "sorted", "str", "sum", "tuple",
];

/// CPython's default limit on the digits of an int literal (`sys.get_int_max_str_digits()`).
pub const MAX_INT_DIGITS: usize = 4300;

/// Python 3.11's keywords and soft keywords (`_` excluded).
#[rustfmt::skip]
pub fn is_keyword(s: &str) -> bool {
    matches!(
        s,
        "False" | "None" | "True" | "and" | "as" | "assert" | "async" | "await" | "break" |
        "case" | "class" | "continue" | "def" | "del" | "elif" | "else" | "except" | "finally" |
        "for" | "from" | "global" | "if" | "import" | "in" | "is" | "lambda" | "match" |
        "nonlocal" | "not" | "or" | "pass" | "raise" | "return" | "try" | "while" | "with" |
        "yield"
    )
}

/// `dir(builtins)` on CPython 3.11.
#[rustfmt::skip]
pub fn is_builtin(s: &str) -> bool {
    matches!(
        s,
        "ArithmeticError" | "AssertionError" | "AttributeError" | "BaseException" |
        "BaseExceptionGroup" | "BlockingIOError" | "BrokenPipeError" | "BufferError" |
        "BytesWarning" | "ChildProcessError" | "ConnectionAbortedError" | "ConnectionError" |
        "ConnectionRefusedError" | "ConnectionResetError" | "DeprecationWarning" | "EOFError" |
        "Ellipsis" | "EncodingWarning" | "EnvironmentError" | "Exception" | "ExceptionGroup" |
        "False" | "FileExistsError" | "FileNotFoundError" | "FloatingPointError" |
        "FutureWarning" | "GeneratorExit" | "IOError" | "ImportError" | "ImportWarning" |
        "IndentationError" | "IndexError" | "InterruptedError" | "IsADirectoryError" | "KeyError" |
        "KeyboardInterrupt" | "LookupError" | "MemoryError" | "ModuleNotFoundError" | "NameError" |
        "None" | "NotADirectoryError" | "NotImplemented" | "NotImplementedError" | "OSError" |
        "OverflowError" | "PendingDeprecationWarning" | "PermissionError" | "ProcessLookupError" |
        "RecursionError" | "ReferenceError" | "ResourceWarning" | "RuntimeError" |
        "RuntimeWarning" | "StopAsyncIteration" | "StopIteration" | "SyntaxError" |
        "SyntaxWarning" | "SystemError" | "SystemExit" | "TabError" | "TimeoutError" | "True" |
        "TypeError" | "UnboundLocalError" | "UnicodeDecodeError" | "UnicodeEncodeError" |
        "UnicodeError" | "UnicodeTranslateError" | "UnicodeWarning" | "UserWarning" |
        "ValueError" | "Warning" | "ZeroDivisionError" | "__build_class__" | "__debug__" |
        "__doc__" | "__import__" | "__loader__" | "__name__" | "__package__" | "__spec__" | "abs" |
        "aiter" | "all" | "anext" | "any" | "ascii" | "bin" | "bool" | "breakpoint" | "bytearray" |
        "bytes" | "callable" | "chr" | "classmethod" | "compile" | "complex" | "copyright" |
        "credits" | "delattr" | "dict" | "dir" | "divmod" | "enumerate" | "eval" | "exec" |
        "exit" | "filter" | "float" | "format" | "frozenset" | "getattr" | "globals" | "hasattr" |
        "hash" | "help" | "hex" | "id" | "input" | "int" | "isinstance" | "issubclass" | "iter" |
        "len" | "license" | "list" | "locals" | "map" | "max" | "memoryview" | "min" | "next" |
        "object" | "oct" | "open" | "ord" | "pow" | "print" | "property" | "quit" | "range" |
        "repr" | "reversed" | "round" | "set" | "setattr" | "slice" | "sorted" | "staticmethod" |
        "str" | "sum" | "super" | "tuple" | "type" | "vars" | "zip"
    )
}

/// A name generated code must not bind: a keyword, a builtin or a module global.
pub fn is_taken(s: &str) -> bool {
    // No keyword, builtin or module global ends with a digit; most node names do.
    let digit = s.as_bytes().last().is_some_and(u8::is_ascii_digit);
    !digit && (is_keyword(s) || is_builtin(s) || MODULE_GLOBALS.contains(&s))
}

/// An ASCII Python identifier (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
            bytes.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        }
        _ => false,
    }
}

/// An identifier that is not a keyword: usable as `key=` or `.name`.
pub fn is_plain_name(s: &str) -> bool {
    is_identifier(s) && !is_keyword(s)
}

/// Why a call name cannot be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallRule {
    /// Not identifiers joined by dots.
    NotDotted,
    /// Not rooted at `torch`, `operator` or an allowed builtin.
    NotAllowed,
    /// Outside what untrusted input may name.
    NotAllowedUntrusted,
}

/// Whether a dotted call-target name is safe to write: identifiers only, rooted at `torch`,
/// `operator` or a builtin that runs no code.
pub fn check_call_name(name: &str) -> Result<(), CallRule> {
    if !name.split('.').all(is_plain_name) {
        return Err(CallRule::NotDotted);
    }
    let mut parts = name.split('.');
    let root = parts.next().unwrap_or("");
    let rooted =
        root == "torch" || root == "operator" || (is_builtin(root) && parts.next().is_none());
    if !rooted || DENIED_CALLS.contains(&root) {
        return Err(CallRule::NotAllowed);
    }
    Ok(())
}

/// The stricter rule for untrusted input, and for every name the trusted side writes:
/// `torch.ops.<namespace>.<op>[.<overload>]`, safe `operator` functions and safe builtins.
pub fn check_untrusted_call_name(name: &str) -> Result<(), CallRule> {
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
    ok.then_some(()).ok_or(CallRule::NotAllowedUntrusted)
}

/// Decimal int text as Python reads it back: `-?(0|[1-9][0-9]*)` of at most
/// [`MAX_INT_DIGITS`] digits.
pub fn is_int_literal(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s).as_bytes();
    !digits.is_empty()
        && digits.len() <= MAX_INT_DIGITS
        && digits.iter().all(u8::is_ascii_digit)
        && (digits[0] != b'0' || digits.len() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_sorted_and_keywords_listed() {
        assert!(is_keyword("match") && is_keyword("None") && !is_keyword("_"));
        assert!(is_builtin("len") && !is_builtin("torch") && is_taken("torch"));
    }

    #[test]
    fn identifiers() {
        for ok in ["x", "_", "a1", "__fx_c0"] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in ["", "1a", "a b", "é", "a-b", "a.b"] {
            assert!(!is_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn call_names() {
        assert!(check_untrusted_call_name("torch.ops.aten.add.Tensor").is_ok());
        assert!(check_untrusted_call_name("operator.add").is_ok());
        assert!(check_untrusted_call_name("len").is_ok());
        assert_eq!(check_call_name("eval"), Err(CallRule::NotAllowed));
        assert_eq!(check_call_name("os.system"), Err(CallRule::NotAllowed));
        assert_eq!(check_call_name("a b"), Err(CallRule::NotDotted));
        assert_eq!(check_call_name("torch.class"), Err(CallRule::NotDotted));
        for bad in [
            "getattr",
            "operator.attrgetter",
            "torch.load",
            "torch.ops.__x__.y",
        ] {
            assert!(check_untrusted_call_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn int_literals() {
        for ok in ["0", "-0", "7", "-12", "10"] {
            assert!(is_int_literal(ok), "{ok}");
        }
        for bad in ["", "-", "007", "-007", "00", "1_0", "+1", "1a"] {
            assert!(!is_int_literal(bad), "{bad}");
        }
        assert!(is_int_literal(&"9".repeat(MAX_INT_DIGITS)));
        assert!(!is_int_literal(&"9".repeat(MAX_INT_DIGITS + 1)));
    }
}
