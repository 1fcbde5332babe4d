//! Hand-rolled argument parsing: `--flag VALUE` and `--flag=VALUE`.

use anyhow::{anyhow, bail, Context, Result};

/// Splits `args` into `(flag, value)` pairs; every flag takes exactly one value.
pub fn pairs(args: &[String], known: &[&str]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v.to_owned())),
            None => (arg.as_str(), None),
        };
        if !known.contains(&flag) {
            bail!(
                "unknown option {arg:?} (expected one of {})",
                known.join(", ")
            );
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| anyhow!("{flag} needs a value"))?,
        };
        out.push((flag.to_owned(), value));
    }
    Ok(out)
}

/// Parses a number, naming the option in the error.
pub fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    value
        .parse()
        .with_context(|| format!("{flag} {value:?}: not a valid number"))
}
