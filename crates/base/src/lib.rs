//! Herald's base layer (L0 of ARCHITECTURE.md, "Layers"): the wall clock,
//! secrets and digests, token buckets and the metric names. Nothing here
//! knows a tenant, a socket or a plugin; every other crate may use it.

pub mod clock;
pub mod metrics;
pub mod ratelimit;
pub mod secret;
