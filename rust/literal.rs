//! Python literals: every text reads back, in the generated namespace, as an equal value of the
//! same type. Floats match `repr` and read back bit-exact; non-finite floats are written as
//! `float('inf')` and the like; strings and bytes are quoted and escaped as CPython's `repr` does.

/// Writes an int in decimal.
pub fn int(out: &mut String, v: i64) {
    out.push_str(itoa::Buffer::new().format(v));
}

/// Writes a float exactly as CPython's `repr` does for finite values; infinities and NaN as
/// calls of the builtin `float` (never shadowed in generated code).
pub fn float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("float('nan')");
        return;
    }
    if v.is_infinite() {
        out.push_str(if v > 0.0 {
            "float('inf')"
        } else {
            "float('-inf')"
        });
        return;
    }
    if v == 0.0 {
        out.push_str(if v.is_sign_negative() { "-0.0" } else { "0.0" });
        return;
    }
    let mut buf = ryu::Buffer::new();
    let s = buf.format_finite(v);
    let neg = v < 0.0;
    let s = s.strip_prefix('-').unwrap_or(s);
    // Decompose ryu's text into significant digits and the decimal exponent of the first one.
    let (mant, exp_part) = match s.find('e') {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().unwrap_or(0)),
        None => (s, 0),
    };
    let mut digits = [0u8; 32];
    let mut nd = 0usize;
    let mut point: Option<usize> = None; // digits before the decimal point
    let mut lead_zeros = 0i32; // zeros between the point and the first significant digit
    for c in mant.bytes() {
        if c == b'.' {
            point = Some(nd);
        } else if nd == 0 && c == b'0' {
            if point.is_some() {
                lead_zeros += 1;
            }
        } else if nd < digits.len() {
            digits[nd] = c;
            nd += 1;
        }
    }
    let int_digits = point.unwrap_or(nd) as i32;
    let exp10 = if int_digits > 0 {
        int_digits - 1 + exp_part
    } else {
        -(lead_zeros + 1) + exp_part
    };
    while nd > 1 && digits[nd - 1] == b'0' {
        nd -= 1;
    }
    let d = &digits[..nd];
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp10) {
        if exp10 >= 0 {
            let ip = (exp10 + 1) as usize;
            for k in 0..ip {
                out.push(*d.get(k).unwrap_or(&b'0') as char);
            }
            out.push('.');
            if d.len() > ip {
                d[ip..].iter().for_each(|&c| out.push(c as char));
            } else {
                out.push('0');
            }
        } else {
            out.push_str("0.");
            for _ in 0..(-exp10 - 1) {
                out.push('0');
            }
            d.iter().for_each(|&c| out.push(c as char));
        }
    } else {
        out.push(d[0] as char);
        if d.len() > 1 {
            out.push('.');
            d[1..].iter().for_each(|&c| out.push(c as char));
        }
        out.push('e');
        out.push(if exp10 < 0 { '-' } else { '+' });
        let a = exp10.unsigned_abs();
        if a < 10 {
            out.push('0');
        }
        out.push_str(itoa::Buffer::new().format(a));
    }
}

fn quote_for(b: &[u8]) -> u8 {
    if b.contains(&b'\'') && !b.contains(&b'"') {
        b'"'
    } else {
        b'\''
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_hex(out: &mut String, prefix: &str, v: u32, width: u32) {
    out.push_str(prefix);
    for k in (0..width).rev() {
        out.push(HEX[((v >> (4 * k)) & 0xf) as usize] as char);
    }
}

fn escape_common(out: &mut String, c: u8, q: u8) -> bool {
    match c {
        b'\\' => out.push_str("\\\\"),
        b'\n' => out.push_str("\\n"),
        b'\r' => out.push_str("\\r"),
        b'\t' => out.push_str("\\t"),
        _ if c == q => {
            out.push('\\');
            out.push(q as char);
        }
        0x20..=0x7e => out.push(c as char),
        _ => return false,
    }
    true
}

/// Writes a `str` literal (CPython's quote choice; every non-ASCII character escaped).
pub fn str_repr(out: &mut String, s: &str) {
    let b = s.as_bytes();
    if b.iter()
        .all(|&c| (0x20..=0x7e).contains(&c) && c != b'\'' && c != b'\\')
    {
        out.reserve(b.len() + 2);
        out.push('\'');
        out.push_str(s);
        out.push('\'');
        return;
    }
    let q = quote_for(b);
    out.push(q as char);
    for ch in s.chars() {
        let cp = ch as u32;
        if cp < 0x80 {
            if !escape_common(out, cp as u8, q) {
                push_hex(out, "\\x", cp, 2);
            }
        } else if cp < 0x100 {
            push_hex(out, "\\x", cp, 2);
        } else if cp < 0x10000 {
            push_hex(out, "\\u", cp, 4);
        } else {
            push_hex(out, "\\U", cp, 8);
        }
    }
    out.push(q as char);
}

/// Writes a `bytes` literal with CPython's quoting and escapes.
pub fn bytes_repr(out: &mut String, b: &[u8]) {
    let q = quote_for(b);
    out.push('b');
    out.push(q as char);
    for &c in b {
        if !escape_common(out, c, q) {
            push_hex(out, "\\x", c as u32, 2);
        }
    }
    out.push(q as char);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_as_python_writes_them() {
        for v in [0, 1, 9, 10, 99, 255, 256, -1, -9, -10, i64::MIN, i64::MAX] {
            let mut s = String::new();
            int(&mut s, v);
            assert_eq!(s, v.to_string());
        }
    }

    fn f(v: f64) -> String {
        let mut s = String::new();
        float(&mut s, v);
        s
    }

    #[test]
    fn floats_match_python_repr() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e-7, "1.5e-07"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (123456.789, "123456.789"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (0.1, "0.1"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (f64::INFINITY, "float('inf')"),
            (f64::NEG_INFINITY, "float('-inf')"),
            (f64::NAN, "float('nan')"),
            (9999999999999998.0, "9999999999999998.0"),
            (12.0, "12.0"),
        ];
        for (v, want) in cases {
            assert_eq!(f(*v), *want, "{v:e}");
        }
    }

    #[test]
    fn strings() {
        let s = |x: &str| {
            let mut o = String::new();
            str_repr(&mut o, x);
            o
        };
        assert_eq!(s("abc"), "'abc'");
        assert_eq!(s("it's"), "\"it's\"");
        assert_eq!(s("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(s("x\n\t\\"), "'x\\n\\t\\\\'");
        assert_eq!(s("\x00\x7f"), "'\\x00\\x7f'");
        assert_eq!(s("é€😀"), "'\\xe9\\u20ac\\U0001f600'");
        assert_eq!(s("x); import os; ("), "'x); import os; ('");
        let mut o = String::new();
        bytes_repr(&mut o, b"a'\x00\xff\"");
        assert_eq!(o, "b'a\\'\\x00\\xff\"'");
    }
}
