//! Sizes as people write them: `memory_capacity = "80GiB"`, `cpu_memory = "2TB"`,
//! `cuda_context = 536870912` or `24e9`. A decimal unit is a power of 1000 (GB = 1e9 bytes, as
//! `nvidia-smi`'s marketing sizes and disk vendors count), a binary one a power of 1024
//! (GiB = 2^30, as `torch.cuda.memory_allocated` and `nvidia-smi`'s MiB count). The value must
//! come to a whole number of bytes; the arithmetic is exact (decimal digits in u128), so
//! "1.5GiB" is 1,610,612,736 and "0.1B" is an error, never a rounded figure. Lowercase "b"
//! (bits, as NIC speeds are quoted) is refused rather than guessed.

/// The units, longest first so "GiB" is not read as "B".
const UNITS: [(&str, u128); 10] = [
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("kB", 1_000),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
    ("B", 1),
];

/// What a size field accepts, for error messages.
pub const ALLOWED: &str = "an integer number of bytes, or a string with a unit: \"80GB\" (10^9), \"80GiB\" (2^30), \"512MiB\", \"2TB\", \"24e9\"";

/// Parses a size with an optional unit (see the module doc) into bytes.
pub fn parse(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (num, mult) = match UNITS.iter().find(|(u, _)| t.ends_with(u)) {
        Some((u, m)) => (t[..t.len() - u.len()].trim_end(), *m),
        None => {
            if let Some(c) = t.chars().last().filter(|c| c.is_ascii_alphabetic()) {
                let hint = if c == 'b' { " (a lowercase b is bits; sizes are in bytes: B)" } else { "" };
                return Err(format!("\"{text}\": unknown unit{hint}; expected {ALLOWED}"));
            }
            (t, 1)
        }
    };
    let (digits, exp10) = decimal(num).ok_or_else(|| format!("\"{text}\" is not a size; expected {ALLOWED}"))?;
    // value = digits x 10^exp10 x mult, exactly.
    let too_big = || format!("\"{text}\" is more than {} bytes", i64::MAX);
    let mut v = digits.checked_mul(mult).ok_or_else(too_big)?;
    if exp10 >= 0 {
        for _ in 0..exp10 {
            v = v.checked_mul(10).ok_or_else(too_big)?;
        }
    } else {
        for _ in 0..-exp10 {
            if v % 10 != 0 {
                return Err(format!("\"{text}\" is not a whole number of bytes"));
            }
            v /= 10;
        }
    }
    i64::try_from(v).map_err(|_| too_big())
}

/// `d+[.d*][e[+-]d+]` as (all digits, power of ten), or None. At most 30 significant digits
/// and an exponent within +-40, so the u128 arithmetic cannot overflow before it is checked.
fn decimal(s: &str) -> Option<(u128, i32)> {
    let (mant, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok().filter(|e| e.abs() <= 40)?),
        None => (s, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let ok = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !ok(int) || !ok(frac) || int.len() + frac.len() > 30 {
        return None;
    }
    let digits: u128 = format!("{int}{frac}").parse().ok()?;
    Some((digits, exp - frac.len() as i32))
}

/// serde: a required size field.
pub fn required<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    opt(d).map(|v| v.unwrap_or_default())
}

/// serde: an optional size field (integer, integral float or string with a unit).
pub fn opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = i64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(ALLOWED)
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<i64, E> {
            Ok(n)
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<i64, E> {
            i64::try_from(n).map_err(|_| E::custom(format!("{n} is more than {} bytes", i64::MAX)))
        }
        fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<i64, E> {
            // TOML reads 24e9 as a float; it is a size when it is a whole number in range.
            if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.2e18 {
                Ok(x as i64)
            } else {
                Err(E::custom(format!("{x} is not a whole number of bytes; expected {ALLOWED}")))
            }
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<i64, E> {
            parse(s).map_err(E::custom)
        }
    }
    d.deserialize_any(V).map(Some)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn units_decimal_and_binary() {
        assert_eq!(parse("80GB"), Ok(80_000_000_000));
        assert_eq!(parse("80GiB"), Ok(80 << 30));
        assert_eq!(parse("80 GiB"), Ok(80 << 30));
        assert_eq!(parse("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse("512MiB"), Ok(512 << 20));
        assert_eq!(parse("2TB"), Ok(2_000_000_000_000));
        assert_eq!(parse("24e9"), Ok(24_000_000_000));
        assert_eq!(parse("2.4e10 B"), Ok(24_000_000_000));
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("1kB"), Ok(1000));
    }

    #[test]
    fn refuses_what_it_cannot_read_exactly() {
        for bad in ["0.1B", "80Gb", "80gb", "80 GiBs", "GiB", "", "-1GB", "1e41", "1..5GB", "9e18GB", "1e-3B", "x"] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused: {:?}", parse(bad));
        }
        assert!(parse("80Gb").unwrap_err().contains("bits"));
        assert!(parse("9223372036854775807").is_ok());
        assert!(parse("9223372036854775808").unwrap_err().contains("more than"));
    }
}
