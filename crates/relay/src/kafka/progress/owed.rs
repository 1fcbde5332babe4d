//! Rows only the operator can bring to Kafka: committed while a slot was lost, or hidden
//! from the slot by a publication change `init` was told to accept. The slot's confirmed
//! position proves nothing about them, so `outboxd prune` must not delete them until the
//! operator says they were re-published (`outboxd init --republish-done`).

use super::record::{rfc3339_of_ms, unix_ms_now};

/// What `init` recorded when it created a slot over a lost one, or accepted a publication
/// change: under the slot's own key for it ([`super::SlotIdentity::republish_key`]), so
/// that no write of the slot's record (every few seconds while streaming) can drop it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepublishOwed {
    /// Why the slot cannot have relayed them, as `init` said it.
    pub why: String,
    /// Which rows: "rows committed since …", as the lost slot's error named them.
    pub rows: String,
    pub recorded_at_unix_ms: u64,
    /// Set by `outboxd init --republish-done`.
    pub done: bool,
}

impl RepublishOwed {
    pub fn new(why: String, rows: String) -> Self {
        RepublishOwed {
            why,
            rows,
            recorded_at_unix_ms: unix_ms_now(),
            done: false,
        }
    }

    /// This one, recorded while `earlier` is still owed: both, since the rows of the
    /// earlier one are not back in Kafka either (a slot lost again before its rows were
    /// re-published would otherwise name only the later, shorter span).
    pub fn after(self, earlier: Option<&RepublishOwed>) -> Self {
        match earlier.filter(|e| !e.done) {
            None => self,
            Some(e) => RepublishOwed {
                why: format!(
                    "{}; before that, {} ({})",
                    self.why,
                    e.why,
                    e.recorded_at_text()
                ),
                rows: format!("{}, and {}", e.rows, self.rows),
                ..self
            },
        }
    }

    /// When `init` recorded it, as RFC 3339 UTC text.
    pub fn recorded_at_text(&self) -> String {
        rfc3339_of_ms(self.recorded_at_unix_ms)
    }

    pub(super) fn to_json(&self) -> String {
        serde_json::json!({
            "why": self.why,
            "rows": self.rows,
            "recorded_at_unix_ms": self.recorded_at_unix_ms,
            "done": self.done,
        })
        .to_string()
    }

    /// Never fails: a value outboxd cannot read is an owed re-publish it cannot describe
    /// (prune then deletes nothing until `--republish-done` writes a readable one).
    pub(super) fn from_json(bytes: &[u8]) -> Self {
        let parsed = serde_json::from_slice::<serde_json::Value>(bytes);
        let v = match parsed {
            Ok(v) if v.is_object() => v,
            _ => {
                return RepublishOwed {
                    why: "the state recorded for it is not one outboxd writes".into(),
                    rows: "rows that may be missing".into(),
                    recorded_at_unix_ms: 0,
                    done: false,
                }
            }
        };
        let text = |name: &str| {
            v.get(name)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        RepublishOwed {
            why: text("why").unwrap_or_else(|| "a re-publish was recorded as owed".into()),
            rows: text("rows").unwrap_or_else(|| "rows that may be missing".into()),
            recorded_at_unix_ms: v
                .get("recorded_at_unix_ms")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0),
            // In doubt, owed: prune waits for the operator's word.
            done: v
                .get("done")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owed_republish_reads_back_and_anything_else_stays_owed() {
        let mut owed = RepublishOwed::new("slot recreated".into(), "rows since then".into());
        assert_eq!(RepublishOwed::from_json(owed.to_json().as_bytes()), owed);
        owed.done = true;
        assert_eq!(RepublishOwed::from_json(owed.to_json().as_bytes()), owed);
        let later = RepublishOwed::new("lost again".into(), "rows since later".into());
        let open = RepublishOwed {
            done: false,
            ..owed.clone()
        };
        let both = later.clone().after(Some(&open));
        assert_eq!(both.rows, "rows since then, and rows since later");
        assert_eq!(
            later.clone().after(Some(&owed)),
            later,
            "a done one is not owed"
        );
        for junk in [&b"not json"[..], b"[]", b"{}", b"{\"done\": \"yes\"}"] {
            assert!(!RepublishOwed::from_json(junk).done, "{junk:?}");
        }
    }
}
