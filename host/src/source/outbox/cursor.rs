//! The outbox reader's cursor: where a node is in one outbox table, and how
//! it is stored in the registry.
//!
//! Invariants: a cursor `(xid, id)` means every final row up to it in
//! `(xid, id)` order was delivered; `read`, when known, is at least the
//! highest id delivered through it (ids and commit order differ, so it may
//! be above `id`: the node's read horizon, ARCHITECTURE.md "Positions");
//! `encode` and `parse` round-trip; a bare id (what older Herald versions
//! stored) is recognised, never mistaken for a current cursor.

/// Where this node is in the outbox: every final row up to `(xid, id)` in
/// `(xid, id)` order has been delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cursor {
    pub(super) xid: u64,
    pub(super) id: i64,
    pub(super) legacy: Option<Legacy>,
    /// The highest id delivered through this cursor; `None` when it was
    /// stored by a Herald that did not keep it.
    pub(super) read: Option<i64>,
    /// A cursor stored behind rows a conflation window held: the last row
    /// delivered (`xid`, `id`). Rows up to it that come again are re-reads;
    /// rows after it are new to the node (`Hub::read_after`).
    pub(super) upto: Option<(u64, i64)>,
}

/// A cursor taken over from an older Herald, which stored a bare id: rows of
/// transactions that began before the take-over (xid below `until_xid`) were
/// delivered up to `after_id` in id order; later transactions are all new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Legacy {
    pub(super) after_id: i64,
    pub(super) until_xid: u64,
}

/// A cursor as stored in the registry.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stored {
    Current(Cursor),
    /// What an older Herald stored: the last id it delivered.
    BareId(i64),
}

impl Cursor {
    /// Before any row (real xids start at 3).
    pub(super) const START: Cursor = Cursor {
        xid: 0,
        id: 0,
        legacy: None,
        read: Some(0),
        upto: None,
    };

    /// `xid:id`, `xid:id:read`, `xid:id:after_id:until_xid` (taking over),
    /// the same with `:read`, or a bare id (an older Herald); anything else
    /// is no cursor.
    pub(super) fn parse(s: &str) -> Option<Stored> {
        if let Ok(id) = s.parse() {
            return Some(Stored::BareId(id));
        }
        // `…/xid:id`: the last row delivered, past a held-back cursor.
        let (s, upto) = match s.split_once('/') {
            Some((s, u)) => {
                let (x, i) = u.split_once(':')?;
                (s, Some((x.parse().ok()?, i.parse().ok()?)))
            }
            None => (s, None),
        };
        let p: Vec<&str> = s.split(':').collect();
        let (xid, id) = (p.first()?.parse().ok()?, p.get(1)?.parse().ok()?);
        let legacy = || -> Option<Legacy> {
            Some(Legacy {
                after_id: p[2].parse().ok()?,
                until_xid: p[3].parse().ok()?,
            })
        };
        let (legacy, read) = match p.len() {
            2 => (None, None),
            3 => (None, Some(p[2].parse().ok()?)),
            4 => (Some(legacy()?), None),
            5 => (Some(legacy()?), Some(p[4].parse().ok()?)),
            _ => return None,
        };
        Some(Stored::Current(Cursor {
            xid,
            id,
            legacy,
            read,
            upto,
        }))
    }

    pub(super) fn encode(&self) -> String {
        let read = self.read.map(|r| format!(":{r}")).unwrap_or_default();
        let upto = self
            .upto
            .map(|(x, i)| format!("/{x}:{i}"))
            .unwrap_or_default();
        match self.legacy {
            None => format!("{}{read}{upto}", self.shown()),
            Some(l) => format!(
                "{}:{}:{}:{}{read}{upto}",
                self.xid, self.id, l.after_id, l.until_xid
            ),
        }
    }

    /// The last row delivered before this cursor was stored (its order).
    pub(super) fn last_read(&self) -> (u64, u64) {
        let (x, i) = self.upto.unwrap_or((self.xid, self.id));
        (x, i.max(0) as u64)
    }

    /// `xid:id`, as the health shows it.
    pub(super) fn shown(&self) -> String {
        format!("{}:{}", self.xid, self.id)
    }

    /// The cursor after delivering row `(xid, id)`; the take-over ends once
    /// the rows come from transactions that began after it.
    pub(super) fn past(self, xid: u64, id: i64) -> Cursor {
        Cursor {
            xid,
            id,
            legacy: self.legacy.filter(|l| xid < l.until_xid),
            read: self.read.map(|r| r.max(id)),
            upto: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_old_ones_are_recognised() {
        let c = Cursor {
            xid: 812,
            id: 41,
            legacy: None,
            read: None,
            upto: None,
        };
        assert_eq!(c.encode(), "812:41");
        assert_eq!(Cursor::parse("812:41"), Some(Stored::Current(c)));
        let with_read = Cursor {
            read: Some(57),
            ..c
        };
        assert_eq!(with_read.encode(), "812:41:57");
        assert_eq!(Cursor::parse("812:41:57"), Some(Stored::Current(with_read)));
        assert_eq!(with_read.past(813, 44).read, Some(57));
        assert_eq!(with_read.past(813, 60).read, Some(60));
        let taking_over = Cursor {
            legacy: Some(Legacy {
                after_id: 40,
                until_xid: 900,
            }),
            ..c
        };
        assert_eq!(taking_over.encode(), "812:41:40:900");
        assert_eq!(taking_over.shown(), "812:41");
        assert_eq!(
            Cursor::parse(&taking_over.encode()),
            Some(Stored::Current(taking_over))
        );
        assert_eq!(Cursor::parse("41"), Some(Stored::BareId(41)));
        for junk in ["", "moved to outbox:1/db/t", "1:2:x", "a:b", "1:2:3:4:5:6"] {
            assert_eq!(Cursor::parse(junk), None, "{junk}");
        }
    }

    #[test]
    fn a_take_over_ends_with_the_first_newer_transaction() {
        let c = Cursor {
            legacy: Some(Legacy {
                after_id: 40,
                until_xid: 900,
            }),
            ..Cursor::START
        };
        let older = c.past(899, 41);
        assert_eq!(older.legacy, c.legacy);
        let newer = older.past(900, 42);
        assert_eq!((newer.xid, newer.id, newer.legacy), (900, 42, None));
    }

    #[test]
    fn a_held_back_cursor_keeps_the_last_row_read() {
        let c = Cursor {
            xid: 900,
            id: 6,
            legacy: None,
            read: Some(9),
            upto: Some((905, 9)),
        };
        assert_eq!(c.encode(), "900:6:9/905:9");
        assert_eq!(Cursor::parse("900:6:9/905:9"), Some(Stored::Current(c)));
        assert_eq!(c.last_read(), (905, 9));
        assert_eq!(c.past(906, 10).upto, None, "a row delivered moves past it");
        assert_eq!(Cursor::parse("900:6:9/905"), None);
    }
}
