//! Log sequence numbers: a byte position in the WAL, printed by PostgreSQL as `X/Y`.

use std::fmt;
use std::str::FromStr;

/// A WAL position. Ordered, so "newer" is simply `>`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// `0/0`: "no position"; START_REPLICATION from it means "from the slot's confirmed_flush_lsn".
    pub const ZERO: Lsn = Lsn(0);
}

/// Error parsing the `X/Y` text form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hexadecimal numbers separated by '/', like 0/16B3748")]
pub struct ParseLsnError(pub String);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        // from_str_radix alone would also accept a leading '+'.
        let is_hex_u32 = |part: &str| {
            !part.is_empty() && part.len() <= 8 && part.bytes().all(|b| b.is_ascii_hexdigit())
        };
        if !is_hex_u32(hi) || !is_hex_u32(lo) {
            return Err(err());
        }
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Self {
        Lsn(v)
    }
}

impl From<Lsn> for u64 {
    fn from(v: Lsn) -> Self {
        v.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_like_postgres() {
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert_eq!(Lsn(0x16_B374_D848).to_string(), "16/B374D848");
        assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
    }

    #[test]
    fn parses_postgres_text_form() {
        assert_eq!("0/0".parse::<Lsn>(), Ok(Lsn::ZERO));
        assert_eq!("16/B374D848".parse::<Lsn>(), Ok(Lsn(0x16_B374_D848)));
        assert_eq!("16/b374d848".parse::<Lsn>(), Ok(Lsn(0x16_B374_D848)));
        assert_eq!("FFFFFFFF/FFFFFFFF".parse::<Lsn>(), Ok(Lsn(u64::MAX)));
    }

    #[test]
    fn round_trips_through_text() {
        for v in [0, 1, 0xFFFF_FFFF, 0x1_0000_0000, 0x16_B374_D848, u64::MAX] {
            assert_eq!(Lsn(v).to_string().parse::<Lsn>(), Ok(Lsn(v)));
        }
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "/",
            "0/",
            "/0",
            "0",
            "0/0/0",
            "G/0",
            "0/G",
            "+1/0",
            "0/+1",
            "-1/0",
            " 0/0",
            "0/0 ",
            "123456789/0",
            "0/123456789",
            "0x1/0",
        ] {
            assert_eq!(
                bad.parse::<Lsn>(),
                Err(ParseLsnError(bad.to_owned())),
                "{bad:?} should not parse"
            );
        }
    }
}
