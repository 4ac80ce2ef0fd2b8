//! The live sessions of a tenant, by weak handle: closed together (deletion,
//! access or admission changes, shutdown) and listed for the operator.

use crate::session::{QueueClose, SessionHandle, SessionInfo};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// The live sessions of a tenant.
#[derive(Default)]
pub struct SessionRegistry {
    inner: Mutex<(slab::Slab<Weak<SessionHandle>>, Option<QueueClose>)>,
    /// Sessions whose writer holds off (a reader falling behind): woken
    /// together by the node's pacer ([`SessionRegistry::release_held`]).
    held: Mutex<Vec<Arc<SessionHandle>>>,
}

impl SessionRegistry {
    /// Registers a session; one registered after a final close is closed at once.
    pub fn register(&self, h: &Arc<SessionHandle>) -> usize {
        let mut g = self.inner.lock();
        if let Some(reason) = g.1 {
            h.close_with(reason);
        }
        g.0.insert(Arc::downgrade(h))
    }

    /// The writer of `h` holds off until the next [`release_held`]; it has
    /// parked its handle, so pushes meanwhile do not wake it.
    ///
    /// [`release_held`]: SessionRegistry::release_held
    pub fn hold(&self, h: &Arc<SessionHandle>) {
        self.held.lock().push(h.clone());
    }

    /// Wakes every held session (unparked: its writer takes the queue).
    /// Returns how many there were.
    pub fn release_held(&self) -> usize {
        let held = std::mem::take(&mut *self.held.lock());
        for h in &held {
            h.release();
        }
        held.len()
    }

    /// One part of the node's heartbeat: [`SessionHandle::beat`] for each
    /// live session whose key is `part` modulo `parts`. Beating a heartbeat's
    /// sessions in parts spreads its pings over the heartbeat instead of
    /// queueing them all in one instant. Returns how many were beaten.
    pub fn beat(&self, part: usize, parts: usize, now_ms: u64, silent_ms: u64) -> usize {
        let handles: Vec<Arc<SessionHandle>> = {
            let g = self.inner.lock();
            g.0.iter()
                .filter(|(key, _)| key % parts == part)
                .filter_map(|(_, w)| w.upgrade())
                .collect()
        };
        for h in &handles {
            h.beat(now_ms, silent_ms);
        }
        handles.len()
    }

    pub fn deregister(&self, key: usize) {
        self.inner.lock().0.try_remove(key);
    }

    /// Closes every registered session with `reason`; `terminal` also closes
    /// any session that registers later (tenant deleted, server stopping).
    pub fn close_all(&self, reason: QueueClose, terminal: bool) {
        let handles: Vec<Arc<SessionHandle>> = {
            let mut g = self.inner.lock();
            if terminal {
                g.1 = Some(reason);
            }
            g.0.iter().filter_map(|(_, w)| w.upgrade()).collect()
        };
        for h in handles {
            h.close_with(reason);
        }
    }

    /// Closes the live sessions whose [`SessionInfo`] matches `which`.
    pub fn close_where(&self, reason: QueueClose, which: impl Fn(&SessionInfo) -> bool) {
        for h in self.handles() {
            if which(h.info()) {
                h.close_with(reason);
            }
        }
    }

    /// The live sessions now.
    pub fn handles(&self) -> Vec<Arc<SessionHandle>> {
        self.inner
            .lock()
            .0
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .collect()
    }

    /// Bytes queued for every live session together.
    pub fn queued_bytes(&self) -> usize {
        self.handles().iter().map(|h| h.queued_bytes()).sum()
    }

    /// Queues a control frame for every live session (source status).
    pub fn broadcast(&self, op: &str, json: &str) {
        for h in self.handles() {
            h.deliver_ctrl(op, json);
        }
    }

    pub fn len(&self) -> usize {
        self.inner.lock().0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::{SlowConsumer, Wire};

    /// A heartbeat in parts beats every live session exactly once.
    #[test]
    fn a_heartbeat_in_parts_beats_each_session_once() {
        let r = SessionRegistry::default();
        let handles: Vec<_> = (0..37)
            .map(|_| SessionHandle::new(Wire::Sse, 1 << 16, SlowConsumer::DropOldest, None))
            .collect();
        for h in &handles {
            r.register(h);
        }
        let gone = r.register(&SessionHandle::new(
            Wire::Sse,
            64,
            SlowConsumer::DropOldest,
            None,
        ));
        let beaten: usize = (0..8).map(|part| r.beat(part, 8, 0, 1)).sum();
        assert_eq!(beaten, 37, "the dropped session is not beaten");
        for h in &handles {
            assert_eq!(h.take_queued().len(), 1, "one comment each");
        }
        r.deregister(gone);
    }
}
