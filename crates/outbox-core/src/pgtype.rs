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

/// PostgreSQL's keywords that are not unreserved (`pg_get_keywords()` with a `catcode`
/// other than `U`, PostgreSQL 18: a superset of 14's), sorted. As a bare name each is a
/// syntax error or means something else somewhere (`INSERT INTO t (order)`,
/// `GRANT ... TO user`), so the server's own `quote_ident` quotes them, and so does ours.
#[rustfmt::skip]
const KEYWORDS: &[&str] = &[
    "all", "analyse", "analyze", "and", "any", "array", "as", "asc", "asymmetric",
    "authorization", "between", "bigint", "binary", "bit", "boolean", "both", "case",
    "cast", "char", "character", "check", "coalesce", "collate", "collation", "column",
    "concurrently", "constraint", "create", "cross", "current_catalog", "current_date",
    "current_role", "current_schema", "current_time", "current_timestamp", "current_user",
    "dec", "decimal", "default", "deferrable", "desc", "distinct", "do", "else", "end",
    "except", "exists", "extract", "false", "fetch", "float", "for", "foreign", "freeze",
    "from", "full", "grant", "greatest", "group", "grouping", "having", "ilike", "in",
    "initially", "inner", "inout", "int", "integer", "intersect", "interval", "into", "is",
    "isnull", "join", "json", "json_array", "json_arrayagg", "json_exists", "json_object",
    "json_objectagg", "json_query", "json_scalar", "json_serialize", "json_table",
    "json_value", "lateral", "leading", "least", "left", "like", "limit", "localtime",
    "localtimestamp", "merge_action", "national", "natural", "nchar", "none", "normalize",
    "not", "notnull", "null", "nullif", "numeric", "offset", "on", "only", "or", "order",
    "out", "outer", "overlaps", "overlay", "placing", "position", "precision", "primary",
    "real", "references", "returning", "right", "row", "select", "session_user", "setof",
    "similar", "smallint", "some", "substring", "symmetric", "system_user", "table",
    "tablesample", "then", "time", "timestamp", "to", "trailing", "treat", "trim", "true",
    "union", "unique", "user", "using", "values", "varchar", "variadic", "verbose", "when",
    "where", "window", "with", "xmlattributes", "xmlconcat", "xmlelement", "xmlexists",
    "xmlforest", "xmlnamespaces", "xmlparse", "xmlpi", "xmlroot", "xmlserialize",
    "xmltable",
];

/// Quote an identifier for SQL unless it is a plain lower-case name that is no keyword,
/// as the server's `quote_ident` does: a name from the configuration goes into the SQL
/// outboxd runs and into the remedies it prints, which must both work as written.
pub fn quote_ident(ident: &str) -> String {
    let plain = ident
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && ident
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && KEYWORDS.binary_search(&ident).is_err();
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

/// A relation as outboxd's settings name it (`OUTBOXD_FORMER_PARTITIONS`): each part as
/// stored in the catalog, bare, or in double quotes (`"` doubled) when it holds a
/// character the list uses (`.`, `,`, `"`) or starts or ends with a space. The relay's
/// errors print names this way and [`parse_setting_names`] reads them back, so any name
/// the server can hold can be set as printed.
pub fn setting_name(schema: &str, table: &str) -> String {
    let part = |p: &str| {
        let bare = !p.is_empty() && p.trim() == p && !p.contains(['.', ',', '"']);
        match bare {
            true => p.to_owned(),
            false => format!("\"{}\"", p.replace('"', "\"\"")),
        }
    };
    format!("{}.{}", part(schema), part(table))
}

/// [`setting_name`] of a relation as pgoutput names it (an empty namespace is
/// `pg_catalog`'s).
pub fn relation_setting_name(namespace: &str, name: &str) -> String {
    match namespace.is_empty() {
        true => setting_name("pg_catalog", name),
        false => setting_name(namespace, name),
    }
}

/// Reads a comma-separated list of [`setting_name`]s (a bare `table` is in `public`) into
/// their canonical [`setting_name`] form. `None` for a malformed list: an unclosed quote,
/// an empty or over-long part, more than two parts, text after a closing quote.
pub fn parse_setting_names(raw: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut parts: Vec<String> = Vec::new();
    let mut chars = raw.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ').is_some() {}
        let part = if chars.next_if_eq(&'"').is_some() {
            let mut p = String::new();
            loop {
                match chars.next()? {
                    '"' if chars.next_if_eq(&'"').is_some() => p.push('"'),
                    '"' => break,
                    c => p.push(c),
                }
            }
            while chars.next_if(|c| *c == ' ').is_some() {}
            p
        } else {
            let mut p = String::new();
            while let Some(c) = chars.next_if(|c| !matches!(c, '.' | ',' | '"')) {
                p.push(c);
            }
            p.trim_end().to_owned()
        };
        parts.push(part);
        match chars.next() {
            Some('.') => continue,
            end @ (None | Some(',')) => {
                match parts.as_slice() {
                    [name] if name.is_empty() => {}
                    [name] => out.push(("public".to_owned(), name.clone())),
                    [schema, name] => out.push((schema.clone(), name.clone())),
                    _ => return None,
                }
                parts.clear();
                if end.is_none() {
                    break;
                }
            }
            Some(_) => return None,
        }
    }
    let fits = |p: &str| !p.is_empty() && p.len() <= 63;
    match out.iter().all(|(s, t)| fits(s) && fits(t)) {
        true => Some(out.iter().map(|(s, t)| setting_name(s, t)).collect()),
        false => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_names_read_back_as_printed() {
        for (schema, table) in [
            ("public", "outbox_2025"),
            ("Sales", "Outbox 2025"),
            ("public", "outbox.2025"),
            ("a\"b", "x,y"),
            ("public", " padded "),
            ("order", "user"),
        ] {
            let printed = setting_name(schema, table);
            let again = format!("{printed}, public.other");
            assert_eq!(
                parse_setting_names(&again),
                Some(vec![printed.clone(), "public.other".to_owned()]),
                "{printed}"
            );
        }
        assert_eq!(
            setting_name("public", "outbox.2025"),
            "public.\"outbox.2025\""
        );
        assert_eq!(
            parse_setting_names(" public.outbox_2025, outbox_2026_h0 ,"),
            Some(vec![
                "public.outbox_2025".into(),
                "public.outbox_2026_h0".into()
            ])
        );
        assert_eq!(parse_setting_names(""), Some(vec![]));
        for bad in ["\"open", "a.b.c", "a.\"b\"c", "a.", ".b", "\"\".b", "a\"b"] {
            assert_eq!(parse_setting_names(bad), None, "{bad}");
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("outbox"), "outbox");
        assert_eq!(quote_ident("_x1"), "_x1");
        assert_eq!(quote_ident("Outbox"), "\"Outbox\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_ident("1a"), "\"1a\"");
        assert_eq!(quote_ident("order"), "\"order\"");
        assert_eq!(quote_ident("user"), "\"user\"");
        assert_eq!(quote_ident("offset"), "\"offset\"");
        // Unreserved keywords stay bare, as the server leaves them.
        assert_eq!(quote_ident("type"), "type");
        assert_eq!(quote_ident("key"), "key");
        assert!(
            KEYWORDS.windows(2).all(|w| w[0] < w[1]),
            "sorted, for the search"
        );
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
