//! A batch through `transform`: calls of at most [`MAX_RECORDS_PER_CALL`]
//! records (or the version's current part size, halved on a timeout and
//! grown back after a run of calls that fit), each output checked against
//! the contract.

use super::{ActivePlugin, Bound, GROW_AFTER, MAX_RECORDS_PER_CALL};
use crate::batch::{self, SourceRecord, Transformed};
use crate::{Encoding, PluginError};
use std::sync::atomic::Ordering;

impl ActivePlugin {
    /// The batch in calls of at most [`MAX_RECORDS_PER_CALL`] records (or
    /// the version's current part size); the output is checked against the
    /// contract. An output of broken structure fails the batch; records
    /// whose outputs break it otherwise come back refused, beside the rest.
    /// A part that runs past the deadline is split in halves and run again
    /// (hooks are pure and nothing was published), down to one record; a
    /// record that alone runs past it is refused (`timeout`) unless it is
    /// the whole batch, which then fails as a timeout. So a batch too big
    /// for the deadline is delivered, not dead-lettered whole.
    pub fn transform(
        &self,
        records: &[SourceRecord<'_>],
        max_payload: usize,
    ) -> Result<Transformed, PluginError> {
        let mut part = self
            .part
            .load(Ordering::Relaxed)
            .clamp(1, MAX_RECORDS_PER_CALL);
        if records.len() <= part {
            match self.transform_call(records, max_payload) {
                Err(PluginError::Timeout(..)) if records.len() > 1 => {}
                r => {
                    self.part_fit(part, r.is_ok());
                    return r;
                }
            }
            part = records.len() / 2;
            self.part_timed_out(part);
        }
        let mut all = Transformed::default();
        let mut start = 0;
        while start < records.len() {
            let end = (start + part).min(records.len());
            match self.transform_call(&records[start..end], max_payload) {
                Ok(t) => {
                    self.part_fit(part, true);
                    all.append(t, start as u32)
                        .map_err(|e| PluginError::BadOutput(e.to_string()))?;
                    start = end;
                }
                Err(PluginError::Timeout(..)) if end - start > 1 => {
                    part = (end - start) / 2;
                    self.part_timed_out(part);
                }
                Err(e @ PluginError::Timeout(..)) => {
                    all.refuse(start as u32, "timeout", e.to_string());
                    start = end;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(all)
    }

    fn part_timed_out(&self, part: usize) {
        let part = part.max(1);
        self.part_streak.store(0, Ordering::Relaxed);
        if self.part.swap(part, Ordering::Relaxed) > part {
            tracing::info!(tenant = %self.tenant, version = self.version, records = part, "a transform call ran past the deadline: batches run in parts of this many records");
        }
    }

    fn part_fit(&self, part: usize, ok: bool) {
        let now = self.part.load(Ordering::Relaxed);
        if !ok || part < now || now >= MAX_RECORDS_PER_CALL {
            return;
        }
        if self.part_streak.fetch_add(1, Ordering::Relaxed) + 1 >= GROW_AFTER {
            self.part_streak.store(0, Ordering::Relaxed);
            let _ = self.part.compare_exchange(
                now,
                (now * 2).min(MAX_RECORDS_PER_CALL),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// One `transform` call for `records`, checked.
    fn transform_call(
        &self,
        records: &[SourceRecord<'_>],
        max_payload: usize,
    ) -> Result<Transformed, PluginError> {
        let (data, meta) = match self.info.encoding {
            Encoding::Flat => {
                let (data, meta) = batch::encode_records(records);
                self.call(|s, p| match p {
                    Bound::V0_2(p) => {
                        let b = crate::v2::herald::plugin::types::RecordBatch { data, meta };
                        let o = p.herald_plugin_guest().call_transform_flat(s, &b)?;
                        Ok((o.data, o.meta))
                    }
                    Bound::V0_1(p) => {
                        let b = crate::v1::herald::plugin::types::RecordBatch { data, meta };
                        let o = p.herald_plugin_guest().call_transform(s, &b)?;
                        Ok((o.data, o.meta))
                    }
                })?
            }
            Encoding::Typed => {
                let typed = batch::typed_records(records);
                let out = self.call(|s, p| match p {
                    Bound::V0_2(p) => p.herald_plugin_guest().call_transform(s, &typed),
                    Bound::V0_1(_) => unreachable!("0.1.0 has only the flat transform"),
                })?;
                batch::encode_outgoing(&out)
            }
        };
        batch::decode_outgoing(data, &meta, records.len(), max_payload)
            .map_err(|e| PluginError::BadOutput(e.to_string()))
    }
}
