//! Admission's accounting: the process's sessions and the sockets that are
//! not sessions yet ("doors"), each counted from accept to close; a
//! tenant's cap (its `max_connections`, else its share of the process) and
//! its sessions per client address; the age lineup of doors that lets the
//! oldest make way at the bound.

use super::Tenant;
use std::collections::HashMap;
use std::net::IpAddr;

/// Counts per client address, each under a bound, so one address cannot
/// take what every client shares (doors, TLS handshakes, a public tenant's
/// sessions). An address whose count falls to 0 is forgotten.
#[derive(Default)]
pub struct PerAddress(parking_lot::Mutex<HashMap<IpAddr, u32>>);

impl PerAddress {
    /// Counts one more for `ip`; false (nothing counted) when it already
    /// has `max`.
    pub fn claim(&self, ip: IpAddr, max: usize) -> bool {
        let mut map = self.0.lock();
        let n = map.entry(ip).or_insert(0);
        if *n as usize >= max {
            return false;
        }
        *n += 1;
        true
    }

    /// Gives back one claimed for `ip`.
    pub fn release(&self, ip: IpAddr) {
        let mut map = self.0.lock();
        if let Some(n) = map.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&ip);
            }
        }
    }
}
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Global connection accounting: the process-wide cap of sessions derived
/// from the open-files limit (or set lower by the operator), and the
/// sockets that are not sessions — before their handshake, or ordinary HTTP
/// connections ("doors") — each counted from accept until it becomes a
/// session or closes. Invariant: sessions + doors never pass `sockets_max`,
/// so the descriptors the sources, the registry and the process need are
/// never taken by clients; one client address holds at most
/// `per_address_max` doors (a socket past it is closed at accept).
pub struct Capacity {
    max: usize,
    current: AtomicUsize,
    doors: AtomicUsize,
    doors_max: usize,
    sockets_max: usize,
    doors_gauge: metrics::Gauge,
    /// Rung when a door closes: the accept loop waits on it while full.
    door_freed: tokio::sync::Notify,
    /// Doors per client address, and how many one address may hold (0: no
    /// bound): one address cannot take every door.
    per_address: PerAddress,
    per_address_max: usize,
    /// Every door by age, each with the signal that closes it: at the bound
    /// the oldest makes way for a new connection ([`Capacity::evict_oldest`]).
    lineup: parking_lot::Mutex<std::collections::BTreeMap<u64, Arc<tokio::sync::Notify>>>,
    next_door: std::sync::atomic::AtomicU64,
}

/// A socket that is not (yet) a session; releasing is dropping.
pub struct DoorSlot {
    capacity: Arc<Capacity>,
    /// The client address it is counted under, once known.
    address: Option<std::net::IpAddr>,
    /// Its place in the lineup, and the signal that it is to close.
    seq: u64,
    evict: Arc<tokio::sync::Notify>,
}

impl DoorSlot {
    /// Counts the door under its client's address; false when that address
    /// already holds as many as it may (the socket is to be closed at once).
    pub fn claim(&mut self, address: std::net::IpAddr) -> bool {
        let max = self.capacity.per_address_max;
        if max == 0 {
            return true;
        }
        if !self.capacity.per_address.claim(address, max) {
            return false;
        }
        self.address = Some(address);
        true
    }

    /// Resolves when this socket is to close to make way for a new one.
    pub fn evicted(&self) -> tokio::sync::futures::Notified<'_> {
        self.evict.notified()
    }
}

impl Drop for DoorSlot {
    fn drop(&mut self) {
        if let Some(a) = self.address {
            self.capacity.per_address.release(a);
        }
        self.capacity.lineup.lock().remove(&self.seq);
        self.capacity.doors.fetch_sub(1, Ordering::AcqRel);
        self.capacity.doors_gauge.decrement(1.0);
        self.capacity.door_freed.notify_one();
    }
}

/// Why a connection was refused before it became a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    GlobalConnections,
    TenantConnections,
    /// The tenant holds its share of the process (no `max_connections`).
    TenantShare,
    /// The tenant holds as many sessions from this client address as it may.
    AddressConnections,
    MemoryBudget,
    ShuttingDown,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::GlobalConnections => "global_connections",
            Refusal::TenantConnections => "tenant_connections",
            Refusal::TenantShare => "tenant_share",
            Refusal::AddressConnections => "address_connections",
            Refusal::MemoryBudget => "memory_budget",
            Refusal::ShuttingDown => "shutting_down",
        }
    }
}

impl Capacity {
    /// `max` sessions; doors unbounded but by the sockets (`max` + 50).
    pub fn new(max: usize) -> Arc<Capacity> {
        Capacity::with_doors(max, usize::MAX, max.saturating_add(50))
    }

