//! Integration tests: one binary, real sockets, a real registry.

mod bad_input;
mod browser;
mod cli;
mod cli_admin;
mod cluster;
mod conformance;
mod dashboard;
mod frontdoor;
mod helpers;
mod kafka;
mod lifecycle;
mod limits;
mod openapi;
mod operator;
mod origins;
mod outbox;
mod plugins;
mod plugins_hostile;
mod plugins_lanes;
mod plugins_output;
mod positions;
mod protections;
mod pubsub;
mod readme;
mod slow;
