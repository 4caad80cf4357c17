//! Value parsers for numeric flags: a value outside its range is refused by the command line
//! parser, with the flag named and exit status 2, before any work starts.

use clap::builder::RangedU64ValueParser;

/// A count that must be at least one (rows, steps, degrees, lengths, jobs).
pub fn at_least_one<T>() -> RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::fmt::Display,
{
    RangedU64ValueParser::new().range(1..)
}

fn number(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .map_err(|_| format!("`{text}` is not a number"))
}

/// A finite number above zero (a learning rate, a FLOP/s peak, a memory size).
pub fn positive(text: &str) -> Result<f64, String> {
    let value = number(text)?;
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err("must be a finite number above 0".to_string())
    }
}

/// A fraction in `[0, 1)` (the share of documents held out for validation).
pub fn fraction(text: &str) -> Result<f64, String> {
    let value = number(text)?;
    if (0.0..1.0).contains(&value) {
        Ok(value)
    } else {
        Err("must be in [0, 1)".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_outside_their_range_are_refused() {
        assert_eq!(positive("3e-4"), Ok(3e-4));
        for bad in ["0", "-1", "nan", "inf", "1e309", "x"] {
            assert!(positive(bad).is_err(), "{bad}");
        }
        assert_eq!(fraction("0"), Ok(0.0));
        assert_eq!(fraction("0.25"), Ok(0.25));
        for bad in ["1", "-0.1", "NaN", "2"] {
            assert!(fraction(bad).is_err(), "{bad}");
        }
    }
}
