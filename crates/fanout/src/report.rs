//! What one publish did, counted for metrics.

use super::Delivery;

/// Counts of what a publish did, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PublishReport {
    pub delivered: usize,
    pub conflated: usize,
    pub dropped: usize,
    pub disconnected: usize,
    /// The source position was behind the channel's (another stream fed it
    /// further): published at the channel's next position instead.
    pub rebased: bool,
    /// This publish was the channel's first rebase: worth one log line.
    pub first_rebase: bool,
    /// The tenant's histories were full: the message was not kept (and its
    /// channel's history was cleared).
    pub not_kept: bool,
}

impl PublishReport {
    pub(super) fn add(&mut self, d: Delivery) {
        match d {
            Delivery::Queued => self.delivered += 1,
            Delivery::Conflated(n) => {
                self.delivered += 1;
                self.conflated += n;
            }
            Delivery::DroppedOldest(n) => {
                self.delivered += 1;
                self.dropped += n;
            }
            Delivery::Disconnected => self.disconnected += 1,
            Delivery::Closed => {}
        }
    }
}
