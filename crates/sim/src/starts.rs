//! What a relay process starts each session knowing, by the relay's own rules
//! (`outbox_core::LifeCore`), from the progress record as the simulated Kafka holds it.

use outbox_core::{Known, LifeCore, RecordRead, Refusal, SlotView};

use crate::{Sim, Violation};

impl Sim {
    /// What the relay process of cluster `c` starts its next session knowing, by the
    /// relay's rules: its own claim, or the record's, read now and then with a fault (not
    /// one outboxd writes, or Kafka not answering in time). `None`: the start was refused
    /// and the operator did what the error says.
    pub(crate) fn known(&mut self, c: usize) -> Result<Option<Known<()>>, Violation> {
        let cl = &self.clusters[c];
        // Copies of one cluster share its system identifier; each relay has its server.
        let server = (format!("cluster {c}"), 5432);
        let life = &mut self.carry[c];
        let carried = life.carries_claim();
        let connected = life.connected::<String>("sim", cl.timeline, server);
        if carried && !life.carries_claim() {
            // The claim given up (a new timeline): the record it writes may move back.
            self.epochs[c] += 1;
        }
        let read = if !life.needs_record() {
            RecordRead::NotKept
        } else if self.rng.chance(15) {
            RecordRead::Unreadable
        } else if self.rng.chance(15) {
            RecordRead::NotRead
        } else {
            let ours = self.kafka.records.get(&cl.key).and_then(|r| r.last());
            RecordRead::Read(SlotView {
                ours: ours.map(|r| (r.claim.clone(), r.lineage)),
                last_look: None,
                other_cluster: None,
                backfill_unfinished: None,
                writers_alternate: false,
            })
        };
        let refusal = match connected.and_then(|_| life.known(read)) {
            Ok(known) => return Ok(Some(known)),
            Err(r) => r,
        };
        match refusal {
            // A copy that shares the record's key with a server promoted since it was
            // copied: the operator names the copy apart, as the docs advise for copies.
            Refusal::TimelineWentBack { .. } if c > 0 && cl.key == self.clusters[0].key => {
                if self.trace {
                    eprintln!("  cluster {c} refused ({refusal:?}): named apart");
                }
                self.clusters[c].key = 2;
                self.carry[c] = LifeCore::new(false);
                self.processes[c] += 1;
                Ok(None)
            }
            r => Err(Violation(format!(
                "the relay on cluster {c} refused to start: {r:?}"
            ))),
        }
    }
}
