//! Integration tests: one binary, real sockets, a real registry.

mod bad_input;
mod helpers;
mod lifecycle;
mod limits;
mod pubsub;
mod slow;