    /// `max` sessions, at most `doors_max` other sockets, and at most
    /// `sockets_max` sockets of both kinds together.
    pub fn with_doors(max: usize, doors_max: usize, sockets_max: usize) -> Arc<Capacity> {
        Capacity::with_limits(max, doors_max, sockets_max, 0)
    }

    /// As [`with_doors`](Self::with_doors), and at most `per_address_max`
    /// doors for one client address (0: no bound).
    pub fn with_limits(
        max: usize,
        doors_max: usize,
        sockets_max: usize,
        per_address_max: usize,
    ) -> Arc<Capacity> {
        Arc::new(Capacity {
            max,
            current: AtomicUsize::new(0),
            doors: AtomicUsize::new(0),
            doors_max,
            sockets_max,
            doors_gauge: metrics::gauge!("herald_pending_connections"),
            door_freed: tokio::sync::Notify::new(),
            per_address: PerAddress::default(),
            per_address_max,
            lineup: parking_lot::Mutex::new(std::collections::BTreeMap::new()),
            next_door: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Resolves when a door may have freed (or after `poll`, for sessions
    /// that closed, which do not ring).
    pub async fn door_freed(&self, poll: std::time::Duration) {
        let _ = tokio::time::timeout(poll, self.door_freed.notified()).await;
    }

    /// Counts a socket about to be accepted, or says to wait: too many
    /// sockets are not sessions yet (slowloris), or sessions and these
    /// together would take descriptors the process needs.
    pub fn enter(self: &Arc<Self>) -> Option<DoorSlot> {
        let (doors_max, sockets_max) = (self.doors_max, self.sockets_max);
        let sessions = self.current.load(Ordering::Acquire);
        self.doors
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                (d < doors_max && sessions + d < sockets_max).then_some(d + 1)
            })
            .ok()?;
        self.doors_gauge.increment(1.0);
        let seq = self.next_door.fetch_add(1, Ordering::Relaxed);
        let evict = Arc::new(tokio::sync::Notify::new());
        self.lineup.lock().insert(seq, evict.clone());
        Some(DoorSlot {
            capacity: self.clone(),
            address: None,
            seq,
            evict,
        })
    }

    /// Tells the oldest door to close (it goes when its task sees the
    /// signal: at once while it waits for a head or idles between requests,
    /// after the response it is writing otherwise). False when there is none.
    pub fn evict_oldest(&self) -> bool {
        let oldest = self.lineup.lock().pop_first();
        match oldest {
            Some((_, evict)) => {
                evict.notify_one();
                true
            }
            None => false,
        }
    }

    /// Sockets counted as doors now.
    pub fn doors(&self) -> usize {
        self.doors.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// Takes a global and a tenant slot, or neither.
    pub fn acquire(self: &Arc<Self>, tenant: &Arc<Tenant>) -> Result<ConnectionSlot, Refusal> {
        self.acquire_from(tenant, None)
    }

    /// A session slot for a client at `address`: within the process's
    /// capacity, the tenant's cap (its `max_connections`, else its share of
    /// the capacity) and its bound per client address.
    pub fn acquire_from(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        address: Option<std::net::IpAddr>,
    ) -> Result<ConnectionSlot, Refusal> {
        let max = self.max;
        if self
            .current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Refusal::GlobalConnections);
        }
        let settings = tenant.settings();
        let limits = &settings.limits;
        let cap = limits.session_cap(settings.access, max);
        if !tenant.try_acquire(Some(cap)) {
            self.current.fetch_sub(1, Ordering::AcqRel);
            return Err(if limits.max_connections.is_some() {
                Refusal::TenantConnections
            } else {
                Refusal::TenantShare
            });
        }
        // Counted under the client's address before anything shows it, so a
        // refusal here never appears in the tenant's connection gauge.
        let address = match (address, limits.per_address_cap(settings.access)) {
            (Some(ip), Some(per)) => {
                if !tenant.per_address.claim(ip, per) {
                    tenant.connections.fetch_sub(1, Ordering::AcqRel);
                    self.current.fetch_sub(1, Ordering::AcqRel);
                    return Err(Refusal::AddressConnections);
                }
                Some(ip)
            }
            _ => None,
        };
        tenant.metrics.connections.increment(1.0);
        Ok(ConnectionSlot {
            capacity: self.clone(),
            tenant: tenant.clone(),
            address,
        })
    }
}

/// Held by a session for its whole life; releasing is dropping.
pub struct ConnectionSlot {
    capacity: Arc<Capacity>,
    pub tenant: Arc<Tenant>,
    /// The client address it counts under (public tenants).
    address: Option<std::net::IpAddr>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.capacity.current.fetch_sub(1, Ordering::AcqRel);
        self.tenant.connections.fetch_sub(1, Ordering::AcqRel);
        if let Some(ip) = self.address {
            self.tenant.per_address.release(ip);
        }
        self.tenant.metrics.connections.decrement(1.0);
    }
}
