//! The few PostgreSQL type OIDs the outbox mapping cares about, and SQL quoting for the
//! fixes suggested in error messages.

pub const BOOL: u32 = 16;
pub const BYTEA: u32 = 17;
pub const NAME: u32 = 19;
pub const INT8: u32 = 20;
pub const INT2: u32 = 21;
pub const INT4: u32 = 23;
pub const TEXT: u32 = 25;
pub const OID: u32 = 26;
pub const JSON: u32 = 114;
pub const XML: u32 = 142;
pub const FLOAT4: u32 = 700;
pub const FLOAT8: u32 = 701;
pub const BPCHAR: u32 = 1042;
pub const VARCHAR: u32 = 1043;
pub const DATE: u32 = 1082;
pub const TIMESTAMP: u32 = 1114;
pub const TIMESTAMPTZ: u32 = 1184;
pub const NUMERIC: u32 = 1700;
pub const UUID: u32 = 2950;
pub const JSONB: u32 = 3802;

/// `text`, `varchar`, `char(n)`, `name`: types whose text and binary forms are both the
/// characters themselves.
pub fn is_textual(oid: u32) -> bool {
    matches!(oid, TEXT | VARCHAR | BPCHAR | NAME)
}

/// A readable name for an OID, for error messages.
pub fn type_name(oid: u32) -> String {
    let known = match oid {
        BOOL => "boolean",
        BYTEA => "bytea",
        NAME => "name",
        INT8 => "bigint",
        INT2 => "smallint",
        INT4 => "integer",
        TEXT => "text",
        OID => "oid",
        JSON => "json",
        XML => "xml",
        FLOAT4 => "real",
        FLOAT8 => "double precision",
        BPCHAR => "character",
        VARCHAR => "character varying",
        DATE => "date",
        TIMESTAMP => "timestamp without time zone",
        TIMESTAMPTZ => "timestamp with time zone",
        NUMERIC => "numeric",
        UUID => "uuid",
        JSONB => "jsonb",
        _ => return format!("type OID {oid} (a domain, enum or extension type?)"),
    };
    known.to_owned()
}

/// Quote an identifier for SQL unless it is a plain lower-case name.
pub fn quote_ident(ident: &str) -> String {
    let plain = ident
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && ident
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        ident.to_owned()
    } else {
        format!("\"{}\"", ident.replace('"', "\"\""))
    }
}

/// `schema.table`, quoted as needed.
pub fn qualified(schema: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("outbox"), "outbox");
        assert_eq!(quote_ident("_x1"), "_x1");
        assert_eq!(quote_ident("Outbox"), "\"Outbox\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_ident("1a"), "\"1a\"");
        assert_eq!(quote_ident(""), "\"\"");
        assert_eq!(qualified("public", "My Table"), "public.\"My Table\"");
    }

    #[test]
    fn names() {
        assert_eq!(type_name(INT4), "integer");
        assert_eq!(type_name(JSONB), "jsonb");
        assert!(type_name(99999).contains("99999"));
        assert!(is_textual(VARCHAR) && is_textual(BPCHAR) && !is_textual(UUID));
    }
}
