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
